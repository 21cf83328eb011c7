"""Vector route growth: where its time goes, old vs new in the same run (issue #29 item 1).

    python -m tools.bench.bench_vector_route --sizes 20000,80000 [--base 300] [--queries 100] [--keep DIR]

For each size a data dir is built the way tools.bench.bench_retrieval builds it (`--base` real chunks embedded
by the engine's model, replicated with a marker word and a small vector perturbation; SQLite rows and Chroma
vectors are real), grown in place from the previous size. The vector route is then timed question by question,
alternating the route as shipped before the fix (tools.bench.vector_route_old) and today's
ReadyVectorRetriever, with the pieces of the old one timed separately: the counts in SQL, Chroma's count, the
Chroma query through LlamaIndex and with ids + distances only, the chunk lookup. Every size is open at once and
each question goes to every size in turn, so a busy machine slows every size alike (the growth ratio is what
the issue asks about). `--keep DIR` keeps the built data dirs (DIR/<size>/data) and reuses them on the next run.
"""
from __future__ import annotations

import argparse
import json
import os
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


class _Routes:
    """The old and the new vector route over one built data dir, and the pieces the old one is made of."""

    def __init__(self, engine, recall: int):
        from pipeline.retrieval.vector import ReadyVectorRetriever
        from tools.bench.vector_route_old import OldReadyVectorRetriever

        self.c = c = engine.components
        svc = c.retrieval
        self.kb = kb = c.kbs.default
        self.recall = recall
        self.old = OldReadyVectorRetriever(lambda: svc._vector_index(kb), c.docs.get_chunks, recall,
                                           extra_fetch=lambda: c.docs.pending_chunk_count(kb.kb_id),
                                           ready_count=lambda: c.docs.ready_chunk_count(kb.kb_id))
        self.new = svc.stages(engine.settings).fusion.vector_retriever  # what the app's fusion calls
        assert isinstance(self.new, ReadyVectorRetriever), type(self.new)
        self.index = svc._vector_index(kb)
        self.got: dict[str, list[float]] = {"old": [], "new": []}
        self.pieces: dict[str, list[float]] = {k: [] for k in ("sql_counts", "chroma_count", "chroma_llamaindex",
                                                               "chroma_raw", "lookup")}
        self.same = 0

    def once(self, b) -> None:
        t0 = time.perf_counter()
        a = self.old.retrieve(b)
        t1 = time.perf_counter()
        n = self.new.retrieve(b)
        t2 = time.perf_counter()
        self.got["old"].append((t1 - t0) * 1000)
        self.got["new"].append((t2 - t1) * 1000)
        self.same += [x.node.node_id for x in a] == [x.node.node_id for x in n] and all(
            abs(x.score - y.score) < 1e-4 for x, y in zip(a, n))

    def pieces_once(self, b) -> None:
        c, kb, col = self.c, self.kb, self.kb.vectors.collection
        t0 = time.perf_counter()
        c.docs.pending_chunk_count(kb.kb_id), c.docs.ready_chunk_count(kb.kb_id)
        t1 = time.perf_counter()
        col.count()
        t2 = time.perf_counter()
        hits = self.index.as_retriever(similarity_top_k=2 * self.recall).retrieve(b)
        t3 = time.perf_counter()
        col.query(query_embeddings=[b.embedding], n_results=2 * self.recall, include=["distances"])
        t4 = time.perf_counter()
        c.docs.get_chunks([int(h.node.node_id) for h in hits])
        t5 = time.perf_counter()
        for k, dt in zip(self.pieces, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            self.pieces[k].append(dt * 1000)

    def report(self) -> dict:
        out = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in self.got.items()}
        out["pieces"] = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in self.pieces.items()}
        out["same_results"] = f"{self.same}/{len(self.got['old'])}"
        return out


def _measure(engines: dict, qs: list[str]) -> dict:
    """Every size open at once and asked the same question in turn, so machine load hits every size alike."""
    from llama_index.core.schema import QueryBundle

    first = next(iter(engines.values()))
    emb = first.components.models.embedding.embed_model
    bundles = [QueryBundle(query_str=q, embedding=emb.get_query_embedding(q)) for q in qs]
    routes = {n: _Routes(e, e.settings.recall_size) for n, e in engines.items()}
    for r in routes.values():  # warm-up (Chroma loads its HNSW index on the first query)
        for b in bundles[:3]:
            r.old.retrieve(b), r.new.retrieve(b)
    for b in bundles:
        for r in routes.values():
            r.once(b)
    for b in bundles:
        for r in routes.values():
            r.pieces_once(b)
    return {n: r.report() for n, r in routes.items()}


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
    engines: dict = {}
    try:
        for n in sizes:  # build: one data dir per size, each grown from a copy of the previous one
            data = root / str(n) / "data"
            prev_data, prev = prev, data
            built = root / str(n) / "built"
            if built.exists():
                continue
            if not data.exists() and prev_data is not None:
                shutil.copytree(prev_data, data)
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
                report["sizes"][n] = {"insert_s": _grow(engine, base, base_emb, base_tok, n)}
            finally:
                engine.close()
            built.write_text(str(n))
        for n in sizes:
            engines[n] = Engine(root / str(n) / "data")
        load0 = os.getloadavg()[0]
        for n, r in _measure(engines, qs).items():
            report["sizes"][n] = report["sizes"].get(n, {}) | r
            print(f"{n} chunks: old {r['old']} new {r['new']} same {r['same_results']} pieces {r['pieces']}",
                  flush=True)
        report["load_avg"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
    finally:
        for e in engines.values():
            e.close()
        if tmp is not None:
            tmp.cleanup()
    print(f"\nVector route, {args.queries} CMRC questions, every size open at once and asked in turn "
          f"(load average {report['load_avg'][0]} → {report['load_avg'][1]})")
    print("Pieces: p50 ms of each step on its own, same questions (old route = SQL counts + Chroma count + "
          "Chroma via LlamaIndex + lookup; new route = Chroma ids/distances + lookup)")
    print("| chunks | old p50 / p95 ms | new p50 / p95 ms | same top-k | SQL counts | Chroma count | Chroma via "
          "LlamaIndex | Chroma ids+distances | chunk lookup |\n|---|---|---|---|---|---|---|---|---|")
    for n, r in report["sizes"].items():
        p = r["pieces"]
        print(f"| {n} | {r['old']['p50']} / {r['old']['p95']} | {r['new']['p50']} / {r['new']['p95']} | "
              f"{r['same_results']} | {p['sql_counts']['p50']} | {p['chroma_count']['p50']} | "
              f"{p['chroma_llamaindex']['p50']} | "
              f"{p['chroma_raw']['p50']} | {p['lookup']['p50']} |")
    first = report["sizes"][sizes[0]]
    for n in sizes[1:]:
        r = report["sizes"][n]
        print(f"- {n} vs {sizes[0]} chunks ({n / sizes[0]:g}× the chunks): old p50 "
              f"{r['old']['p50'] / first['old']['p50']:.2f}×, new p50 {r['new']['p50'] / first['new']['p50']:.2f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
