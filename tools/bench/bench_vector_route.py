"""Vector route growth: where its time goes, old vs new in the same run (issue #29 item 1).

    python -m tools.bench.bench_vector_route --sizes 20000,80000 [--base 300] [--queries 100] [--keep DIR]

For each size a data dir is built the way tools.bench.bench_retrieval builds it (`--base` real chunks embedded
by the engine's model, replicated with a marker word and a small vector perturbation; SQLite rows and Chroma
vectors are real), grown in place from the previous size. The vector route is then timed question by question,
alternating the route as shipped before the fix (tools.bench.vector_route_old) and today's
ReadyVectorRetriever, with the pieces of each timed separately: counts in SQL, the Chroma query, the chunk
lookup. `--keep DIR` keeps the built data dirs (DIR/<size>) and reuses them on the next run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from tools.bench.bench_retrieval import _fill, _questions, _replicas, _texts, pct


def _grow(engine, base, base_emb, base_tok, target: int) -> float:
    """Add chunks until the data dir holds `target`; seconds spent inserting."""
    have = engine.components.docs.counts()["chunks"]
    if have >= target:
        return 0.0
    rng = np.random.default_rng(7 + have)
    corpus = []
    for tok, v, text in _replicas(base, base_emb, base_tok, target - have, rng):
        corpus.append((tok, v, text))  # markers restart per step: only the BM25 side reads them
    return _fill(engine, corpus, first_doc=have // 500)


def _time_routes(engine, qs: list[str], recall: int) -> dict:
    from llama_index.core.schema import QueryBundle

    from pipeline.retrieval.vector import ReadyVectorRetriever
    from tools.bench.vector_route_old import OldReadyVectorRetriever

    c = engine.components
    svc = c.retrieval
    kb = c.kbs.default
    emb = c.models.embedding.embed_model
    old = OldReadyVectorRetriever(lambda: svc._vector_index(kb), c.docs.get_chunks, recall,
                                  extra_fetch=lambda: c.docs.pending_chunk_count(kb.kb_id),
                                  ready_count=lambda: c.docs.ready_chunk_count(kb.kb_id))
    new = svc.stages(engine.settings).fusion.vector_retriever
    assert isinstance(new, ReadyVectorRetriever) or hasattr(new, "_retrievers"), type(new)
    bundles = [QueryBundle(query_str=q, embedding=emb.get_query_embedding(q)) for q in qs]
    for b in bundles[:3]:  # warm-up (Chroma loads its HNSW index on the first query)
        old.retrieve(b), new.retrieve(b)
    got: dict[str, list[float]] = {"old": [], "new": []}
    same = 0
    for b in bundles:
        t0 = time.perf_counter()
        a = old.retrieve(b)
        t1 = time.perf_counter()
        n = new.retrieve(b)
        t2 = time.perf_counter()
        got["old"].append((t1 - t0) * 1000)
        got["new"].append((t2 - t1) * 1000)
        same += [x.node.node_id for x in a] == [x.node.node_id for x in n] and all(
            abs(x.score - y.score) < 1e-4 for x, y in zip(a, n))
    # the pieces, each on its own (same questions)
    pieces: dict[str, list[float]] = {"sql_counts": [], "chroma_count": [], "chroma_llamaindex": [], "chroma_raw": [],
                                      "lookup": []}
    col = kb.vectors.collection
    index = svc._vector_index(kb)
    for b in bundles:
        t0 = time.perf_counter()
        c.docs.pending_chunk_count(kb.kb_id), c.docs.ready_chunk_count(kb.kb_id)
        t1 = time.perf_counter()
        col.count()
        t1b = time.perf_counter()
        hits = index.as_retriever(similarity_top_k=2 * recall).retrieve(b)
        t2 = time.perf_counter()
        col.query(query_embeddings=[b.embedding], n_results=2 * recall, include=["distances"])
        t3 = time.perf_counter()
        c.docs.get_chunks([int(h.node.node_id) for h in hits])
        t4 = time.perf_counter()
        for k, dt in zip(pieces, (t1 - t0, t1b - t1, t2 - t1b, t3 - t2, t4 - t3)):
            pieces[k].append(dt * 1000)
    out = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in got.items()}
    out["pieces"] = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in pieces.items()}
    out["same_results"] = f"{same}/{len(bundles)}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.bench_vector_route", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20000,80000")
    ap.add_argument("--base", type=int, default=300)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--keep", default=None, help="build (and reuse) the data dir here")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import tempfile

    from pipeline.engine import Engine

    sizes = sorted(int(s) for s in args.sizes.split(","))
    tmp = None
    if args.keep:
        root = Path(args.keep)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kbqa-vec-")
        root = Path(tmp.name)
    report: dict = {"sizes": {}, "base": args.base, "queries": args.queries}
    qs = _questions(args.queries)
    prev: Path | None = None
    try:
        for n in sizes:
            data = root / str(n) / "data"  # one data dir per size, each grown from a copy of the previous one
            if not data.exists() and prev is not None:
                shutil.copytree(prev, data)
            engine = Engine(data)
            try:
                base = _texts(args.base)
                cache = root / f"base-{args.base}.npy"
                if cache.exists():
                    base_emb = np.load(cache)
                else:
                    base_emb = np.asarray(engine.components.models.embedding.embed_model.get_text_embedding_batch(
                        base), dtype=np.float32)
                    np.save(cache, base_emb)
                base_tok = [engine.components.tokenizer(t) for t in base]
                insert_s = _grow(engine, base, base_emb, base_tok, n)
                r = _time_routes(engine, qs, engine.settings.recall_size)
            finally:
                engine.close()
            r["insert_s"] = insert_s
            report["sizes"][n] = r
            prev = data
            print(f"{n} chunks: old {r['old']} new {r['new']} same {r['same_results']} pieces {r['pieces']}",
                  flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print("\nPieces: p50 ms of each step on its own, same questions (old route = SQL counts + Chroma count + "
          "Chroma via LlamaIndex + lookup; new route = Chroma ids/distances + lookup)")
    print("| chunks | old p50 / p95 ms | new p50 / p95 ms | same top-k | SQL counts | Chroma count | Chroma via "
          "LlamaIndex | Chroma ids+distances | chunk lookup |\n|---|---|---|---|---|---|---|---|---|")
    for n, r in report["sizes"].items():
        p = r["pieces"]
        print(f"| {n} | {r['old']['p50']} / {r['old']['p95']} | {r['new']['p50']} / {r['new']['p95']} | "
              f"{r['same_results']} | {p['sql_counts']['p50']} | {p['chroma_count']['p50']} | "
              f"{p['chroma_llamaindex']['p50']} | "
              f"{p['chroma_raw']['p50']} | {p['lookup']['p50']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
