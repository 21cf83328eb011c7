"""What "ready means searchable" costs at scale (default: 50,000 chunks already in the main BM25 index).

    python -m tools.bench.bench_bm25_delta [--chunks 50000] [--group-docs 16] [--chunks-per-doc 10] [--queries 200]

Real chunks (CMRC 2018 contexts + CRUD-RAG news, our chunker, jieba tokens) are written to a real SQLite
(kb_document / kb_chunk rows as ingest writes them) and replicated to --chunks with a marker word per copy, as
tools/bench/bench_retrieval.py does. Then, per ingest group of --group-docs documents:

- old:   nothing per group; BM25 refreshed only when the queue drains (one full rebuild from stored tokens),
         so the group's documents read 就绪 while BM25 cannot find them.
- naive: a full rebuild per group (the obvious way to make 就绪 searchable).
- delta: `BM25Index.add_ready` per group (what the worker does now), plus the fold it triggers once the delta
         reaches its share of the main index, amortized per group; and the query-time cost of scoring the
         delta beside the main index at delta sizes up to the fold point.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.bench_retrieval import _questions, _texts, pct


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.bench_bm25_delta", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=50000)
    ap.add_argument("--base", type=int, default=3000, help="distinct real chunks (replicated to --chunks)")
    ap.add_argument("--group-docs", type=int, default=16)
    ap.add_argument("--chunks-per-doc", type=int, default=10)
    ap.add_argument("--groups", type=int, default=20, help="groups timed for add_ready")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args(argv)

    # after the arguments: bm25s, jieba and the stores load in seconds, --help should not wait for them
    from pipeline.models.tokenize_zh import ChineseTokenizer
    from pipeline.retrieval import bm25 as bm25_mod
    from pipeline.retrieval.bm25 import BM25Index
    from store.db import Database
    from store.documents import ChunkRow, DocumentStore

    tok = ChineseTokenizer()
    base = _texts(args.base)
    base_tok = [tok(t) for t in base]
    questions = _questions(args.queries)

    with tempfile.TemporaryDirectory(prefix="kbqa-delta-") as tmp:
        docs = DocumentStore(Database(Path(tmp) / "app.db"))

        def add_doc(d: int, n: int, start: int) -> list[tuple[int, list[str]]]:
            doc = docs.create(f"bench-{d}.txt", "txt", 0, f"{d:032x}", f"{d:032x}.txt")
            rows = []
            for j in range(n):
                b = (start + j) % len(base)
                marker = f"副本{start + j}"
                rows.append(ChunkRow(doc["doc_id"], j, f"{base[b]}（{marker}）", None, 0, 0, "text",
                                     base_tok[b] + [marker]))
            ids = docs.replace_chunks(doc["doc_id"], rows)
            return doc["doc_id"], list(zip(ids, [r.tokens for r in rows]))

        per_doc = 500
        made = d = 0
        while made < args.chunks:
            doc_id, _ = add_doc(d, min(per_doc, args.chunks - made), made)
            docs.mark_ready(doc_id, 0)
            made += min(per_doc, args.chunks - made)
            d += 1
        idx = BM25Index(Path(tmp) / "bm25", docs.iter_ready_tokens)
        t0 = time.perf_counter()
        idx.rebuild(1.5, 0.75, persist=False)
        full_s = time.perf_counter() - t0

        def query_ms() -> tuple[float, float]:
            r = idx.retriever(tok, docs.get_chunks, 50)
            times = []
            for q in questions:
                t = time.perf_counter()
                r.retrieve(q)
                times.append((time.perf_counter() - t) * 1000)
            return pct(times, 50), pct(times, 95)

        q_main = query_ms()

        # New groups of documents, as the worker finishes them: add_ready per group (folding disabled here so
        # the delta keeps growing and its query cost can be read at each size; the fold is timed as a rebuild).
        bm25_mod.FOLD_MIN = 10 ** 9
        group_ms = []
        delta_q: dict[int, tuple[float, float]] = {}
        fold_at = max(2000, int(bm25_mod.FOLD_SHARE * args.chunks))
        n_groups = max(args.groups, -(-fold_at // (args.group_docs * args.chunks_per_doc)))
        checkpoints = {1, n_groups // 4, n_groups // 2, n_groups}
        for g in range(n_groups):
            items = []
            for _ in range(args.group_docs):
                doc_id, its = add_doc(d, args.chunks_per_doc, made)
                made += args.chunks_per_doc
                d += 1
                items.extend(its)
                docs.mark_ready(doc_id, args.chunks_per_doc)
            t = time.perf_counter()
            idx.add_ready(items)
            group_ms.append((time.perf_counter() - t) * 1000)
            if g + 1 in checkpoints:
                delta_q[idx.delta.size] = query_ms()
        t0 = time.perf_counter()
        idx.rebuild(1.5, 0.75, persist=False)  # the fold (and the old code's rebuild at queue drain)
        fold_s = time.perf_counter() - t0
        docs.db.close()

    group_chunks = args.group_docs * args.chunks_per_doc
    groups_per_fold = fold_at / group_chunks
    amortized_ms = fold_s * 1000 / groups_per_fold
    print(f"\nBM25 'ready means searchable' at {args.chunks} chunks in the main index; groups of "
          f"{args.group_docs} documents × {args.chunks_per_doc} chunks = {group_chunks} chunks")
    print(f"- full rebuild from stored tokens (SQLite read + bm25s index): {full_s:.2f} s at {args.chunks}, "
          f"{fold_s:.2f} s at {args.chunks + n_groups * group_chunks}")
    print("| per group | worker time | 就绪 searchable by BM25 |\n|---|---|---|")
    print(f"| old: nothing until the queue drains | 0 ms (+ {fold_s:.2f} s once at the end) | no |")
    print(f"| naive: full rebuild per group | {fold_s * 1000:.0f} ms | yes |")
    print(f"| delta: add_ready | p50 {pct(group_ms, 50)} ms, p95 {pct(group_ms, 95)} ms | yes |")
    print(f"| delta: + fold every {fold_at} chunks, amortized | {amortized_ms:.0f} ms | yes |")
    print("\n| delta size (chunks) | BM25 query p50 ms | p95 ms |\n|---|---|---|")
    print(f"| 0 (main only) | {q_main[0]} | {q_main[1]} |")
    for size, (p50, p95) in sorted(delta_q.items()):
        print(f"| {size} | {p50} | {p95} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
