"""Latency the LLM multi-query adds to a question, against the scripted OpenAI-compatible server, old and new in
one run.

    python -m tools.bench.bench_multi_query [--docs 6] [--questions 40] [--refused 10] [--rounds 2] [--llm-ms 0]

A fresh engine (the configured embedding model) on a temp dir holds the regulations the first `--docs` distinct
files of tests/data/regulations_dev name; its answerable questions, and up to `--refused` questions the gate should
refuse (a few off-topic ones, then the dev set's unanswerable ones on those regulations' subjects), are asked
through `Engine.ask` with the scripted LLM of the tests (tests/fake_llm.py) configured, alternately with
`llm_multi_query` off (old) and on (new). Per question: retrieval = from the call to the `trace` event, total = to
`done`; the LLM calls the question made.

The multi-query runs after the no-answer gate (pipeline/services/answering.py AnswerService._recall): with it on, a
question the gate lets through pays for its first retrieval and gate, the multi-query call and a second retrieval
with the reformulations (their embeddings, route searches and completions; the question's embedding is reused) —
exactly one LLM call more; a question the gate refuses pays nothing and makes no LLM call at all (old and new: 0).
The rows are split by the gate's outcome (the question's own, the same old and new). The scripted server answers
the multi-query call at once (or after `--llm-ms`): the rows show what the app adds around the call and the call's
own wall time over local HTTP; a real model adds its own response time on top (about one short completion).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline import events as ev
from pipeline.conversation.multi_query import EXPAND_SYSTEM
from tools.eval.cli import command_parser

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "tests" / "data" / "regulations_dev" / "questions.json"
REGULATIONS = Path("/work/shared/data/regulations")
# Out of any regulation's subject: questions the gate should refuse outright (the dev set's unanswerable questions
# are on the regulations' own subjects, and the gate often lets them through as weak evidence)
OFF_TOPIC = ["2022年世界杯足球赛的冠军是哪个国家？", "红烧肉怎么做才不腻？", "明天北京会下雨吗？",
             "推荐几部好看的科幻电影", "Python 的列表推导式怎么写？"]


def scripted_server(llm_ms: float):
    # the scripted server is the tests' own (tests/fake_llm.py)
    import jieba

    from tests.fake_llm import FakeLLMServer

    server = FakeLLMServer().start()

    def respond(body: dict) -> str:
        if body["messages"][0]["content"] != EXPAND_SYSTEM:
            return "依据资料，答案见第一份资料[1]。"
        time.sleep(llm_ms / 1000)
        q = body["messages"][-1]["content"].split("<question>\n", 1)[-1].split("\n</question>", 1)[0]
        words = [w for w in jieba.lcut(q) if len(w) >= 2][:4]
        return json.dumps({"queries": [f"关于{q}的规定", f"{q}的法律依据"], "keywords": words}, ensure_ascii=False)

    server.responder = respond
    return server


def ask_once(engine, question: str) -> tuple[float, float, float | None, bool]:
    """(ms to the trace, ms to done, the multi-query call's ms or None, whether the gate let the question through)"""
    t0 = time.perf_counter()
    retrieval, call, hit = None, None, False
    for e in engine.ask(question):
        if e.type is ev.EventType.TRACE and retrieval is None:
            retrieval = (time.perf_counter() - t0) * 1000
            call = ((e.data.get("query") or {}).get("expansion") or {}).get("ms")
            hit = bool((e.data.get("gate") or {}).get("hit"))
        elif e.type is ev.EventType.ERROR:
            raise RuntimeError(e.data)
    return retrieval or 0.0, (time.perf_counter() - t0) * 1000, call, hit


def _p(xs: list[float]) -> str:
    return f"{np.percentile(xs, 50):8.1f} {np.percentile(xs, 95):8.1f}" if xs else f"{'–':>8} {'–':>8}"


def pick_questions(docs: int, answerable: int, refused: int) -> tuple[list[str], list[str]]:
    """The regulations' file names and the questions asked: the answerable ones on them, then up to `refused`
    the gate should refuse — OFF_TOPIC, then the dev set's unanswerable ones on their subjects (what counts is the
    outcome the gate really gave)."""
    data = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    files = list(dict.fromkeys(it["file"] for it in data["answerable"]))[:docs]
    asked = [it["question"] for it in data["answerable"] if it["file"] in files][:answerable]
    asked += [*OFF_TOPIC, *(it["question"] for it in data["unanswerable"] if it.get("domain_of") in files)][:refused]
    return files, asked


def measure(engine, server, questions: list[str], rounds: int) -> list[dict]:
    """One row per question and round: old and new asked back to back (which first alternates), each with its
    retrieval / total ms and LLM calls, new with the multi-query call's ms; `hit` the gate's outcome (old's)."""
    rows = []
    for r in range(rounds):
        for i, q in enumerate(questions):
            row: dict = {}
            for mode in (("old", "new") if (i + r) % 2 == 0 else ("new", "old")):
                engine.update_settings({"llm": {"llm_multi_query": mode == "new"}})
                server.reset()
                ret, total, call, hit = ask_once(engine, q)
                row[mode] = {"retrieval": ret, "total": total, "calls": len(server.chat_requests), "call_ms": call}
                if mode == "old":
                    row["hit"] = hit
            rows.append(row)
    return rows


def report(rows: list[dict], label: str) -> set[int]:
    """The rows of one gate outcome: old and new latency, the paired difference, the LLM calls added."""
    if not rows:
        print(f"\n{label}: none")
        return set()
    print(f"\n{label}: {len(rows)} asks")
    print(f"{'':28}{'p50 ms':>8} {'p95 ms':>8}   LLM calls per question")
    for mode, name in (("old", "multi-query off (old)"), ("new", "multi-query on (new)")):
        calls = sorted({x[mode]["calls"] for x in rows})
        print(f"retrieval {name:18}{_p([x[mode]['retrieval'] for x in rows])}   {calls}")
        print(f"total     {name:18}{_p([x[mode]['total'] for x in rows])}")
    added = [x["new"]["retrieval"] - x["old"]["retrieval"] for x in rows]
    print(f"added to retrieval (new − old, paired) p50 {np.percentile(added, 50):.1f} ms, "
          f"p95 {np.percentile(added, 95):.1f} ms")
    call_ms = [x["new"]["call_ms"] for x in rows if x["new"]["call_ms"] is not None]
    print(f"of which the multi-query LLM call (scripted, local HTTP) {_p(call_ms)}")
    extra = {x["new"]["calls"] - x["old"]["calls"] for x in rows}
    print(f"LLM calls added per question: {sorted(extra)}")
    return extra


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_multi_query", __doc__)
    ap.add_argument("--docs", type=int, default=6, help="distinct regulation files ingested")
    ap.add_argument("--questions", type=int, default=40, help="answerable questions on them, at most")
    ap.add_argument("--refused", type=int, default=10,
                    help="questions the gate should refuse, at most (off-topic, then unanswerable on their subjects)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llm-ms", type=float, default=0.0, help="the scripted multi-query call's own delay")
    args = ap.parse_args(argv)

    from pipeline.engine import Engine

    files, questions = pick_questions(args.docs, args.questions, args.refused)
    server = scripted_server(args.llm_ms)
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Path(tmp) / "data")
        try:
            res = engine.upload([(f, REGULATIONS / f) for f in files])
            assert all(r.ok for r in res), res
            t0 = time.perf_counter()
            assert engine.wait_idle(1800), "ingest did not finish"
            print(f"embedding model {engine.components.models.embedding.model_id}; "
                  f"{len(files)} regulations, {engine.health()['chunks']} chunks, ingest {time.perf_counter() - t0:.0f} s;"
                  f" {len(questions)} questions × {args.rounds} rounds; scripted multi-query delay {args.llm_ms:g} ms")
            engine.update_settings({"llm": {"llm_api_url": server.base_url, "llm_model": "fake-model"}})
            engine.reload()
            while engine.state != "ready":
                time.sleep(0.1)
            ask_once(engine, questions[0])  # warm both paths
            rows = measure(engine, server, questions, args.rounds)
        finally:
            engine.close()
            server.stop()
    through = report([x for x in rows if x["hit"]], "let through by the gate (answer / weak)")
    refused = report([x for x in rows if not x["hit"]], "refused by the gate (no LLM call, old or new)")
    # the contract: one call more for a question the gate lets through, none for one it refuses
    return 0 if through <= {1} and refused <= {0} and (through or refused) else 1


if __name__ == "__main__":
    sys.exit(main())
