"""Keyword index at scale: segments (what the app runs) beside one bm25s build (what it ran before), same run.

    python -m tools.bench.bench_bm25 [--chunks 50000,200000,1000000] [--base 2000] [--queries 100]
        [--terms words,words+bigrams] [--json FILE]

The corpus is `--base` real chunks (CMRC 2018 contexts + CRUD-RAG news, our chunker and tokenizer) replicated
with a per-copy marker token, as bench_retrieval does. For each size it prints:
- full build from stored tokens: bm25s vs segments (BUILD_BATCH-chunk segments);
- restart: a fresh index opening what is on disk (bm25s load vs segment maps) and the RSS it adds;
- a change: one 500-chunk document added through `add_ready` in one index, and a second index on the same folder
  (another process) following it with `sync` — the cost each process pays, vs the full build every process paid;
- query latency p50/p95 for the same CMRC questions, and the largest score difference between the two (a full
  build's scores, so it must be ~1e-6).
Each size runs once per term scheme of `--terms`: `words` (jieba's words, what the app indexes) and `words+bigrams`
(the words and the character bigrams as terms of their own: tools/eval/keyword_terms_study.py's `both_apart`,
measured and not shipped — docs/retrieval-eval.md, "Character bigrams in the keyword route"), so their costs are
side by side; the segments' size on disk is printed too.
"""
from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import bm25s
import numpy as np

from tools.bench.bench_retrieval import _questions, _texts, pct, rss_mb
from tools.eval.cli import command_parser, write_json
from tools.eval.keyword_terms_study import apart_terms


def _corpus(base_tokens: list[list[str]], n: int) -> list[tuple[int, list[str]]]:
    return [(k + 1, base_tokens[k % len(base_tokens)] + [f"副本{k}"]) for k in range(n)]


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _disk_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1)


def one_size(n: int, base_tokens, queries, query_terms, tmp: Path) -> dict:
    """`query_terms`: a question's terms under the scheme `base_tokens` were made with."""
    from pipeline.retrieval.bm25 import BM25Index

    items = _corpus(base_tokens, n)
    ready = {c for c, _ in items}
    tokens = dict(items)

    def source(ids):
        return items if ids is None else [(c, tokens[c]) for c in sorted(ids)]

    out: dict = {"chunks": n}
    # before: one bm25s build over everything (every process, after every change once the queue drained)
    r0 = rss_mb()[0]
    bm = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    out["bm25s_build_s"] = round(_ms(lambda: bm.index([t for _, t in items], show_progress=False)) / 1000, 2)
    out["bm25s_rss_mb"] = rss_mb()[0] - r0
    bm.save(str(tmp / "bm25s"))
    del bm
    gc.collect()
    r0 = rss_mb()[0]
    t0 = time.perf_counter()
    bm = bm25s.BM25.load(str(tmp / "bm25s"))
    out["bm25s_load_s"] = round(time.perf_counter() - t0, 2)
    out["bm25s_loaded_rss_mb"] = rss_mb()[0] - r0
    # after: segments
    folder = tmp / "segments"
    a = BM25Index(folder, source)
    t0 = time.perf_counter()
    a.rebuild(1.5, 0.75)
    out["segments_build_s"] = round(time.perf_counter() - t0, 2)
    out["segments"] = len(a.view.segments)
    del a
    gc.collect()
    r0 = rss_mb()[0]
    b = BM25Index(folder, source)
    t0 = time.perf_counter()
    b.open(1.5, 0.75, ready)
    out["segments_open_s"] = round(time.perf_counter() - t0, 2)
    # query latency, both, alternating; then the largest score difference
    q_old, q_new, diff = [], [], 0.0
    for q in queries:
        toks = query_terms(q)
        t0 = time.perf_counter()
        ids = bm.get_tokens_ids(toks)
        old = bm.get_scores_from_ids(ids) if ids else np.zeros(n, dtype=np.float32)
        q_old.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        new = b.view.scores(toks)
        q_new.append((time.perf_counter() - t0) * 1000)
        diff = max(diff, float(np.max(np.abs(old - new[b.view.positions(list(range(1, n + 1)))]))))
    out["segments_rss_mb"] = rss_mb()[0] - r0  # opened, after the questions touched their postings
    out["segments_disk_mb"] = _disk_mb(folder)
    out["query_ms"] = {"bm25s": {"p50": pct(q_old, 50), "p95": pct(q_old, 95)},
                       "segments": {"p50": pct(q_new, 50), "p95": pct(q_new, 95)}}
    out["max_score_diff"] = diff
    # a change: one document of 500 chunks, written by one process, followed by another on the same folder
    doc = [(n + 1 + j, base_tokens[j % len(base_tokens)] + ["新文档标记"]) for j in range(500)]
    writer = BM25Index(folder, source)
    writer.open(1.5, 0.75, ready)
    out["add_doc_ms"] = round(_ms(lambda: writer.add_ready(doc)), 1)
    tokens.update(dict(doc))
    ready |= {c for c, _ in doc}
    out["other_process_sync_ms"] = round(_ms(lambda: b.sync(ready)), 1)
    out["found_after_sync"] = bool(b.view.scores(["新文档标记"]).max() > 0)
    writer.wait_idle(600)
    return out


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_bm25", __doc__)
    ap.add_argument("--chunks", default="50000,200000,1000000")
    ap.add_argument("--base", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--terms", default="words,words+bigrams",
                    help="term schemes to index, each a row: words, words+bigrams")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from pipeline.models.tokenize_zh import ChineseTokenizer
    tok = ChineseTokenizer()
    texts = _texts(args.base)
    schemes = {"words": ([tok(t) for t in texts], tok.tokenize),
               "words+bigrams": ([apart_terms(tok(t), t) for t in texts], lambda q: apart_terms(tok(q), q))}
    wanted = args.terms.split(",")
    if unknown := [w for w in wanted if w not in schemes]:
        ap.error(f"unknown --terms {unknown}: known {list(schemes)}")
    queries = _questions(args.queries)
    rows = []
    for n in (int(x) for x in args.chunks.split(",")):
        for name in wanted:
            base_tokens, query_terms = schemes[name]
            with tempfile.TemporaryDirectory(prefix="kbqa-bm25-") as tmp:
                rows.append({"terms": name, **one_size(n, base_tokens, queries, query_terms, Path(tmp))})
                print(json.dumps(rows[-1], ensure_ascii=False), file=sys.stderr)
            gc.collect()
    print(f"\nKeyword index, {args.base} real chunks replicated, {args.queries} CMRC questions, same run")
    print("| chunks | terms | full build s (bm25s / segments) | restart s (bm25s load / segments open) | RSS MB "
          "(bm25s loaded / segments opened) | segments on disk MB | query p50 / p95 ms (bm25s) | (segments) | add one "
          "500-chunk doc ms | another process follows ms | max score Δ |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["query_ms"]
        print(f"| {r['chunks']:,} | {r['terms']} | {r['bm25s_build_s']} / {r['segments_build_s']} ({r['segments']} seg) | "
              f"{r['bm25s_load_s']} / {r['segments_open_s']} | {r['bm25s_loaded_rss_mb']} / {r['segments_rss_mb']} | "
              f"{r['segments_disk_mb']} | "
              f"{q['bm25s']['p50']} / {q['bm25s']['p95']} | {q['segments']['p50']} / {q['segments']['p95']} | "
              f"{r['add_doc_ms']} | {r['other_process_sync_ms']} | {r['max_score_diff']:.1e} |")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
