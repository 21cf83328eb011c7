"""The α-robustness variants tried against the shipped fusion (issue 13, second pass), leave-one-set-out.

    python -m tools.fusion_variants --dump-dir DIR [--gate-dir DIR] [--json OUT]

Each variant changes one thing of the shipped procedure (tools.fusion_cv: convex min-max, logistic α over eight
features, coordinate search on ½(ΔMRR@10 + ΔHit@1) vs each training set's better route) and is scored on every
left-out set by a fit on the other sets only. None of them was kept (docs/retrieval-eval.md); this file exists so
the table there can be re-run. Variants:

  nocos5      drop the three features on the e5 cosine scale (cos1, dense_margin, dense_spread)
  scalefree8  replace them by affine-invariant ones: (c1 − c2)/(c1 − c10), z of c1 and of BM25's top score
              within the route's own list
  kbrel8      cos1 measured against the knowledge base's own background (median / MAD of the gate's probe
              questions in that KB, pipeline/retrieval/gate_background.py): (cos1 − median) / scale
  smooth.05   expected-gain objective, σ = 0.05 in α (fusion_cv.set_gain smooth)
  smooth.1    the same, σ = 0.1
  oraclereg   a convex fit instead of the search: weighted logistic regression of each training question's best α
              (median of its optimal grid α; weight = how much its utility varies over α; each set weighs 1)
  bag8        bagging: the logits of 8 fits on bootstrap resamples of the training questions, averaged
  topk        normalisation anchored on each route's own top 10: (x − x₍₁₀₎)/(x₍₁₎ − x₍₁₀₎), auto α
  bgnorm      a label-free floor per route instead of the union's minimum: BM25 / its max, and
              (cosine − m) / (max cosine − m) with m = the KB's probe-background median cosine (the cosine an
              unrelated question gets in this KB), auto α
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from pipeline.retrieval.fusion import AUTO_FEATURES, NORMS
from tools import fusion_cv as cv

SETS = ["cmrc_dev_news", "cmrc_trial", "xquad_zh", "dureader_dev", "dureader_train"]
NO_COS = ["bm25_ratio", "coverage", "agree3", "agree10", "qlen"]


def add_scale_free(q: cv.Q) -> None:
    v, b = np.isfinite(q.rv), np.isfinite(q.rb)
    c, s = q.sc[v][np.argsort(q.rv[v])], q.sb[b][np.argsort(q.rb[b])]
    if len(c) < 2 or len(s) < 2:
        return
    q.f["dense_gap"] = float((c[0] - c[1]) / max(c[0] - c[min(9, len(c) - 1)], 1e-9))
    q.f["dense_z1"] = float((c[0] - c.mean()) / max(c.std(), 1e-9))
    q.f["bm25_z1"] = float((s[0] - s.mean()) / max(s.std(), 1e-9))


def add_kb_relative(qs: list[cv.Q], gate_dump: Path) -> None:
    bg = kb_background(gate_dump)
    for q in qs:
        if q.f:
            q.f["cos1_kb"] = (q.f["cos1"] - bg.sim_median) / bg.sim_scale


def topk_norm(x: np.ndarray, k: int = 10) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    s = np.sort(x)[::-1]
    hi, lo = s[0], s[min(k, len(s)) - 1]
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def maxnorm(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    hi = float(x.max())
    return x / hi if hi > 0 else np.zeros_like(x)


def kb_background(gate_dump: Path):
    from pipeline.retrieval.gate_background import summarize
    from pipeline.retrieval.gate_features import GateFeatures

    keys = GateFeatures.__dataclass_fields__
    return summarize([GateFeatures(**{k: v for k, v in r["f"].items() if k in keys})
                      for r in map(json.loads, open(gate_dump, encoding="utf-8")) if r["kind"] == "probe"])


def shifted_by_background(qs: list[cv.Q], median: float) -> list[cv.Q]:
    return [cv.Q(q.ids, q.rb, q.rv, q.sb, q.sc - median, q.hit, q.f) for q in qs]


def oracle_targets(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = 0.5 * (np.where(r <= cv.K, 1.0 / r, 0.0) + (r <= 1))
    best = u.max(axis=1)
    t = np.array([np.median(cv.ALPHAS[row == b]) for row, b in zip(u, best)])
    return t, best - u.min(axis=1)


def weighted_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = 1e-2) -> dict:
    mu, sd = x.mean(0), x.std(0) + 1e-9
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    beta = np.zeros(z.shape[1])
    reg = l2 * np.r_[np.ones(z.shape[1] - 1), 0.0]
    for _ in range(100):
        p = 1 / (1 + np.exp(-z @ beta))
        step = np.linalg.solve((z * (w * p * (1 - p))[:, None]).T @ z + np.diag(reg + 1e-9),
                               z.T @ (w * (p - y)) + reg * beta)
        beta -= step
        if np.abs(step).max() < 1e-9:
            break
    coef = beta[:-1] / sd
    return {"coefs": coef, "bias": float(beta[-1] - (coef * mu).sum())}


def alphas_of(variant: str, held: str, data: dict, grids: dict) -> np.ndarray:
    """The α each question of `held` gets from the variant fitted on the other sets."""
    train = {s: grids[s] for s in data if s != held}
    names = {"nocos5": NO_COS, "scalefree8": NO_COS + ["dense_gap", "dense_z1", "bm25_z1"],
             "kbrel8": [n if n != "cos1" else "cos1_kb" for n in AUTO_FEATURES]}.get(variant, AUTO_FEATURES)
    if variant in ("nocos5", "scalefree8", "kbrel8", "topk"):
        return cv.fit("convex_auto", train, data, "topk" if variant == "topk" else "minmax", names).alphas(data[held])
    if variant.startswith("smooth"):
        return cv.fit("convex_auto", train, data, "minmax", smooth=float(variant[6:])).alphas(data[held])
    if variant == "oraclereg":
        parts = [(cv.feature_matrix(data[s], names), *oracle_targets(r)) for s, r in train.items()]
        fit = weighted_logistic(np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                np.concatenate([p[2] / p[2].sum() for p in parts]))
        m = cv.Fitted("oraclereg", coefs={**dict(zip(names, fit["coefs"])), "bias": fit["bias"]})
        return m.alphas(data[held])
    if variant == "bag8":
        rng = np.random.default_rng(0)
        logits = []
        for _ in range(8):
            idx = {s: rng.integers(0, len(data[s]), len(data[s])) for s in train}
            m = cv.fit("convex_auto", {s: train[s][idx[s]] for s in train},
                       {s: [data[s][i] for i in idx[s]] for s in train}, "minmax")
            a = np.clip(m.alphas(data[held]), 1e-9, 1 - 1e-9)
            logits.append(np.log(a / (1 - a)))
        return 1 / (1 + np.exp(-np.mean(logits, axis=0)))
    raise ValueError(variant)


VARIANTS = ["shipped", "nocos5", "scalefree8", "kbrel8", "smooth0.05", "smooth0.1", "oraclereg", "bag8", "topk",
            "bgnorm"]


def run(data: dict, variants: list[str], data_bg: dict | None = None) -> dict:
    """data_bg: the same questions with cosines shifted by their KB's background median (bgnorm)."""
    NORMS.setdefault("topk", topk_norm)  # study-only normalisations (the engine has minmax / zscore)
    NORMS.setdefault("maxnorm", maxnorm)
    grids = {n: cv.prepare(data, n) for n in ("minmax", "topk")}
    if data_bg is not None:
        grids["maxnorm"] = cv.prepare(data_bg, "maxnorm")
    out = {}
    for v in variants:
        out[v] = {}
        for held in data:
            norm = {"topk": "topk", "bgnorm": "maxnorm"}.get(v, "minmax")
            if v == "bgnorm":
                a = cv.fit("convex_auto", {s: grids[norm][s] for s in data if s != held}, data_bg,
                           norm).alphas(data_bg[held])
            elif v == "shipped":
                a = cv.fit("convex_auto", {s: grids[norm][s] for s in data if s != held}, data, norm).alphas(data[held])
            else:
                a = alphas_of(v, held, data, grids[norm])
            qs = data_bg[held] if v == "bgnorm" else data[held]
            ones = [np.ones(len(q.ids), dtype=bool) for q in qs]
            ranks = [cv.first_hit_rank(x * cv.normed(q.sb, m, norm) + (1 - x) * cv.normed(q.sc, m, norm), q)
                     for q, x, m in zip(qs, a, ones)]
            r = cv.summarize(ranks)
            best = cv.best_route(data[held])
            out[v][held] = {**r, "d_mrr": round(r["mrr@10"] - best[0], 4), "d_hit1": round(r["hit@1"] - best[1], 4),
                            "mean_alpha": round(float(np.mean(a)), 3)}
        out[v]["average"] = {k: round(float(np.mean([out[v][s][k] for s in data])), 4) for k in ("mrr@10", "hit@1")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fusion_variants", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump-dir", required=True)
    ap.add_argument("--gate-dir", default=None, help="gate dumps with probe rows (needed by kbrel8, bgnorm)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    data = {s: cv.load_dump(Path(args.dump_dir) / f"{s}.jsonl") for s in SETS}
    variants = args.variants.split(",")
    for s, qs in data.items():
        for q in qs:
            if q.f:
                add_scale_free(q)
        if "kbrel8" in variants:
            add_kb_relative(qs, Path(args.gate_dir) / f"{s}.jsonl")
    data_bg = ({s: shifted_by_background(qs, kb_background(Path(args.gate_dir) / f"{s}.jsonl").sim_median)
                for s, qs in data.items()} if "bgnorm" in variants else None)
    res = run(data, variants, data_bg)
    print("| variant | " + " | ".join(SETS) + " | average |\n|---|" + "---|" * (len(SETS) + 1))
    for v, r in res.items():
        cells = [f"{r[s]['mrr@10']:.4f} ({r[s]['d_mrr']:+.4f}) / {r[s]['hit@1']:.4f} ({r[s]['d_hit1']:+.4f})"
                 for s in SETS]
        print(f"| {v} | " + " | ".join(cells) + f" | {r['average']['mrr@10']:.4f} / {r['average']['hit@1']:.4f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
