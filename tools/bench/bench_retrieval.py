"""Retrieval benchmark at scale (default 50,000 chunks) on this machine.

    python -m tools.bench.bench_retrieval [--chunks 50000] [--base 1000] [--queries 200] [--reranker DIR]
                                          [--chroma-url http://127.0.0.1:8000/db [--database-url postgresql://…]]
                                          [--filter [--filter-share 0.1] [--per-doc 500]]

Embedding 50k chunks would take over an hour on 2 cores, so the corpus is built from `--base` real chunks
(CMRC 2018 contexts + CRUD-RAG news, chunked by our chunker, embedded by the engine's model) and replicated
to `--chunks` with a per-copy marker word in the text/tokens and a small random perturbation of the vector
(re-normalised). SQLite rows, stored tokens and Chroma vectors are real; queries are real CMRC questions.

Prints: BM25 rebuild from stored tokens vs re-tokenizing the corpus with jieba; query latency p50/p95 per
stage (embed, bm25, vector, fusion, rerank) for the convex fusion and the SRS's RRF in the same run, on the same
questions; and the serving state's RSS component by component, measured in a fresh process over the built
data dir (the build process's own peak is printed separately: it is the benchmark's, not the app's).
With `--filter` a share of the documents (`--filter-share`, every k-th one) is tagged and the same questions run
with and without the filter tags_any=[that tag], alternating question by question in the same serving process:
retrieval latency p50/p95 without vs with the filter (issue 28: with a filter p50 ≤ without + 10 ms at 50k chunks).
With `--chroma-url` the same chunks, vectors and questions also go into a second engine on that Chroma server (and
on `--database-url`'s PostgreSQL when given, else SQLite) and both configurations are measured in the same run,
alternating question by question (default settings).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.models.unigram_tokenizer import BACKEND_ENV
from tools.eval.cli import command_parser, write_json
from tools.eval.devsets import shared_data_dir

# The pipeline's and the stores' modules are imported inside the functions that need them: serve() runs in a
# fresh process and measures, step by step, the RSS the libraries add — module-level imports would hide it.


def _texts(n: int, chunk_size: int = 300, overlap: int = 50) -> list[str]:
    from pipeline.ingestion.chunking import split_text

    data = shared_data_dir()
    out: list[str] = []
    cm = json.loads((shared_data_dir() / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    sources = [p["context"] for a in cm["data"] for p in a["paragraphs"]]
    news = data / "crud_rag_news" / "documents_dup_part_1_part_1"
    if news.exists():
        sources += [line.strip() for line in news.open(encoding="utf-8") if line.strip()]
    for t in sources:
        out.extend(t[s:e] for s, e in split_text(t, chunk_size, overlap))
        if len(out) >= n:
            break
    return out[:n]


def _questions(n: int) -> list[str]:
    cm = json.loads((shared_data_dir() / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    qs = [qa["question"] for a in cm["data"] for p in a["paragraphs"] for qa in p["qas"]]
    return qs[:: max(1, len(qs) // n)][:n]


def pct(xs, p):
    return round(float(np.percentile(xs, p)), 1) if xs else None


def _replicas(base, base_emb, base_tok, n: int, rng):
    """(tokens, vector, text) of n chunks built from the base chunks (see module docstring)."""
    dim = base_emb.shape[1]
    for k in range(n):
        b = k % len(base)
        marker = f"副本{k}"
        v = base_emb[b] + rng.normal(0, 0.02, dim).astype(np.float32)
        yield base_tok[b] + [marker], v / np.linalg.norm(v), f"{base[b]}（{marker}）"


def _fill(engine, corpus, per_doc: int = 500, first_doc: int = 0, timing: dict | None = None,
          segments: bool = False) -> float:
    """Insert the corpus as 就绪 documents of `per_doc` chunks (SQL rows, stored tokens, vectors); seconds.
    `first_doc`: the number of the first document (a later fill into the same engine goes on from there);
    `timing`: the seconds spent in the vector inserts are added to its "vectors_s"; `segments`: each document's
    BM25 segment is written before it turns 就绪, as the ingest does (else the caller builds the index)."""
    from store.documents import ChunkRow

    c = engine.components
    c.vectors.claim_model(c.models.embedding.model_id, c.models.embedding.dim)
    t0 = time.perf_counter()
    for d, start in enumerate(range(0, len(corpus), per_doc), first_doc):
        part = corpus[start:start + per_doc]
        doc = c.docs.create(f"bench-{d}.txt", "txt", 0, f"{d:032x}", f"{d:032x}.txt")
        rows = [ChunkRow(doc["doc_id"], j, text, None, 0, len(text), "text", toks)
                for j, (toks, _, text) in enumerate(part)]
        ids = c.docs.replace_chunks(doc["doc_id"], rows)
        tv = time.perf_counter()
        c.vectors.add(ids, [v for _, v, _ in part], [t for _, _, t in part], doc["doc_id"], doc["file_name"])
        if timing is not None:
            timing["vectors_s"] = timing.get("vectors_s", 0.0) + time.perf_counter() - tv
        if segments:
            c.bm25.add_ready([(i, toks) for i, (toks, _, _) in zip(ids, part)])
        c.docs.mark_ready(doc["doc_id"], len(rows))
        print(f"\r  inserted {start + len(part)}/{len(corpus)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return round(time.perf_counter() - t0, 1)


def _compare_server(embedded, corpus, args, tmp: Path) -> dict:
    """The same corpus in an engine on the Chroma server (+ PostgreSQL); both measured question by question."""
    from pipeline.engine import Engine
    from pipeline.ops.deployment import Deployment

    dep = Deployment(database_url=args.database_url, chroma_url=args.chroma_url, files_dir=tmp / "server-files")
    server = Engine(tmp / "server-data", deployment=dep)
    try:
        if args.reranker:
            server.update_settings({"reranker_model_path": args.reranker})
            server.reload()
        if server.components.vectors.count() or server.components.docs.counts()["docs"]:
            raise SystemExit("the server databases must start empty (use a fresh Chroma database path / PG db)")
        insert_s = _fill(server, corpus, args.per_doc)
        s = server.settings
        server.components.bm25.rebuild(s.bm25_k1, s.bm25_b)
        keys = ("vector", "bm25", "retrieval_no_rerank")
        got: dict[str, dict[str, list[float]]] = {"embedded": {k: [] for k in keys}, "server": {k: [] for k in keys}}
        qs = _questions(args.queries)
        for eng in (embedded, server):
            eng.components.retrieval.retrieve(qs[0], eng.settings)  # warm-up
        for q in qs:  # alternate, so background load hits both configurations alike
            for name, eng in (("embedded", embedded), ("server", server)):
                r = eng.components.retrieval.retrieve(q, eng.settings)
                got[name]["vector"].append(r.ms.get("vector", 0.0))
                got[name]["bm25"].append(r.ms.get("bm25", 0.0))
                got[name]["retrieval_no_rerank"].append(sum(r.ms.get(k, 0.0)
                                                            for k in ("embed", "bm25", "vector", "fusion")))
        label = f"Chroma server{' + PostgreSQL' if args.database_url else ' + SQLite'}"
        return {"label": label, "insert_s": insert_s,
                **{n: {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in d.items()} for n, d in got.items()}}
    finally:
        server.close()


def print_server(report: dict) -> None:
    srv = report["server"]
    print(f"\nSame run, same {report['chunks']} chunks and questions, alternating: embedded vs {srv['label']}")
    print("| route | embedded p50 ms | server p50 ms | embedded p95 ms | server p95 ms |\n|---|---|---|---|---|")
    for k in ("vector", "bm25", "retrieval_no_rerank"):
        e, v = srv["embedded"][k], srv["server"][k]
        print(f"| {k} | {e['p50']} | {v['p50']} | {e['p95']} | {v['p95']} |")
    print(f"- insert of {report['chunks']} chunks into the server configuration: {srv['insert_s']} s")


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_retrieval", __doc__)
    ap.add_argument("--chunks", type=int, default=50000)
    ap.add_argument("--base", type=int, default=1000, help="real chunks embedded by the model")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--reranker", default=None, help="cross-encoder directory (rerank stage timing)")
    ap.add_argument("--chroma-url", default=None, help="also measure on this Chroma server (http://host:port/db)")
    ap.add_argument("--database-url", default=None, help="with --chroma-url: metadata on this PostgreSQL")
    ap.add_argument("--filter", action="store_true",
                    help="also measure with a document filter (a tag on --filter-share of the documents)")
    ap.add_argument("--filter-share", type=float, default=0.1, help="share of the documents the filter allows")
    ap.add_argument("--per-doc", type=int, default=500, help="chunks per benchmark document")
    ap.add_argument("--json", default=None)
    ap.add_argument("--data", default=None, help="measure only the serving state over (a copy of) this data dir")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # internal: measure a built data dir
    args = ap.parse_args(argv)
    if args.serve:
        share = args.filter_share if args.filter else None
        Path(args.json).write_text(json.dumps(serve(Path(args.serve), args.queries, args.reranker, share)))
        return 0
    if args.data:  # serving state only, over a copy of an existing data dir (no 50k build)
        with tempfile.TemporaryDirectory(prefix="kbqa-bench-") as tmp:
            shutil.copytree(args.data, Path(tmp) / "data")
            report = serve_both(Path(tmp) / "data", args)
        print(f"\nServing benchmark over a copy of {args.data}, {args.queries} CMRC questions")
        print_serving(report)
        write_json(args.json, report)
        return 0

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
        all_texts = [text for _, _, text in corpus]
        report["insert_s"] = _fill(engine, corpus, args.per_doc)

        s = engine.settings
        t0 = time.perf_counter()
        engine.components.bm25.rebuild(s.bm25_k1, s.bm25_b)  # the serving process opens it
        report["bm25_rebuild_from_tokens_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        retok = [engine.components.tokenizer(t) for t in all_texts]
        report["jieba_retokenize_s"] = round(time.perf_counter() - t0, 2)
        report["rebuild_speedup_vs_retokenize"] = round(
            (report["jieba_retokenize_s"] + report["bm25_rebuild_from_tokens_s"])
            / max(report["bm25_rebuild_from_tokens_s"], 1e-9), 1)
        del retok, all_texts
        report["build_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        if args.chroma_url:
            report["server"] = _compare_server(engine, corpus, args, Path(tmp))
        del corpus
        engine.close()
        # The serving state is measured in a fresh process over the built data dir: this one carries the
        # benchmark's own build-time allocations (50k texts, token lists, Chroma insert buffers).
        report |= serve_both(Path(tmp) / "data", args)

    print(f"\nRetrieval benchmark: {args.chunks} chunks ({args.base} embedded for real), "
          f"{args.queries} CMRC questions, 2 cores")
    print(f"- BM25 rebuild from stored tokens: {report['bm25_rebuild_from_tokens_s']} s "
          f"(re-tokenizing with jieba instead: +{report['jieba_retokenize_s']} s → "
          f"{report['rebuild_speedup_vs_retokenize']}× slower)")
    print_serving(report)
    print(f"- Chroma insert of {args.chunks} vectors: {report['insert_s']} s "
          f"(build process peak {report['build_peak_rss_mb']} MB, not the serving state)")
    if "server" in report:
        print_server(report)
    write_json(args.json, report)
    return 0


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) of this process (or process `pid`) in MB, from /proc (Linux)."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return round(vals["VmRSS"]), round(vals["VmHWM"])


MODES = {"convex (auto weight + fragment prior)": {"fusion_mode": "convex", "convex_auto_weight": True,
                                                   "convex_length_prior": True},
         "convex (auto weight, no prior)": {"fusion_mode": "convex", "convex_auto_weight": True,
                                            "convex_length_prior": False},
         "rrf (SRS, K=60)": {"fusion_mode": "rrf", "bm25_adaptive": False}}


def serve(data: Path, n_queries: int, reranker: str | None, filter_share: float | None = None) -> dict:
    """The serving state over a built data dir, component by component, as Engine.load builds it; then the
    same questions through each fusion mode (latency per stage); with `filter_share` also without vs with a
    document filter allowing that share of the documents (`filter_compare`)."""
    steps: list[tuple[str, float]] = [("python", rss_mb()[0])]
    # imported here on purpose: the RSS the libraries add is the next measured step (see the module's imports)
    from pipeline.components import build_components, load_models
    from pipeline.settings import Settings
    steps.append(("libraries (llama-index, chromadb, jieba, numpy…)", rss_mb()[0]))
    s = Settings(**({"reranker_model_path": reranker} if reranker else {}))
    c = build_components(data, settings=lambda: s)
    c.tokenizer("预热")  # jieba loads its dictionary on first use
    steps.append(("stores: SQLite, Chroma client, jieba dictionary", rss_mb()[0]))
    load_models(c, s)
    steps.append(("models: embedding (e5 ONNX + tokenizer), reranker, LLM client", rss_mb()[0]))
    c.bm25.open(s.bm25_k1, s.bm25_b, c.docs.ready_chunk_ids())
    steps.append((f"BM25 index ({len(c.bm25.view.segments)} segments, {c.bm25.view.n} chunks)", rss_mb()[0]))
    qs = _questions(n_queries)
    c.retrieval.retrieve(qs[0], s)
    steps.append(("first question (Chroma loads its HNSW index)", rss_mb()[0]))
    latency = {}
    for name, change in MODES.items():
        ms_mode = s.model_copy(update=change)
        c.retrieval.retrieve(qs[0], ms_mode)  # warm-up: this mode's retriever is built once
        stages: dict[str, list[float]] = {k: [] for k in ("embed", "bm25", "vector", "fusion", "rerank",
                                                          "retrieval_no_rerank", "total")}
        for q in qs:
            r = c.retrieval.retrieve(q, ms_mode)
            for k in ("embed", "bm25", "vector", "fusion", "rerank", "total"):
                stages[k].append(r.ms.get(k, 0.0))
            stages["retrieval_no_rerank"].append(sum(r.ms.get(k, 0.0) for k in ("embed", "bm25", "vector", "fusion")))
        latency[name] = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in stages.items()}
    steps.append((f"{len(MODES) * n_queries} questions", rss_mb()[0]))
    filtered = filter_compare(c, s, qs, filter_share) if filter_share else None
    rerank = c.retrieval.rerank_label or "未配置精排模型（阶段跳过）"
    c.close()
    rows = [(name, mb, mb - prev) for (name, mb), (_, prev) in zip(steps[1:], steps[:-1])]
    out = {"latency_ms": latency, "rerank": rerank, "rss_steps": rows, "peak_rss_mb": rss_mb()[1]}
    return out | ({"filter_compare": filtered} if filtered else {})


FILTER_TAG = "bench-filter"
FILTER_KEYS = ("filter", "bm25", "vector", "fusion", "retrieval_no_rerank")


def filter_compare(c, s, qs: list[str], share: float) -> dict:
    """Tag every k-th document (k = 1 / share), then the same questions without and with tags_any=[tag],
    alternating question by question (default settings, no rerank). retrieval_no_rerank includes the filter's
    SQL resolution (stage "filter")."""
    from store.doc_tags import DocFilter

    docs = [d["doc_id"] for d in c.docs.all_docs()]
    every = max(1, round(1 / share))
    tagged = docs[::every]
    for d in tagged:
        c.doc_tags.set(d, [FILTER_TAG])
    flt = DocFilter(tags_any=(FILTER_TAG,))
    allowed = c.retrieval.allowed(flt, None)
    c.retrieval.recall_stage(qs[0], s)
    t0 = time.perf_counter()  # the first filtered question after a (re)build maps the BM25 positions to documents
    for part in c.bm25.view.parts():
        c.retrieval.chunk_docs.of_part(part)
    map_ms = round((time.perf_counter() - t0) * 1000, 1)
    t0 = time.perf_counter()
    c.retrieval.recall_stage(qs[0], s, doc_filter=flt)
    first_ms = round((time.perf_counter() - t0) * 1000, 1)
    for q in qs[:3]:  # warm-up: both paths
        c.retrieval.recall_stage(q, s)
        c.retrieval.recall_stage(q, s, doc_filter=flt)
    got: dict[str, dict[str, list[float]]] = {"without": {k: [] for k in FILTER_KEYS},
                                              "with": {k: [] for k in FILTER_KEYS}}
    found = full_vector = 0
    paired: list[float] = []  # per question: (filter + bm25 + vector + fusion) with − without; the embedding is
    for q in qs:              # the same work either way and its noise on a busy machine dwarfs the difference
        routes = {}
        for name, f in (("without", None), ("with", flt)):
            r = c.retrieval.recall_stage(q, s, doc_filter=f)
            for k in FILTER_KEYS[:-1]:
                got[name][k].append(r.ms.get(k, 0.0))
            got[name]["retrieval_no_rerank"].append(sum(r.ms.get(k, 0.0)
                                                        for k in ("embed", "filter", "bm25", "vector", "fusion")))
            routes[name] = sum(r.ms.get(k, 0.0) for k in ("filter", "bm25", "vector", "fusion"))
            if f is not None:
                found += bool(r.fused) and all(n.node.metadata["doc_id"] in set(tagged) for n in r.fused)
                full_vector += len(r.vector) == min(s.recall_size, allowed.chunk_count)
        paired.append(routes["with"] - routes["without"])
    return {"docs": len(docs), "tagged_docs": len(tagged), "first_filtered_ms": first_ms, "map_ms": map_ms,
            "paired_delta_ms": {"p50": pct(paired, 50), "p95": pct(paired, 95)}, "full_vector_lists": full_vector, "allowed_chunks": int(allowed.chunk_count),
            "questions_with_only_allowed_hits": found, "questions": len(qs),
            **{n: {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in d.items()} for n, d in got.items()}}


def print_filter(report: dict) -> None:
    fc = report["filter_compare"]
    print(f"\nDocument filter, same serving process and questions, alternating: tags_any=[{FILTER_TAG}] on "
          f"{fc['tagged_docs']}/{fc['docs']} documents ({fc['allowed_chunks']} chunks allowed); "
          f"{fc['questions_with_only_allowed_hits']}/{fc['questions']} filtered questions got hits, all allowed")
    print("| stage | without p50 / p95 ms | with filter p50 / p95 ms |\n|---|---|---|")
    for k in FILTER_KEYS:
        w, f = fc["without"][k], fc["with"][k]
        print(f"| {k} | {w['p50']} / {w['p95']} | {f['p50']} / {f['p95']} |")
    d = round(fc["with"]["retrieval_no_rerank"]["p50"] - fc["without"]["retrieval_no_rerank"]["p50"], 1)
    print(f"- retrieval p50 with the filter − without: {d:+} ms (issue 28 asks ≤ +10 ms at 50k chunks)")
    pd = fc["paired_delta_ms"]
    print(f"- per question, routes only (filter + bm25 + vector + fusion), with − without: p50 {pd['p50']:+} ms, "
          f"p95 {pd['p95']:+} ms; the vector route returned a full top-k of allowed chunks for "
          f"{fc['full_vector_lists']}/{fc['questions']} filtered questions")
    print(f"- first filtered question after the BM25 index was built: {fc['first_filtered_ms']} ms (mapping its "
          f"positions to documents, once per build: {fc['map_ms']} ms)")


def serve_both(data: Path, args) -> dict:
    """The serving state measured in fresh processes over a built data dir (the benchmark's own process carries
    its build-time allocations): once as shipped, once with the `tokenizers` library's own Unigram for e5
    (KBQA_EMBED_TOKENIZER=tokenizers) — the old and the new tokenizer memory in the same run."""
    out = {}
    for name, env in (("lean", {}), ("tokenizers", {BACKEND_ENV: "tokenizers"})):
        path = data.parent / f"serve-{name}.json"
        cmd = [sys.executable, "-m", "tools.bench.bench_retrieval", "--serve", str(data), "--queries", str(args.queries),
               "--json", str(path)] + (["--reranker", args.reranker] if args.reranker else [])
        if getattr(args, "filter", False) and name == "lean":  # the filter comparison once, as shipped
            cmd += ["--filter", "--filter-share", str(args.filter_share)]
        subprocess.run(cmd, check=True, env={**os.environ, **env})
        out[name] = json.loads(path.read_text())
    report = dict(out["lean"])
    report["tokenizer_compare"] = {n: {"steps_added_mb": [a for _, _, a in r["rss_steps"]],
                                       "after_questions_mb": r["rss_steps"][-1][1], "peak_rss_mb": r["peak_rss_mb"]}
                                   for n, r in out.items()}
    return report


def print_serving(report: dict) -> None:
    modes = list(report["latency_ms"])
    print("| stage | " + " | ".join(f"{m} p50 / p95 ms" for m in modes) + " |")
    print("|---" * (len(modes) + 1) + "|")
    for k in report["latency_ms"][modes[0]]:
        cells = [f"{report['latency_ms'][m][k]['p50']} / {report['latency_ms'][m][k]['p95']}" for m in modes]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(f"- rerank: {report['rerank']}")
    print("\nServing state RSS by component (fresh process, in the order Engine.load builds it):")
    print("| component | RSS after (MB) | added (MB) |\n|---|---|---|")
    for name, mb, added in report["rss_steps"]:
        print(f"| {name} | {mb} | {added:+} |")
    print(f"- peak RSS of the serving process: {report['peak_rss_mb']} MB")
    if "tokenizer_compare" in report:
        print("\ne5 tokenizer, same run, fresh process each (lean Unigram search vs the tokenizers library's):")
        print("| tokenizer | added per component, in the order above (MB) | RSS after the questions (MB) | peak (MB) |"
              "\n|---|---|---|---|")
        for n, r in report["tokenizer_compare"].items():
            steps = " / ".join(f"{a:+}" for a in r["steps_added_mb"])
            print(f"| {n} | {steps} | {r['after_questions_mb']} | {r['peak_rss_mb']} |")
    if "filter_compare" in report:
        print_filter(report)


if __name__ == "__main__":
    sys.exit(main())
