"""Server-side history at scale: a user with 10,000 turns still lists in < 200 ms.

    python -m tools.bench.bench_conversations [--turns 10000] [--per-conv 5] [--others 4] [--repeat 20]

Fills a fresh SQLite database through the real store (store.conversations, one transaction per turn like the
app) with `--turns` turns of one user — realistic turn payloads (the sources and trace JSON of a real answer,
~6 KB) — spread over conversations of `--per-conv` turns, plus as many turns of `--others` other users. Then
times, best and median of `--repeat` runs:

  list     ConversationService.list (the 历史 panel / GET /api/conversations, page 1 of 50)
  history  the last turns of a conversation (what the rewrite and the prompt read on every follow-up)
  open     ConversationService.get of one conversation with all its turns (a replay)

and the same list query with the (user, updated_at) index dropped ("old": what it costs without it).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.eval.cli import command_parser

GOAL_MS = 200.0


def realistic_turn(i: int) -> dict:
    text = "星河电子公司的客服电话是 400-800-1234，服务时间为每天 9 点到 21 点。" * 4
    sources = [{"no": n, "chunk_id": 1000 + n, "doc_id": 7, "doc_name": "星河电子客服手册.txt", "page": None,
                "source": "text", "text": text, "similarity": 0.91, "rerank_score": None, "cited": n == 1,
                "verified": False} for n in range(1, 7)]
    row = {"chunk_id": 1, "doc_name": "星河电子客服手册.txt", "page": None, "text": text[:120]}
    trace = {"bm25": [row | {"rank": r, "score": 3.2} for r in range(1, 11)],
             "vector": [row | {"rank": r, "similarity": 0.9} for r in range(1, 11)],
             "fused": [row | {"rank": r, "rrf_score": 0.03, "bm25_rank": r, "vector_rank": r} for r in range(1, 11)],
             "rerank": [row | {"no": r, "rerank_score": None, "rrf_score": 0.03, "similarity": 0.9}
                        for r in range(1, 7)],
             "rerank_status": {"status": "skipped", "msg": "未配置精排模型，已跳过"}, "fusion": {"bm25_weight": 1.0},
             "gate": {"hit": True, "max_similarity": 0.93, "min_similarity": 0.88},
             "ms": {"embed": 6.1, "bm25": 1.2, "vector": 8.0, "rrf": 0.2, "rerank": 0.0, "total": 16.0}}
    return {"question": f"第 {i} 个问题：星河电子的客服电话是多少？", "answer": "客服电话是 400-800-1234[1]。" * 3,
            "sources": sources, "trace": trace}


def fill(service, user: str, turns: int, per_conv: int, payload: bool) -> list[str]:
    convs, conv = [], None
    for i in range(turns):
        t = realistic_turn(i) if payload else {"question": f"q{i}", "answer": "a", "sources": [], "trace": {}}
        if i % per_conv == 0:
            conv = None
        saved = service.record(conv, user, t["question"], t["answer"], sources=t["sources"], trace=t["trace"],
                               route="LIGHT", mode="extractive", elapsed_ms=120)
        if conv is None:
            conv = saved["conversation_id"]
            convs.append(conv)
    return convs


def timed(fn, repeat: int) -> tuple[float, float]:
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    return min(ms), statistics.median(ms)


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_conversations", __doc__)
    ap.add_argument("--turns", type=int, default=10_000)
    ap.add_argument("--per-conv", type=int, default=5)
    ap.add_argument("--others", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)

    # after the arguments: the stores load the database stack, --help should not wait for it
    from sqlalchemy import text

    from pipeline.conversation.service import ConversationService
    from store.conversations import ConversationStore
    from store.db import Database

    with tempfile.TemporaryDirectory(prefix="kbqa-bench-conv-") as tmp:
        db = Database(Path(tmp) / "app.db")
        service = ConversationService(ConversationStore(db))
        t0 = time.perf_counter()
        convs = fill(service, "alice", args.turns, args.per_conv, payload=True)
        for k in range(args.others):
            fill(service, f"user{k}", args.turns, args.per_conv, payload=False)
        fill_s = time.perf_counter() - t0
        one_long = fill(service, "bob", args.turns, args.turns, payload=True)[0]  # one 10,000-turn conversation
        size_mb = (Path(tmp) / "app.db").stat().st_size / 2 ** 20
        print(f"filled {args.turns} turns of alice in {len(convs)} conversations + {args.others}×{args.turns} of "
              f"others + bob's one {args.turns}-turn conversation in {fill_s:.1f} s (+bob); db {size_mb:.0f} MB")

        def show(name: str, fn) -> float:
            best, med = timed(fn, args.repeat)
            print(f"  {name:<44} best {best:7.2f} ms   median {med:7.2f} ms")
            return med

        print("new (indexed):")
        med_list = show("list alice (page 1 of 50)", lambda: service.list("alice", 1, 50))
        show("list bob (one conversation)", lambda: service.list("bob", 1, 50))
        show("history: last 3 turns of bob's conversation", lambda: service.history(one_long))
        show(f"open one conversation ({args.per_conv} turns, full replay)", lambda: service.get(convs[-1], "alice"))
        med_http_like = show("list + JSON encode (the API response body)",
                             lambda: json.dumps(service.list("alice", 1, 50), ensure_ascii=False))
        with db.transaction() as conn:
            conn.execute(text("DROP INDEX idx_conv_user_updated"))
        print("old (no (user, updated_at) index):")
        show("list alice (page 1 of 50)", lambda: service.list("alice", 1, 50))
        db.close()
    ok = med_list < GOAL_MS and med_http_like < GOAL_MS
    print(f"goal: list < {GOAL_MS:.0f} ms with {args.turns} turns → {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
