"""Calibrate the extractive picker (pipeline/generation/extractive.py) with leave-one-set-out over the dev sets.

    python -m tools.extractive_dataset --kb-cache DIR --out EXT_DIR     # candidates per question (minutes, once)
    python -m tools.calibrate_extractive --dumps EXT_DIR [--json OUT]   # grid + left-out table (seconds)

For every dev set in turn, on the OTHER sets only:
  * the weights (w_cov, w_phrase, w_rank; w_cos fixed at 10 — only ratios matter) and the margin for extra
    sentences are the grid point with the best mean answer-hit (each set weighs the same) among those whose
    answers hold at most MAX_MEAN_SENTENCES sentences on average (the brief: best 1–3 sentences);
  * not_found_below is the lowest, over the training sets, NOT_FOUND_QUANTILE-quantile of the best score (above
    w_cos × the KB background's median cosine) of the answerable questions whose sources hold the answer (at most that share of answers that are there are
    replaced by 「资料中未找到…」).
Then the left-out set is scored: answer-hit (an answer sentence holds a gold answer), top-1-source-hit (its
ceiling), sentences per answer, 「未找到」 on answerable and on gold-removed questions. The fit on all sets
gives the shipped PickerParams.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.generation.extractive import MAX_SENTENCES, PickerParams
from tools.cli import print_md_table, report_fit

W_COS = 10.0
GRID = {
    "w_cov": (0.5, 1.0, 2.0, 3.0, 5.0, 8.0),
    "w_phrase": (0.0, 0.5, 1.0, 2.0, 3.0),
    "w_rank": (0.0, 0.1, 0.2),
    "margin": (0.2, 0.3, 0.5),
    "w_context": (0.0, 0.5, 1.0, 2.0),
    "w_focus": (0.0, 0.25, 0.5, 1.0),
}
MAX_MEAN_SENTENCES = 1.8
NOT_FOUND_QUANTILE = 0.02


@dataclass
class SetData:
    """Candidates of one set's questions as padded arrays [questions, candidates]."""

    name: str
    kind: np.ndarray      # 1 answerable, 0 gold removed
    top1: np.ndarray
    valid: np.ndarray     # candidate exists
    cos: np.ndarray
    cov: np.ndarray
    context: np.ndarray
    focus: np.ndarray
    phrase: np.ndarray
    source: np.ndarray
    position: np.ndarray
    answer: np.ndarray
    bg_median: np.ndarray  # the KB background's median cosine, per question (the same KB: one value)


def load(dumps: Path) -> dict[str, SetData]:
    out = {}
    for f in sorted(Path(dumps).glob("*.jsonl")):
        rows = [json.loads(line) for line in open(f, encoding="utf-8")]
        width = max((len(r["cands"]) for r in rows), default=1) or 1

        def pad(key, fill=0.0, rows=rows, width=width):
            a = np.full((len(rows), width), fill, dtype=np.float64)
            for i, r in enumerate(rows):
                for j, c in enumerate(r["cands"]):
                    a[i, j] = c.get(key, 0.0) if key != "valid" else 1.0
            return a

        out[f.stem] = SetData(
            f.stem, np.array([r["kind"] == "answerable" for r in rows]), np.array([r["top1"] for r in rows]),
            pad("valid") > 0, pad("cosine"), pad("coverage"), pad("context"), pad("focus"), pad("phrase"), pad("source", 99),
            pad("position", 999),
            pad("has_answer") > 0, np.array([r["bg_median"] for r in rows]))
    return out


