"""Calibrate the no-answer gate (min_similarity) for the active embedding model.

    python -m tools.calibrate_gate --kb FILE --unanswerable FILE [--limit N] [--contexts N]

Builds a knowledge base from the contexts of a SQuAD-format file (e.g. CMRC 2018 dev), then records the top
vector similarity for its own questions (answerable) and for questions of another set whose passages are
not in the knowledge base (e.g. XQuAD zh: unanswerable here). Prints refusal accuracy / false refusals for a
range of thresholds and the threshold that maximises balanced accuracy.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

from tools.evaluate import build_kb, load_squad


def sweep(pos: np.ndarray, neg: np.ndarray) -> list[dict]:
    rows = []
    for t in np.round(np.arange(0.70, 0.951, 0.01), 2):
        false_refusal = float((pos < t).mean())  # answerable questions refused
        refusal_acc = float((neg < t).mean())  # unanswerable questions refused
        rows.append({"threshold": float(t), "refusal_accuracy": round(refusal_acc, 4),
                     "false_refusals": round(false_refusal, 4),
                     "balanced_accuracy": round((refusal_acc + 1 - false_refusal) / 2, 4)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.calibrate_gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb", required=True)
    ap.add_argument("--unanswerable", required=True)
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--contexts", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from pipeline.engine import Engine

    corpus = load_squad(Path(args.kb), args.limit, max_contexts=args.contexts)
    other = json.loads(Path(args.unanswerable).read_text(encoding="utf-8"))
    neg_q = [qa["question"] for a in other["data"] for p in a["paragraphs"] for qa in p["qas"]]
    neg_q = random.Random(5).sample(neg_q, min(args.limit, len(neg_q)))
    with tempfile.TemporaryDirectory(prefix="kbqa-gate-") as tmp:
        engine = Engine(Path(tmp) / "data")
        build_kb(engine, corpus, Path(tmp))
        s = engine.settings

        def top_sim(q: str) -> float:
            _, fusion, _ = engine.components.retrieval.recall(q, s)
            return max((n.score or 0.0 for n in fusion.vector), default=0.0)

        pos = np.array([top_sim(q.text) for q in corpus.questions])
        neg = np.array([top_sim(q) for q in neg_q])
        model = engine.components.models.embedding.model_id
        engine.close()
    rows = sweep(pos, neg)
    best = max(rows, key=lambda r: (r["balanced_accuracy"], -r["false_refusals"]))
    print(f"model {model}: answerable top-sim p5/p50 = {np.percentile(pos, 5):.3f}/{np.median(pos):.3f}, "
          f"unanswerable p50/p95 = {np.median(neg):.3f}/{np.percentile(neg, 95):.3f}")
    print("| min_similarity | refusal accuracy (unanswerable refused) | false refusals (answerable refused) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['threshold']:.2f} | {r['refusal_accuracy']:.3f} | {r['false_refusals']:.3f} |")
    print(f"best balanced accuracy at min_similarity={best['threshold']:.2f}: "
          f"refusal accuracy {best['refusal_accuracy']:.3f}, false refusals {best['false_refusals']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "rows": rows, "best": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
