"""Calibrate the no-answer gate (pipeline/retrieval/gate.py) with leave-one-set-out over the dev sets.

    python -m tools.eval.gate_dataset --kb-cache DIR --out GATE_DIR      # per-question features (minutes, once)
    python -m tools.eval.calibrate_gate --dumps GATE_DIR [--json OUT]     # fit + left-out table (seconds)

For every dev set in turn: fit the gate's two logistic models on the OTHER sets only — positives their
answerable questions, negatives questions of further sets (out of that KB) and their own questions with the gold
removed; the left-out set's questions appear nowhere in training. The quick model reads the cheap inputs, the
full model adds the sentence evidence. Thresholds come from those training sets: refuse_below (each model) the
lowest FR_QUANTILE-quantile of answerable scores over the training sets, answer_at the lowest WEAK_QUANTILE one;
the quick score's open band is [sure_refuse, sure_answer): below the lowest SURE_REFUSE_QUANTILE-quantile of
answerable quick scores a question is refused without the sentence evidence, at or above the highest
SURE_ANSWER_QUANTILE-quantile of a training KB's negatives it is answered without it. The left-out set's
knowledge base is then scored by gate.decide itself: false refusals and weak share of its answerable questions,
refusals of out-of-KB questions (those whose answer string stands in this KB's top-6 are not counted as
negatives), refusals of its gold-removed questions, and how many questions needed the sentence evidence.
Last, the same fit on all sets gives the shipped model and the calibrated hard floor min_similarity for the
embedding model the dumps were made with (printed; `python -m tools.eval.calibrate` runs this fit and writes both into
that model's calibration profile).

    python -m tools.eval.calibrate_gate --dumps GATE_DIR --by-family [--json OUT]

leaves out a whole FAMILY instead (tools/eval/devsets.FAMILIES: encyclopedic, web search, formal documents): both
models, the thresholds and the open band are fitted on the rows of the other families' knowledge bases whose
questions come from those families too, and every set of the left-out family is scored as above. The formal
family's dump (`regulations`, tools/eval/gate_dataset.py) brings same-domain unanswerable questions instead of
gold-removed ones and everyday off-topic questions as its out-of-KB ones. The packaged e5 profile's gate is scored
on the same rows for comparison (at min_similarity 0 as the left-out fits, and at the profile's floor).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from pipeline.retrieval.gate import INPUTS, REFUSE, WEAK, GateModel, decide, gate_inputs, quick_inputs
from pipeline.retrieval.gate_background import Background, summarize
from pipeline.retrieval.gate_features import GateFeatures
from tools.eval.cli import command_parser, print_md_table, write_json
from tools.eval.devsets import family_of

FR_QUANTILE = 0.025    # refuse below the 2.5% quantile of answerable scores (the lowest over training sets)
WEAK_QUANTILE = 0.08   # weak below the 8% quantile
FLOOR_QUANTILE = 0.002  # hard floor: under the 0.2% quantile of answerable cosines of every set
SURE_REFUSE_QUANTILE = 0.005  # quick score below the lowest 0.5% quantile of answerable ones: refuse at once
SURE_ANSWER_QUANTILE = 0.99   # at/above the highest 99% quantile of a training KB's negatives: answer at once
L2 = 1e-2


def load(dumps: Path) -> tuple[list[dict], dict[str, Background]]:
    rows = [json.loads(line) for f in sorted(Path(dumps).glob("*.jsonl")) for line in open(f, encoding="utf-8")]
    for r in rows:
        missing = [k for k, fl in GateFeatures.__dataclass_fields__.items()
                   if k not in r["f"] and fl.default is dataclasses.MISSING]
        if missing:
            raise SystemExit(f"{dumps}: dump rows lack {', '.join(missing)} — made by an older tools.eval.gate_dataset; "
                             "run it again")
        if r["f"].get("best_sentence") is None:
            raise SystemExit(f"{dumps}: dump rows lack the sentence evidence (best_sentence) — made by an older "
                             "tools.eval.gate_dataset; run it again")
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


def _logistic(train: list[dict], bg: dict[str, Background], inputs) -> tuple[np.ndarray, float, dict]:
    """Fit one model (each KB and class weighing alike); returns coef, bias and each training KB's scores."""
    x = np.array([inputs(r["feat"], bg[r["kb"]]) for r in train])
    y = np.array([r["kind"] == "answerable" for r in train], dtype=float)
    count = collections.Counter((r["kb"], r["kind"] == "answerable") for r in train)
    w = np.array([1.0 / count[(r["kb"], r["kind"] == "answerable")] for r in train])
    coef, bias = fit_logistic(x, y, w)
    scores: dict = collections.defaultdict(lambda: {"answerable": [], "negative": []})
    for r, s in zip(train, x @ coef + bias):
        scores[r["kb"]]["answerable" if r["kind"] == "answerable" else "negative"].append(float(s))
    return coef, bias, scores


