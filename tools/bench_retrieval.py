"""Retrieval benchmark at scale (default 50,000 chunks) on this machine.

    python -m tools.bench_retrieval [--chunks 50000] [--base 1000] [--queries 200] [--reranker DIR]
                                    [--chroma-url http://127.0.0.1:8000 [--database-url postgresql://…]]

Embedding 50k chunks would take over an hour on 2 cores, so the corpus is built from `--base` real chunks
(CMRC 2018 contexts + CRUD-RAG news, chunked by our chunker, embedded by the engine's model) and replicated
to `--chunks` with a per-copy marker word in the text/tokens and a small random perturbation of the vector
(re-normalised). SQLite rows, stored tokens and Chroma vectors are real; queries are real CMRC questions.

Prints: BM25 rebuild from stored tokens vs re-tokenizing the corpus with jieba, query latency p50/p95 per
stage (embed, bm25, vector, rrf, rerank), and peak RSS. With `--chroma-url` the same chunks, vectors and
questions also go into a second engine on that Chroma server (and on `--database-url`'s PostgreSQL when given,
else SQLite) and both configurations are measured in the same run, alternating question by question.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _texts(n: int, chunk_size: int = 300, overlap: int = 50) -> list[str]:
    from pipeline.ingestion.chunking import split_text

    out: list[str] = []
    cm = json.loads((DATA / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    sources = [p["context"] for a in cm["data"] for p in a["paragraphs"]]
    news = DATA / "crud_rag_news" / "documents_dup_part_1_part_1"
    if news.exists():
        sources += [line.strip() for line in news.open(encoding="utf-8") if line.strip()]
    for t in sources:
        out.extend(t[s:e] for s, e in split_text(t, chunk_size, overlap))
        if len(out) >= n:
            break
    return out[:n]


def _questions(n: int) -> list[str]:
    cm = json.loads((DATA / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    qs = [qa["question"] for a in cm["data"] for p in a["paragraphs"] for qa in p["qas"]]
    return qs[:: max(1, len(qs) // n)][:n]


def pct(xs, p):
    return round(float(np.percentile(xs, p)), 1) if xs else None


def _replicas(base, base_emb, base_tok, n: int, rng):
    """(tokens, vector, text, marker index) of n chunks built from the base chunks (see module docstring)."""
    dim = base_emb.shape[1]
    for k in range(n):
        b = k % len(base)
        marker = f"副本{k}"
        v = base_emb[b] + rng.normal(0, 0.02, dim).astype(np.float32)
        yield base_tok[b] + [marker], v / np.linalg.norm(v), f"{base[b]}（{marker}）", k


def _fill(engine, corpus, n: int, per_doc: int = 500) -> float:
    """Insert the corpus as 就绪 documents of `per_doc` chunks (SQL rows, stored tokens, vectors); seconds."""
    from store.documents import ChunkRow

    c = engine.components
    c.vectors.claim_model(c.models.embedding.model_id, c.models.embedding.dim)
    t0 = time.perf_counter()
    for d, start in enumerate(range(0, n, per_doc)):
        part = corpus[start:start + per_doc]
        doc = c.docs.create(f"bench-{d}.txt", "txt", 0, f"{d:032x}", f"{d:032x}.txt")
        rows = [ChunkRow(doc["doc_id"], j, text, None, 0, len(text), "text", toks)
                for j, (toks, _, text, _) in enumerate(part)]
        ids = c.docs.replace_chunks(doc["doc_id"], rows)
        c.vectors.add(ids, [v for _, v, _, _ in part], [t for _, _, t, _ in part], doc["doc_id"], doc["file_name"])
        c.docs.mark_ready(doc["doc_id"], len(rows))
        print(f"\r  inserted {start + len(part)}/{n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return round(time.perf_counter() - t0, 1)


def _compare_server(embedded, corpus, args, tmp: Path, qs: list[str]) -> dict:
    """The same corpus in an engine on the Chroma server (+ PostgreSQL); both measured question by question."""
    from pipeline.deployment import Deployment
    from pipeline.engine import Engine

    dep = Deployment(database_url=args.database_url, chroma_url=args.chroma_url, files_dir=tmp / "server-files")
    server = Engine(tmp / "server-data", deployment=dep)
    try:
        if args.reranker:
            server.update_settings({"reranker_model_path": args.reranker})
            server.reload()
        if server.components.vectors.count() or server.components.docs.counts()["docs"]:
            raise SystemExit("the server databases must start empty (use a fresh Chroma database path / PG db)")
        insert_s = _fill(server, corpus, args.chunks)
        s = server.settings
        server.components.bm25.rebuild(s.bm25_k1, s.bm25_b, persist=False)
        keys = ("vector", "bm25", "retrieval_no_rerank")
        got: dict[str, dict[str, list[float]]] = {"embedded": {k: [] for k in keys}, "server": {k: [] for k in keys}}
        for eng in (embedded, server):
            eng.components.retrieval.retrieve(qs[0], eng.settings)  # warm-up
        for q in qs:  # alternate, so background load hits both configurations alike
            for name, eng in (("embedded", embedded), ("server", server)):
                r = eng.components.retrieval.retrieve(q, eng.settings)
                got[name]["vector"].append(r.ms["vector"])
                got[name]["bm25"].append(r.ms["bm25"])
                got[name]["retrieval_no_rerank"].append(r.ms["embed"] + r.ms["bm25"] + r.ms["vector"] + r.ms["rrf"])
        label = f"Chroma server{' + PostgreSQL' if args.database_url else ' + SQLite'}"
        return {"label": label, "insert_s": insert_s,
                **{n: {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in d.items()} for n, d in got.items()}}
    finally:
        server.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_retrieval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=50000)
    ap.add_argument("--base", type=int, default=1000, help="real chunks embedded by the model")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--reranker", default=None, help="cross-encoder directory (rerank stage timing)")
    ap.add_argument("--chroma-url", default=None, help="also measure on this Chroma server (http://host:port/db)")
    ap.add_argument("--database-url", default=None, help="with --chroma-url: metadata on this PostgreSQL")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from pipeline.engine import Engine

    report: dict = {"chunks": args.chunks, "base_chunks": args.base}
    with tempfile.TemporaryDirectory(prefix="kbqa-bench-") as tmp:
        engine = Engine(Path(tmp) / "data")
        if args.reranker:
            engine.update_settings({"reranker_model_path": args.reranker})
            engine.reload()
        base = _texts(args.base)
        t0 = time.perf_counter()
        base_emb = np.asarray(engine.components.models.embedding.embed_model.get_text_embedding_batch(base), dtype=np.float32)
        report["embed_base_s"] = round(time.perf_counter() - t0, 1)
        base_tok = [engine.components.tokenizer(t) for t in base]
        rng = np.random.default_rng(7)

        corpus = list(_replicas(base, base_emb, base_tok, args.chunks, rng))
        all_texts = [text for _, _, text, _ in corpus]
        report["insert_s"] = _fill(engine, corpus, args.chunks)

        s = engine.settings
        t0 = time.perf_counter()
        engine.components.bm25.rebuild(s.bm25_k1, s.bm25_b, persist=False)
        report["bm25_rebuild_from_tokens_s"] = round(time.perf_counter() - t0, 2)

        stages: dict[str, list[float]] = {k: [] for k in ("embed", "bm25", "vector", "rrf", "rerank",
                                                          "retrieval_no_rerank", "total")}
        qs = _questions(args.queries)
        engine.components.retrieval.retrieve(qs[0], s)  # warm-up
        for q in qs:
            r = engine.components.retrieval.retrieve(q, s)
            for k in ("embed", "bm25", "vector", "rrf", "rerank", "total"):
                stages[k].append(r.ms.get(k, 0.0))
            stages["retrieval_no_rerank"].append(r.ms["embed"] + r.ms["bm25"] + r.ms["vector"] + r.ms["rrf"])
        # Peak RSS of the serving state (models + 50k-chunk indexes + queries), measured before the
        # re-tokenization comparison below, whose 50k token lists belong to the benchmark, not the app.
        report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

        t0 = time.perf_counter()
        retok = [engine.components.tokenizer(t) for t in all_texts]
        report["jieba_retokenize_s"] = round(time.perf_counter() - t0, 2)
        report["rebuild_speedup_vs_retokenize"] = round(
            (report["jieba_retokenize_s"] + report["bm25_rebuild_from_tokens_s"])
            / max(report["bm25_rebuild_from_tokens_s"], 1e-9), 1)
        del retok
        report["latency_ms"] = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in stages.items()}
        report["rerank"] = engine.components.retrieval.rerank_label or "未配置精排模型（阶段跳过）"
        if args.chroma_url:
            report["server"] = _compare_server(engine, corpus, args, Path(tmp), qs)
        engine.close()

    print(f"\nRetrieval benchmark: {args.chunks} chunks ({args.base} embedded for real), "
          f"{args.queries} CMRC questions, 2 cores")
    print(f"- BM25 rebuild from stored tokens: {report['bm25_rebuild_from_tokens_s']} s "
          f"(re-tokenizing with jieba instead: +{report['jieba_retokenize_s']} s → "
          f"{report['rebuild_speedup_vs_retokenize']}× slower)")
    print("| stage | p50 ms | p95 ms |\n|---|---|---|")
    for k, v in report["latency_ms"].items():
        print(f"| {k} | {v['p50']} | {v['p95']} |")
    print(f"- rerank: {report['rerank']}")
    print(f"- peak RSS (serving state: models + indexes + queries): {report['peak_rss_mb']} MB")
    print(f"- Chroma insert of {args.chunks} vectors: {report['insert_s']} s")
    if "server" in report:
        srv = report["server"]
        print(f"\nSame run, same {args.chunks} chunks and questions, alternating: embedded vs {srv['label']}")
        print("| route | embedded p50 ms | server p50 ms | embedded p95 ms | server p95 ms |\n|---|---|---|---|---|")
        for k in ("vector", "bm25", "retrieval_no_rerank"):
            e, v = srv["embedded"][k], srv["server"][k]
            print(f"| {k} | {e['p50']} | {v['p50']} | {e['p95']} | {v['p95']} |")
        print(f"- insert of {args.chunks} chunks into the server configuration: {srv['insert_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
