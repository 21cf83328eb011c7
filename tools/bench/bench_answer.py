"""Benchmark of the answer path beside retrieval, in one run: retrieval, the no-answer gate, extractive selection.

    python -m tools.bench.bench_answer --kb-cache DIR [--set cmrc_dev_news] [--questions 200]

Per question (the set's own questions, on its cached knowledge base): retrieval = embed + both routes + fusion +
rerank stage (recall_stage without the gate, plus rerank_stage); gate = the adaptive gate's features + decision
(ms["gate"]: measured inside recall_stage) beside the old fixed-threshold comparison; extractive = choosing the
answer sentences, the picker (embedding + lexical + the answer-kind cue; embeds and tags ≤ PREFILTER sentences)
beside the old lexical-only picker, and the share of it spent on the answer-kind cue (part-of-speech tagging of
the prefiltered sentences, added in session 2: the picker without it is the row minus that). Prints p50 / p95
ms of each.
"""
from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.generation.candidates import Cues
from pipeline.generation.extractive import ExtractivePicker
from pipeline.retrieval.nodes import kb_ids_of
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root
from tools.eval.devsets import DEV_SETS, load_corpus
from tools.eval.kb_cache import open_copy


def _p(xs: list[float]) -> str:
    return f"{np.percentile(xs, 50):8.1f} {np.percentile(xs, 95):8.1f}"


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_answer", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--set", default="cmrc_dev_news", choices=list(DEV_SETS))
    ap.add_argument("--questions", type=int, default=200)
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    ds = DEV_SETS[args.set]
    qs = [q.text for q in random.Random(7).sample(load_corpus(ds).questions, args.questions)]
    with tempfile.TemporaryDirectory(prefix="kbqa-bench-") as tmp:
        engine, _ = open_copy(root, ds, Path(tmp) / args.set)
        c, s = engine.components, engine.settings
        old_picker = ExtractivePicker(c.tokenizer)  # lexical only: the picker before the embedding scorer
        t0 = time.perf_counter()
        c.gate_background.current()  # measured once per KB state (at ingest in the app), not per question
        bg_ms = (time.perf_counter() - t0) * 1000
        for q in qs[:5]:  # warm up
            engine.ask_sync(q)
        ret, gate, floor, new, old, cue, n_chunks = [], [], [], [], [], [], c.docs.counts()["chunks"]
        for q in qs:
            res = c.retrieval.recall_stage(q, s)
            res = c.retrieval.rerank_stage(res, s)
            gate.append(res.ms["gate"])
            ret.append(res.ms["total"] - res.ms["gate"])
            t1 = time.perf_counter()
            _ = bool(res.fused) and res.max_similarity >= s.min_similarity  # the old gate: one comparison
            floor.append((time.perf_counter() - t1) * 1000)
            final = res.final or res.fused[: s.final_top_k]
            t1 = time.perf_counter()
            pick = c.picker.pick(q, final, res.query_embedding)
            new.append((time.perf_counter() - t1) * 1000)
            cues = Cues.of(q, c.tokenizer, c.picker.weights_of(kb_ids_of(final)))
            cands = c.picker.candidates(q, final, res.query_embedding) if pick else []
            t1 = time.perf_counter()
            for cand in cands:
                c.picker.kind_cue(cues, cand)
            cue.append((time.perf_counter() - t1) * 1000)
            t1 = time.perf_counter()
            old_picker.pick(q, final)
            old.append((time.perf_counter() - t1) * 1000)
        engine.close()
    print(f"{args.set}: {n_chunks} chunks, {len(qs)} questions; gate background measured in {bg_ms:.0f} ms "
          f"({len(c.gate_background.probes)} probes, once per knowledge-base change)")
    print(f"{'stage':42s} {'p50 ms':>8s} {'p95 ms':>8s}")
    print(f"{'retrieval (embed+routes+fusion+rerank)':42s} {_p(ret)}")
    print(f"{'gate: adaptive (features + decision)':42s} {_p(gate)}")
    print(f"{'gate: old fixed min_similarity':42s} {_p(floor)}")
    print(f"{'extractive: new (embedding + lexical + kind)':42s} {_p(new)}")
    print(f"{'  of which the answer-kind cue (POS tags)':42s} {_p(cue)}")
    print(f"{'extractive: old (lexical only)':42s} {_p(old)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
