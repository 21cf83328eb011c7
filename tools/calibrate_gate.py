"""Calibrate the no-answer gate (pipeline/retrieval/gate.py) with leave-one-set-out over the dev sets.

    python -m tools.gate_dataset --kb-cache DIR --out GATE_DIR      # per-question features (minutes, once)
    python -m tools.calibrate_gate --dumps GATE_DIR [--json OUT]     # fit + left-out table (seconds)

For every dev set in turn: fit the gate's logistic model on the OTHER sets only — positives their answerable
questions, negatives questions of further sets (out of that KB) and their own questions with the gold removed;
the left-out set's questions appear nowhere in training — choose the thresholds on those training sets
(refuse_below: the lowest FR_QUANTILE-quantile of answerable scores over the training sets; answer_at: the
lowest WEAK_QUANTILE-quantile), then score the left-out set's knowledge base: false refusals and weak share
of its answerable questions, refusals of out-of-KB questions (those whose answer string stands in this KB's
top-6 are not counted as negatives), refusals of its gold-removed questions.
Last, the same fit on all sets gives the shipped model (printed as a GateModel line for gate.py) and the
calibrated hard floor min_similarity for the embedding model the dumps were made with.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from pipeline.retrieval.gate import INPUTS, GateModel, gate_inputs
from pipeline.retrieval.gate_background import Background, summarize
from pipeline.retrieval.gate_features import GateFeatures
from tools.cli import print_md_table

FR_QUANTILE = 0.025    # refuse below the 2.5% quantile of answerable scores (the lowest over training sets)
WEAK_QUANTILE = 0.08   # weak below the 8% quantile
FLOOR_QUANTILE = 0.002  # hard floor: under the 0.2% quantile of answerable cosines of every set
L2 = 1e-2


def load(dumps: Path) -> tuple[list[dict], dict[str, Background]]:
    rows = [json.loads(line) for f in sorted(Path(dumps).glob("*.jsonl")) for line in open(f, encoding="utf-8")]
    for r in rows:
        missing = [k for k, fl in GateFeatures.__dataclass_fields__.items()
                   if k not in r["f"] and fl.default is dataclasses.MISSING]
        if missing:
            raise SystemExit(f"{dumps}: dump rows lack {', '.join(missing)} — made by an older tools.gate_dataset; "
                             "run it again")
        r["feat"] = GateFeatures(**{k: r["f"][k] for k in GateFeatures.__dataclass_fields__ if k in r["f"]})
    kbs = sorted({r["kb"] for r in rows})
    bg = {kb: summarize([r["feat"] for r in rows if r["kb"] == kb and r["kind"] == "probe"]) for kb in kbs}
    return [r for r in rows if r["kind"] != "probe" and not r.get("answer_here")], bg


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, iters: int = 50) -> tuple[np.ndarray, float]:
    """Weighted L2 logistic regression by Newton steps on standardised inputs; returns raw-scale coef, bias."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    beta = np.zeros(z.shape[1])
    reg = L2 * np.r_[np.ones(z.shape[1] - 1), 0.0]
    for _ in range(iters):
        p = 1 / (1 + np.exp(-z @ beta))
        grad = z.T @ (w * (p - y)) + reg * beta
        hess = (z * (w * p * (1 - p))[:, None]).T @ z + np.diag(reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    coef = beta[:-1] / sd
    return coef, float(beta[-1] - (coef * mu).sum())


def fit(train: list[dict], bg: dict[str, Background]) -> GateModel:
    x = np.array([gate_inputs(r["feat"], bg[r["kb"]]) for r in train])
    y = np.array([r["kind"] == "answerable" for r in train], dtype=float)
    count = collections.Counter((r["kb"], r["kind"] == "answerable") for r in train)
    w = np.array([1.0 / count[(r["kb"], r["kind"] == "answerable")] for r in train])  # each KB and class alike
    coef, bias = fit_logistic(x, y, w)
    model = GateModel(tuple(float(c) for c in coef), bias, 0.0, 0.0)
    per_kb = collections.defaultdict(list)
    for r in train:
        if r["kind"] == "answerable":
            per_kb[r["kb"]].append(model.score(r["feat"], bg[r["kb"]]))
    refuse = min(float(np.quantile(v, FR_QUANTILE)) for v in per_kb.values())
    answer = max(refuse, min(float(np.quantile(v, WEAK_QUANTILE)) for v in per_kb.values()))
    return GateModel(model.coef, model.bias, refuse, answer)


def score_set(model: GateModel, rows: list[dict], bg: Background) -> dict:
    def scores(kind):
        return np.array([model.score(r["feat"], bg) for r in rows if r["kind"] == kind])

    a, o, g = scores("answerable"), scores("out_of_kb"), scores("gold_removed")
    return {
        "answerable": len(a), "false_refusals": _share(a < model.refuse_below),
        "weak": _share((a >= model.refuse_below) & (a < model.answer_at)),
        "out_of_kb": len(o), "out_of_kb_refused": _share(o < model.refuse_below),
        "out_of_kb_weak": _share((o >= model.refuse_below) & (o < model.answer_at)),
        "gold_removed": len(g), "gold_removed_refused": _share(g < model.refuse_below),
        "gold_removed_weak": _share((g >= model.refuse_below) & (g < model.answer_at)),
    }


def _share(mask: np.ndarray) -> float:
    return round(float(mask.mean()), 4) if mask.size else 0.0


def leave_one_set_out(rows: list[dict], bg: dict[str, Background]) -> dict[str, dict]:
    out = {}
    for left in sorted(bg):
        train = [r for r in rows if r["kb"] != left and r["qset"] != left]
        model = fit(train, bg)
        out[left] = score_set(model, [r for r in rows if r["kb"] == left], bg[left]) | {"model": model.__dict__}
    return out


def hard_floor(rows: list[dict]) -> float:
    per_kb = collections.defaultdict(list)
    for r in rows:
        if r["kind"] == "answerable":
            per_kb[r["kb"]].append(r["feat"].max_similarity)
    q = min(float(np.quantile(v, FLOOR_QUANTILE)) for v in per_kb.values())
    return float(np.floor(q * 100) / 100)


def print_table(result: dict[str, dict]) -> None:
    print_md_table(["left-out set", "answerable", "false refusals", "weak", "out-of-KB", "out-of-KB refused (weak)",
                    "gold removed", "gold removed refused (weak)"],
                   [[name, m["answerable"], f"{m['false_refusals']:.1%}", f"{m['weak']:.1%}", m["out_of_kb"],
                     f"{m['out_of_kb_refused']:.1%} ({m['out_of_kb_weak']:.1%})", m["gold_removed"],
                     f"{m['gold_removed_refused']:.1%} ({m['gold_removed_weak']:.1%})"] for name, m in result.items()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.calibrate_gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dumps", required=True, type=Path, help="folder of tools.gate_dataset outputs")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows, bg = load(args.dumps)
    if len(bg) < 2:
        ap.error("leave-one-set-out needs the dumps of at least two sets")
    result = leave_one_set_out(rows, bg)
    print(f"inputs: {', '.join(INPUTS)}; backgrounds: " +
          ", ".join(f"{k} median {b.sim_median:.4f} scale {b.sim_scale:.4f}" for k, b in bg.items()))
    print_table(result)
    shipped = fit(rows, bg)
    floor = hard_floor(rows)
    print(f"\nall sets → SHIPPED = GateModel(coef=({', '.join(f'{c:.4f}' for c in shipped.coef)}), "
          f"bias={shipped.bias:.4f}, refuse_below={shipped.refuse_below:.4f}, answer_at={shipped.answer_at:.4f})")
    print(f"hard floor (min_similarity) for this embedding model: {floor:.2f}")
    print("\nshipped model on each set (in-sample):")
    print_table({k: score_set(shipped, [r for r in rows if r["kb"] == k], bg[k]) for k in sorted(bg)})
    if args.json:
        args.json.write_text(json.dumps({"leave_one_set_out": result, "shipped": shipped.__dict__,
                                         "min_similarity": floor}, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