def run(d: SetData, p: PickerParams) -> dict[str, np.ndarray]:
    """What the picker does with these candidates (same rules as ExtractivePicker.select): per question the
    best score, whether an answer was given, whether it holds a gold answer, how many sentences."""
    lexical = (p.w_cov * d.cov + p.w_phrase * d.phrase + p.w_context * d.context + p.w_focus * d.focus
               - p.w_rank * (d.source - 1))
    keep = d.valid  # the dump holds the embedded candidates only (the app's fixed prefilter)
    score = np.where(keep, lexical + p.w_cos * d.cos, -np.inf)
    best = score.max(axis=1)
    ranked = np.lexsort((d.position, d.source, -score), axis=1)[:, :MAX_SENTENCES]
    top_scores = np.take_along_axis(score, ranked, axis=1)
    chosen = np.isfinite(top_scores) & (top_scores >= best[:, None] - p.margin)
    above = best - p.w_cos * d.bg_median  # the best score above the KB's background (see extractive.py)
    found = np.isfinite(best) & (above >= p.not_found_below)
    hit = found & (np.take_along_axis(d.answer, ranked, axis=1) & chosen).any(axis=1)
    return {"best": above, "found": found, "hit": hit, "n": chosen.sum(axis=1),
            "addressable": (d.answer & keep).any(axis=1)}


def metrics(d: SetData, p: PickerParams) -> dict:
    r = run(d, p)
    a = d.kind
    return {
        "answerable": int(a.sum()), "answer_hit": round(float(r["hit"][a].mean()), 4),
        "top1_source_hit": round(float(d.top1[a].mean()), 4),
        "sentences": round(float(r["n"][a & r["found"]].mean()), 2) if (a & r["found"]).any() else 0.0,
        "not_found_answerable": round(float((~r["found"][a]).mean()), 4),
        "gold_removed": int((~a).sum()),
        "not_found_gold_removed": round(float((~r["found"][~a]).mean()), 4) if (~a).any() else 0.0,
    }


def fit(train: list[SetData]) -> PickerParams:
    best_key, best = None, None
    for w_cov, w_phrase, w_rank, margin, w_context, w_focus in itertools.product(*GRID.values()):
        p = PickerParams(W_COS, w_cov, w_phrase, w_rank, margin, -np.inf, w_context, w_focus)
        runs = [run(d, p) for d in train]
        hit = np.mean([r["hit"][d.kind].mean() for d, r in zip(train, runs)])
        n = np.mean([r["n"][d.kind].mean() for d, r in zip(train, runs)])
        if n > MAX_MEAN_SENTENCES:
            continue
        key = (round(float(hit), 6), -n)
        if best_key is None or key > best_key:
            best_key, best = key, p
    assert best is not None, "no grid point meets MAX_MEAN_SENTENCES"
    floors = []
    for d in train:
        r = run(d, best)
        there = d.kind & r["addressable"]
        if there.any():
            floors.append(float(np.quantile(r["best"][there], NOT_FOUND_QUANTILE)))
    return PickerParams(W_COS, best.w_cov, best.w_phrase, best.w_rank, best.margin, min(floors), best.w_context,
                        best.w_focus)


def print_table(rows: dict[str, dict]) -> None:
    print_md_table(["left-out set", "answerable", "answer-hit", "top-1-source-hit", "sentences/answer",
                    "未找到 on answerable", "gold removed", "未找到 on gold removed"],
                   [[name, m["answerable"], f"{m['answer_hit']:.3f}", f"{m['top1_source_hit']:.3f}",
                     f"{m['sentences']:.2f}", f"{m['not_found_answerable']:.1%}", m["gold_removed"],
                     f"{m['not_found_gold_removed']:.1%}"] for name, m in rows.items()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.calibrate_extractive", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dumps", required=True, type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sets = load(args.dumps)
    if len(sets) < 2:
        ap.error("leave-one-set-out needs the dumps of at least two sets")
    loso = {}
    for name, d in sets.items():
        p = fit([x for n, x in sets.items() if n != name])
        loso[name] = metrics(d, p) | {"params": p.__dict__}
    print("left-out sets (params fitted on the others):")
    print_table(loso)
    report_fit("PickerParams", fit(list(sets.values())), loso, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