def _lowest(scores: dict, q: float) -> float:
    return min(float(np.quantile(v["answerable"], q)) for v in scores.values())


def fit(train: list[dict], bg: dict[str, Background], fr: float = FR_QUANTILE, weak: float = WEAK_QUANTILE,
        sure_refuse: float = SURE_REFUSE_QUANTILE, sure_answer: float = SURE_ANSWER_QUANTILE) -> GateModel:
    """Both models and their thresholds on `train` (the quantile rules of the module docstring; the keywords let a
    study try other quantiles)."""
    qc, qb, qs = _logistic(train, bg, quick_inputs)
    fc, fb, fs = _logistic(train, bg, gate_inputs)
    refuse, quick_refuse = _lowest(fs, fr), _lowest(qs, fr)
    sure_yes = max(float(np.quantile(v["negative"], sure_answer)) for v in qs.values() if v["negative"])
    return GateModel(coef=tuple(float(c) for c in fc), bias=fb, refuse_below=refuse,
                     answer_at=max(refuse, _lowest(fs, weak)),
                     quick_coef=tuple(float(c) for c in qc), quick_bias=qb, quick_refuse_below=quick_refuse,
                     quick_answer_at=max(quick_refuse, _lowest(qs, weak)),
                     sure_refuse=min(_lowest(qs, sure_refuse), quick_refuse),
                     sure_answer=max(sure_yes, _lowest(qs, weak)))


def score_set(model: GateModel, rows: list[dict], bg: Background, min_similarity: float = 0.0) -> dict:
    """The left-out KB's outcomes as the app decides them (gate.decide; the dumps carry the sentence evidence).
    The regulations set's same-domain unanswerable questions count where the other sets' gold-removed ones do."""
    got = {k: [] for k in ("answerable", "out_of_kb", "gold_removed")}
    for r in rows:
        d = decide(r["feat"], bg, min_similarity, True, model)
        got["gold_removed" if r["kind"] == "unanswerable" else r["kind"]].append((d.outcome, d.stage == "full"))

    def share(kind, *outcomes):
        return _share(np.array([o in outcomes for o, _ in got[kind]]))

    return {
        "answerable": len(got["answerable"]), "false_refusals": share("answerable", REFUSE),
        "weak": share("answerable", WEAK),
        "out_of_kb": len(got["out_of_kb"]), "out_of_kb_refused": share("out_of_kb", REFUSE),
        "out_of_kb_weak": share("out_of_kb", WEAK),
        "gold_removed": len(got["gold_removed"]), "gold_removed_refused": share("gold_removed", REFUSE),
        "gold_removed_weak": share("gold_removed", WEAK),
        "sentence_stage_answerable": _share(np.array([f for _, f in got["answerable"]])),
        "sentence_stage_out_of_kb": _share(np.array([f for _, f in got["out_of_kb"]])),
    }


def _fmt(v) -> str:
    if isinstance(v, str):  # GateModel.similarity ("above" | "z")
        return repr(v)
    return f"({', '.join(f'{c:.4f}' for c in v)})" if isinstance(v, tuple) else f"{v:.4f}"


def _share(mask: np.ndarray) -> float:
    return round(float(mask.mean()), 4) if mask.size else 0.0


def leave_one_set_out(rows: list[dict], bg: dict[str, Background]) -> dict[str, dict]:
    out = {}
    for left in sorted(bg):
        train = [r for r in rows if r["kb"] != left and r["qset"] != left]
        model = fit(train, bg)
        out[left] = score_set(model, [r for r in rows if r["kb"] == left], bg[left]) | {"model": model.__dict__}
    return out




def leave_one_family_out(rows: list[dict], bg: dict[str, Background], fitter=fit) -> dict[str, dict]:
    """Per family present in the dumps: the gate fitted (by `fitter`) on the rows of the other families' KBs whose
    questions are of those families too, and each of its own sets scored under it."""
    out = {}
    for fam in dict.fromkeys(family_of(kb) for kb in sorted(bg)):
        train = [r for r in rows if family_of(r["kb"]) != fam and family_of(r["qset"]) != fam]
        if not {r["kb"] for r in train}:
            continue
        model = fitter(train, bg)
        out[fam] = {"trained_on": sorted({r["kb"] for r in train}), "model": model.__dict__,
                    "sets": {kb: score_set(model, [r for r in rows if r["kb"] == kb], bg[kb])
                             for kb in sorted(bg) if family_of(kb) == fam}}
    return out


