"""Ingest throughput, end to end through the engine (upload → parse → chunk → tokenize → embed → write).

    python -m tools.bench.bench_ingest [--cmrc N] [--news N] [--compare REV [REV ...] [--rounds R]]

Documents: N CMRC 2018 dev contexts + N CRUD-RAG news articles (../shared/data), each uploaded as a .txt
file. Prints chunks/s end to end and the share of worker time per stage. Embedding dominates; the rest
(parse + chunk + tokenize + write) should stay under 15% of the embedding time.

`--compare REV …` measures older releases in the same run: `git archive REV` is unpacked in a temp dir (the
packaged model folder linked in, so nothing is rebuilt, and this file copied in, so every tree is measured the
same way) and all trees run this benchmark in their own fresh process, alternately, R rounds each (default 2) —
old and new see the same machine load. Besides wall-clock chunks/s it reports CPU seconds of the process per
chunk (all threads): on a shared machine other work stretches the wall clock far more than the CPU time.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from tools.eval.cli import command_parser, write_json

ROOT = Path(__file__).resolve().parents[2]  # this file is <tree>/tools/bench/bench_ingest.py in every tree
DATA = ROOT.parent / "shared" / "data"
MODULE = "tools.bench.bench_ingest"


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_ingest", __doc__)
    ap.add_argument("--cmrc", type=int, default=150, help="CMRC contexts")
    ap.add_argument("--news", type=int, default=50, help="CRUD-RAG news articles")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", nargs="+", default=None, metavar="REV", help="also measure these git revisions")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per tree with --compare")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args)

    # the engine (llama-index, Chroma, the model) loads in seconds: not for --help nor for --compare's parent
    from pipeline.engine import Engine

    cm = json.loads((DATA / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    texts = [p["context"] for a in cm["data"] for p in a["paragraphs"]][: args.cmrc]
    with open(DATA / "crud_rag_news" / "documents_dup_part_1_part_1", encoding="utf-8") as f:
        news = [line.strip() for line in f if line.strip()]
    texts += news[: args.news]
    with tempfile.TemporaryDirectory(prefix="kbqa-bench-ingest-") as tmp:
        engine = Engine(Path(tmp) / "data")
        src = Path(tmp) / "src"
        src.mkdir()
        paths = []
        for i, t in enumerate(texts):
            p = src / f"doc{i}.txt"
            p.write_text(t, encoding="utf-8")
            paths.append((p.name, p))
        engine.components.ingest.timer.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(paths), 10):
            engine.upload(paths[i:i + 10])
        engine.wait_idle()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        timer = engine.components.ingest.timer
        secs = dict(timer.seconds)
        chunks = timer.chunks
        c = engine.components.docs.counts()
        label = engine.components.models.embedding.label
        engine.close()
    total_stage = sum(secs.values()) or 1e-9
    other = sum(v for k, v in secs.items() if k != "embed")
    report = {"docs": len(texts), "chunks": chunks, "ready_docs": c["ready_docs"], "wall_s": round(wall, 1),
              "chunks_per_s": round(chunks / wall, 2), "embedding": label,
              "cpu_ms_per_chunk": round(cpu * 1000 / max(chunks, 1), 1),
              "stage_s": {k: round(v, 2) for k, v in secs.items()},
              "stage_share": {k: round(v / total_stage, 4) for k, v in secs.items()},
              "non_embed_vs_embed": round(other / max(secs.get("embed", 1e-9), 1e-9), 4)}
    print(f"\nIngest benchmark: {report['docs']} docs → {chunks} chunks in {report['wall_s']} s "
          f"= {report['chunks_per_s']} chunks/s end to end ({label}, 2 cores), "
          f"{report['cpu_ms_per_chunk']} CPU ms per chunk")
    print("| stage | seconds | share |\n|---|---|---|")
    for k in ("parse", "chunk", "tokenize", "embed", "write"):
        print(f"| {k} | {report['stage_s'].get(k, 0)} | {report['stage_share'].get(k, 0) * 100:.1f}% |")
    print(f"- everything but embedding = {report['non_embed_vs_embed'] * 100:.1f}% of embedding time "
          f"(goal < 15%)")
    write_json(args.json, report)
    return 0


def compare(args) -> int:
    """Older revisions (REV …) and this tree alternately, each run in a fresh process; per-round numbers, mean and
    spread (min–max) of chunks/s and of CPU ms per chunk."""
    root = ROOT
    trees: dict[str, Path] = {}
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="kbqa-bench-old-") as tmp:
        for rev in args.compare:
            old = Path(tmp) / f"tree-{rev}"
            old.mkdir()
            blob = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev], check=True,
                                  capture_output=True).stdout
            with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
                tar.extractall(old, filter="data")
            # the same measurement everywhere, at the same place (older trees have no tools/bench/)
            (old / "tools" / "bench").mkdir(exist_ok=True)
            (old / "tools" / "bench" / "__init__.py").touch()
            shutil.copy(Path(__file__), old / "tools" / "bench" / "bench_ingest.py")
            (old / "models").mkdir(exist_ok=True)
            for model in (root / "models").iterdir():
                if model.is_dir() and not (old / "models" / model.name).exists():
                    os.symlink(model, old / "models" / model.name)
            trees[rev] = old
        trees["new"] = root
        runs = {k: [] for k in trees}
        # the old trees' bench reads ../shared/data relative to themselves
        os.symlink(DATA.parent, Path(tmp) / "shared")
        for r in range(args.rounds):
            for name, tree in trees.items():
                out = Path(tmp) / f"{name}{r}.json"
                cmd = [sys.executable, "-m", MODULE, "--cmrc", str(args.cmrc), "--news",
                       str(args.news), "--json", str(out)]
                subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
                               stdout=subprocess.DEVNULL)
                runs[name].append(json.loads(out.read_text()))
                print(f"round {r + 1} {name}: {runs[name][-1]['chunks_per_s']} chunks/s, "
                      f"{runs[name][-1]['cpu_ms_per_chunk']} CPU ms/chunk", flush=True)
        for rev in args.compare:
            shutil.rmtree(trees[rev] / "models", ignore_errors=True)
    summary = {}
    print(f"\nIngest throughput, {', '.join(args.compare)} vs this tree (new), {args.rounds} alternating rounds:")
    print("| tree | chunks | chunks/s per round | mean (min–max) | CPU ms/chunk per round | mean (min–max) |")
    print("|---|---|---|---|---|---|")
    for k, rs in runs.items():
        tput = [x["chunks_per_s"] for x in rs]
        cpu = [x["cpu_ms_per_chunk"] for x in rs]
        summary[k] = {"chunks_per_s": statistics.mean(tput), "cpu_ms_per_chunk": statistics.mean(cpu)}
        print(f"| {k} | {rs[0]['chunks']} | {', '.join(map(str, tput))} | {statistics.mean(tput):.2f} "
              f"({min(tput)}–{max(tput)}) | {', '.join(map(str, cpu))} | {statistics.mean(cpu):.1f} "
              f"({min(cpu)}–{max(cpu)}) |")
    for rev in args.compare:
        print(f"- new / {rev}: chunks/s x{summary['new']['chunks_per_s'] / summary[rev]['chunks_per_s']:.3f}, "
              f"CPU per chunk x{summary['new']['cpu_ms_per_chunk'] / summary[rev]['cpu_ms_per_chunk']:.3f}")
    write_json(args.json, {"revs": args.compare, "runs": runs, "mean": summary})
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # No interpreter shutdown: a background thread still inside onnxruntime then (the gate background's refresh
    # after the last ingest) aborts the process ("terminate called without an active exception").
    os._exit(code)