def shipped_gate() -> tuple[GateModel, float]:
    """The packaged e5 profile's gate and hard floor (pipeline/calibration)."""
    from pipeline.calibration import profile_for
    from pipeline.models.paths import PACKAGED_MODEL_ID

    profile = profile_for(PACKAGED_MODEL_ID).profile
    return GateModel.from_calibration(profile.gate), profile.floor.min_similarity


def hard_floor(rows: list[dict]) -> float:
    per_kb = collections.defaultdict(list)
    for r in rows:
        if r["kind"] == "answerable":
            per_kb[r["kb"]].append(r["feat"].max_similarity)
    q = min(float(np.quantile(v, FLOOR_QUANTILE)) for v in per_kb.values())
    return float(np.floor(q * 100) / 100)


def print_table(result: dict[str, dict]) -> None:
    print_md_table(["left-out set", "answerable", "false refusals", "weak", "out-of-KB", "out-of-KB refused (weak)",
                    "gold removed (formal: unanswerable)", "those refused (weak) / answered",
                    "sentence stage: answerable / out-of-KB"],
                   [[name, m["answerable"], f"{m['false_refusals']:.1%}", f"{m['weak']:.1%}", m["out_of_kb"],
                     f"{m['out_of_kb_refused']:.1%} ({m['out_of_kb_weak']:.1%})", m["gold_removed"],
                     f"{m['gold_removed_refused']:.1%} ({m['gold_removed_weak']:.1%}) / "
                     f"{1 - m['gold_removed_refused'] - m['gold_removed_weak']:.1%}",
                     f"{m['sentence_stage_answerable']:.0%} / {m['sentence_stage_out_of_kb']:.0%}"]
                    for name, m in result.items()])


def print_by_family(rows: list[dict], bg: dict[str, Background], json_path: Path | None) -> None:
    lofo = leave_one_family_out(rows, bg)
    for fam, r in lofo.items():
        print(f"\nleft-out family {fam} (fitted on {', '.join(r['trained_on'])}):")
        print_table(r["sets"])
    model, floor = shipped_gate()
    shipped = {kb: score_set(model, [r for r in rows if r["kb"] == kb], bg[kb]) for kb in sorted(bg)}
    floored = {kb: score_set(model, [r for r in rows if r["kb"] == kb], bg[kb], floor) for kb in sorted(bg)}
    print("\nthe packaged profile's gate on the same rows (min_similarity 0, as above):")
    print_table(shipped)
    print(f"\nthe packaged profile's gate with its floor (min_similarity {floor:.2f}, as the app):")
    print_table(floored)
    write_json(json_path, {"leave_one_family_out": lofo, "packaged": shipped, "packaged_with_floor": floored})


def main(argv=None) -> int:
    ap = command_parser("tools.eval.calibrate_gate", __doc__)
    ap.add_argument("--dumps", required=True, type=Path, help="folder of tools.eval.gate_dataset outputs")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--by-family", action="store_true", help="leave out a family of sets (devsets.FAMILIES), not a set")
    args = ap.parse_args(argv)
    rows, bg = load(args.dumps)
    if len(bg) < 2:
        ap.error("leave-one-set-out needs the dumps of at least two sets")
    if args.by_family:
        print_by_family(rows, bg, args.json)
        return 0
    result = leave_one_set_out(rows, bg)
    print(f"inputs: {', '.join(INPUTS)}; backgrounds: " +
          ", ".join(f"{k} median {b.sim_median:.4f} sentence median {b.sent_median:.4f}" for k, b in bg.items()))
    print_table(result)
    shipped = fit(rows, bg)
    floor = hard_floor(rows)
    fields = ", ".join(f"{k}={_fmt(v)}" for k, v in dataclasses.asdict(shipped).items())
    print(f"\nall sets → GateModel({fields})  (python -m tools.eval.calibrate writes it into the profile)")
    print(f"hard floor (min_similarity) for this embedding model: {floor:.2f}")
    print("\nshipped model on each set (in-sample):")
    print_table({k: score_set(shipped, [r for r in rows if r["kb"] == k], bg[k]) for k in sorted(bg)})
    if args.json:
        args.json.write_text(json.dumps({"leave_one_set_out": result, "shipped": shipped.__dict__,
                                         "min_similarity": floor}, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
