"""Leave-one-set-out study of fusion functions over full-information candidate dumps (`evaluate --dump`).

Every dump row holds, for one question, each chunk of the union of both routes' lists with its BM25 rank and
score, vector rank and cosine, and whether it is a hit; plus the per-query features of fusion.query_features.
From these, any fusion is re-scored in milliseconds, so whatever a fusion fits (a weight, a few logistic
coefficients) is fitted on all sets but one and scored on the left-out set, for every set in turn.

The arithmetic is fusion.py's (minmax, convex_scores, rrf_scores, auto_weight, chunk_id tie-break), in
vectorised form; tests/test_fusion.py checks that both agree on a dump.

Fitting objective: the mean over the training sets of each set's MRR@10 (every set counts the same, however
many questions it has).

The fragment prior (fusion.length_prior, β and cap) is fitted after the α model, on the same training sets: the
α logistic is fitted without it, then the (cap, β) of PRIOR_GRID that gains most on the training sets with that α
model is kept — so in the leave-one-set-out tables the left-out set never takes part in choosing β either.
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.models.paths import PACKAGED_MODEL_ID
from pipeline.retrieval.fusion import AUTO_FEATURES, NORMS, length_prior, query_features
from tools.eval.cli import command_parser, write_json
from tools.eval.devsets import FAMILIES, family_of

K = 10
ALPHAS = np.round(np.linspace(0.0, 1.0, 21), 2)  # grid of BM25 shares α
# (cap in characters, β) pairs the fragment prior is chosen from; (0, 0): no prior
PRIOR_GRID = [(0, 0.0)] + [(cap, beta) for cap in (100, 200, 400) for beta in (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)]
NO_PRIOR = (0, 0.0)


@dataclass
class Q:
    ids: np.ndarray  # int64 chunk ids (tie-break)
    rb: np.ndarray   # BM25 rank (inf: not in BM25's list)
    rv: np.ndarray   # vector rank
    sb: np.ndarray   # BM25 score (real, for every candidate)
    sc: np.ndarray   # cosine (real, for every candidate)
    hit: np.ndarray  # bool
    f: dict = field(default_factory=dict)
    ln: np.ndarray | None = None  # fragment length per candidate (fusion.fragment_length; inf: verified entry)

    def prior(self, cap: int, beta: float) -> np.ndarray | None:
        return None if beta <= 0 or self.ln is None else length_prior(self.ln, beta, cap)


def length_field(x: float) -> int | None:
    """A fragment length as written in a dump: an int, or None for a verified entry (unbounded)."""
    return None if math.isinf(x) else int(x)


def dump_length(r: list) -> float:
    """A candidate's fragment length from a dump row; a dump from before the length prior is refused."""
    if len(r) < 7:
        raise ValueError("this dump was written before the length prior (no chunk lengths): re-dump it "
                         "(`python -m tools.eval.evaluate --cv` re-dumps when --dump-dir holds no dumps)")
    return math.inf if r[6] is None else float(r[6])


def row_features(row: dict) -> dict[str, float]:
    """fusion.query_features from a dump row — the very function the engine calls, on the same numbers."""
    c = row["cands"]
    if not c or row.get("features") is None or "coverage" not in row["features"]:
        return {}
    b = sorted((r for r in c if r[1] is not None), key=lambda r: r[1])[:10]
    v = sorted((r for r in c if r[2] is not None), key=lambda r: r[2])[:10]
    if not b or not v:
        return {}
    return query_features([r[3] for r in b], [r[4] for r in v], [r[0] for r in b], [r[0] for r in v],
                          row["features"]["coverage"], len(row["q"])) | {
        "visible": float(row["features"].get("visible", 1.0))}  # a dump from before it: all words visible


def load_dump(path: Path) -> list[Q]:
    out = []
    inf = float("inf")
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            c = row["cands"]
            out.append(Q(np.array([int(r[0]) for r in c], dtype=np.int64),
                         np.array([inf if r[1] is None else r[1] for r in c], dtype=np.float64),
                         np.array([inf if r[2] is None else r[2] for r in c], dtype=np.float64),
                         np.array([r[3] for r in c], dtype=np.float64),
                         np.array([0.0 if r[4] is None else r[4] for r in c], dtype=np.float64),
                         np.array([bool(r[5]) for r in c], dtype=bool), row_features(row),
                         np.array([dump_length(r) for r in c], dtype=np.float64)))
    return out


# ------------------------------------------------------------------------------------------ ranking metrics
def first_hit_rank(scores: np.ndarray, q: Q, mask: np.ndarray | None = None) -> float:
    """1-based rank of the best-placed hit when candidates are sorted by score desc, chunk_id asc; inf if none."""
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
        hits = q.hit & mask
    else:
        hits = q.hit
    if not hits.any():
        return math.inf
    hs = scores[hits]
    best = hs.max()
    best_id = q.ids[hits][hs == best].min()
    ahead = (scores > best) | ((scores == best) & (q.ids < best_id))
    if mask is not None:
        ahead &= mask
    return float(ahead.sum() + 1)


def summarize(ranks: list[float]) -> dict:
    r = np.asarray(ranks, dtype=np.float64)
    n = max(len(r), 1)
    return {"mrr@10": round(float(np.where(r <= K, 1.0 / r, 0.0).sum() / n), 4),
            "hit@1": round(float((r <= 1).sum() / n), 4), "hit@5": round(float((r <= 5).sum() / n), 4)}


# ------------------------------------------------------------------------------------------ score functions
def union_mask(q: Q, depth: int | None) -> np.ndarray:
    """Candidates within `depth` of either route's list (None: all of them, as the engine fuses)."""
    if depth is None:
        return np.ones(len(q.ids), dtype=bool)
    return (q.rb <= depth) | (q.rv <= depth)


def normed(x: np.ndarray, mask: np.ndarray, norm: str) -> np.ndarray:
    """fusion.NORMS[norm] over the masked candidates (the others are left out of the ranking anyway)."""
    out = np.zeros_like(x)
    if mask.any():
        out[mask] = NORMS[norm](x[mask])
    return out


def rrf_rank(q: Q, k: int = 60) -> float:
    s = np.where(np.isfinite(q.rb), 1.0 / (k + q.rb), 0.0) + np.where(np.isfinite(q.rv), 1.0 / (k + q.rv), 0.0)
    return first_hit_rank(s, q)


def adaptive_rrf_rank(q: Q, slope: float, floor: float, k: int = 60) -> float:
    """The adaptive RRF of fusion.fuse (slope and floor: the calibration profile's fusion.adaptive_rrf)."""
    listed = np.isfinite(q.rb)
    top = q.sb[listed][np.argsort(q.rb[listed])][:2]  # the scores of BM25's rank 1 and 2, as fusion.fuse
    w = 1.0 if len(top) < 2 or top[1] <= 0 else min(1.0, max(floor, (top[0] / top[1] - 1.0) * slope))
    s = np.where(np.isfinite(q.rb), w / (k + q.rb), 0.0) + np.where(np.isfinite(q.rv), 1.0 / (k + q.rv), 0.0)
    return first_hit_rank(s, q)


def route_rank(q: Q, ranks: np.ndarray) -> float:
    r = ranks[q.hit]
    return float(r.min()) if r.size else math.inf


def oracle_rank(q: Q) -> float:
    return 1.0 if (q.hit & union_mask(q, K)).any() else math.inf


def alpha_grid_rr(q: Q, norm: str, depth: int | None, prior: tuple[int, float] = NO_PRIOR) -> np.ndarray:
    """First-hit rank of the convex fusion (plus the fragment prior `prior` = (cap, β)) at every α of ALPHAS."""
    m = union_mask(q, depth)
    nb, nc = normed(q.sb, m, norm), normed(q.sc, m, norm)
    pr = q.prior(*prior)
    base = 0.0 if pr is None else pr
    return np.array([first_hit_rank(a * nb + (1 - a) * nc + base, q, m) for a in ALPHAS])


# ------------------------------------------------------------------------------------------ weight models
def feature_matrix(qs: list[Q], names: list[str]) -> np.ndarray:
    return np.array([[q.f.get(n, 0.0) for n in names] for q in qs], dtype=np.float64)


@dataclass
class Fitted:
    name: str
    alpha_const: float | None = None
    coefs: dict[str, float] | None = None  # raw-feature logistic coefficients incl. "bias"
    norm: str = "minmax"
    depth: int | None = None
    prior: tuple[int, float] = NO_PRIOR  # the fragment prior (cap, β)

    def alphas(self, qs: list[Q]) -> np.ndarray:
        """Each question's α as the engine computes it: a constant, or the α model times the question's visible
        share (fusion.fuse)."""
        if self.coefs is None:
            return np.full(len(qs), float(self.alpha_const))
        names = [k for k in self.coefs if k != "bias"]
        z = self.coefs["bias"] + feature_matrix(qs, names) @ np.array([self.coefs[n] for n in names])
        return visible(qs) / (1.0 + np.exp(-np.clip(z, -50, 50)))


def visible(qs: list[Q]) -> np.ndarray:
    """Per question, the share of its words the keyword route can see (fusion.fuse scales the auto α by it)."""
    return np.array([q.f.get("visible", 1.0) for q in qs], dtype=np.float64)


def set_weights(names, weigh: str = "sets") -> dict[str, float]:
    """How much each training set counts in a fit: "sets" alike (every fit before session 28; the default), or "families" alike
    (devsets.FAMILIES; the sets of one family share its weight): the large encyclopedic family then stops
    outvoting the others, as the leave-one-family-out protocol treats families as the units. Sums to 1."""
    names = list(names)
    if weigh == "sets":
        return {n: 1.0 / len(names) for n in names}
    if weigh != "families":
        raise ValueError(f"weigh: 'sets' or 'families', not {weigh!r}")
    groups = family_groups(names)
    return {n: 1.0 / (len(groups) * len(sets)) for sets in groups.values() for n in sets}


def fit_constant(train: dict[str, np.ndarray], weights: dict[str, float] | None = None) -> float:
    """The α of the grid with the best weighted mean-over-sets MRR (ties: the one nearest 0.5)."""
    w = weights or set_weights(train)
    per_set = np.array([w[s] * np.where(r <= K, 1.0 / r, 0.0).mean(axis=0) for s, r in train.items()])
    score = per_set.sum(axis=0) - 1e-9 * np.abs(ALPHAS - 0.5)
    return float(ALPHAS[int(np.argmax(score))])


def set_gain(ranks: np.ndarray, alpha: np.ndarray, best: tuple[float, float] | None, guard: float,
             smooth: float = 0.0) -> float:
    """One training set's contribution: MRR@10 at each question's α; with `best` = (MRR@10, Hit@1) of the set's
    better single route, the gain is ½(ΔMRR + ΔHit@1) over that route, and a shortfall counts (1 + guard)×.

    smooth > 0: each question's RR and Hit@1 are the Gaussian-weighted average (σ = smooth, in α) over the grid
    around its α instead of the value at the nearest grid point — the expected gain when the α a question gets
    on an unseen set is off by about σ. It rewards α that sit on a plateau of the question's rank curve rather
    than on a lucky spike, and makes the objective continuous."""
    r = np.where(ranks <= K, 1.0 / ranks, 0.0), (ranks <= 1).astype(np.float64)
    if smooth > 0:
        w = np.exp(-0.5 * ((ALPHAS[None, :] - alpha[:, None]) / smooth) ** 2)
        w /= w.sum(axis=1, keepdims=True)
        mrr, hit1 = float((w * r[0]).sum(axis=1).mean()), float((w * r[1]).sum(axis=1).mean())
    else:
        idx = np.clip(np.rint(alpha * (len(ALPHAS) - 1)).astype(int), 0, len(ALPHAS) - 1)
        rows = np.arange(len(alpha))
        mrr, hit1 = float(r[0][rows, idx].mean()), float(r[1][rows, idx].mean())
    if best is None:
        return mrr
    d = 0.5 * ((mrr - best[0]) + (hit1 - best[1]))
    return d + guard * min(d, 0.0)


def fit_logistic(train_ranks: dict[str, np.ndarray], train_feats: dict[str, np.ndarray], names: list[str],
                 l2: float = 1e-3, seed: int = 0, best: dict[str, tuple[float, float]] | None = None,
                 guard: float = 0.0, restarts: int = 1, smooth: float = 0.0,
                 scale: dict[str, np.ndarray] | None = None,
                 weights: dict[str, float] | None = None) -> dict[str, float]:
    """Coefficients of α = σ(b + Σ c·f) maximising the mean over the training sets of `set_gain`, weighted by
    `weights` (default: sets alike; set_weights), minus a small L2 on standardised coefficients. The objective is
    piecewise constant, so: coordinate search over a shrinking step on standardised features, from the best
    constant α (and `restarts` − 1 seeded random starts around it: they fit the training sets better but did worse
    on the left-out ones, so the default is 1)."""
    allf = np.vstack(list(train_feats.values()))
    mu, sd = allf.mean(axis=0), allf.std(axis=0) + 1e-9
    sets = list(train_ranks)
    zf = {s: (train_feats[s] - mu) / sd for s in sets}
    wt = weights or set_weights(sets)

    def objective(theta: np.ndarray) -> float:
        tot = 0.0
        for s in sets:
            a = 1.0 / (1.0 + np.exp(-np.clip(theta[0] + zf[s] @ theta[1:], -50, 50)))
            if scale is not None:  # the engine's α: the model's times each question's visible share
                a = a * scale[s]
            tot += wt[s] * set_gain(train_ranks[s], a, best.get(s) if best else None, guard, smooth)
        return tot - l2 * float(theta[1:] @ theta[1:])

    a0 = min(max(fit_constant(train_ranks, wt), 0.02), 0.98)
    start = np.zeros(len(names) + 1)
    start[0] = math.log(a0 / (1 - a0))
    rng = np.random.default_rng(seed)
    theta, top = start, objective(start)
    # restarts: the best constant α, then random directions around it (the surface is flat and stepped)
    for r in range(restarts):
        t0 = start if r == 0 else start + rng.normal(0.0, 1.0, len(start)) * np.r_[0.0, np.ones(len(names))]
        t, v = _coordinate_search(objective, t0, rng)
        if v > top + 1e-9:
            theta, top = t, v
    coefs = {n: float(theta[1 + i] / sd[i]) for i, n in enumerate(names)}
    coefs["bias"] = float(theta[0] - sum(theta[1 + i] * mu[i] / sd[i] for i in range(len(names))))
    return coefs


def _coordinate_search(objective: Callable, theta: np.ndarray, rng) -> tuple[np.ndarray, float]:
    best = objective(theta)
    for step in (2.0, 1.0, 0.5, 0.25, 0.12, 0.06):
        improved = True
        while improved:
            improved = False
            for j in rng.permutation(len(theta)):
                for d in (step, -step):
                    t = theta.copy()
                    t[j] += d
                    v = objective(t)
                    if v > best + 1e-9:
                        theta, best, improved = t, v, True
                        break
    return theta, best


def best_route(qs: list[Q]) -> tuple[float, float]:
    """(MRR@10, Hit@1) of the set's better single route (by MRR@10)."""
    b = baselines(qs)
    r = max(("bm25", "vector"), key=lambda k: b[k]["mrr@10"])
    return b[r]["mrr@10"], b[r]["hit@1"]


# ------------------------------------------------------------------------------------------ the protocol
CHOSEN = ("convex_auto", "minmax")  # what the app ships (fusion_mode=convex, auto weight, convex_norm=minmax,
# convex_length_prior): the fragment prior is chosen with it (fit_with_prior); "convex_auto_noprior" is the same
# without the prior (the fusion shipped before it), reported beside it
PACKAGED_E5 = PACKAGED_MODEL_ID
L2 = 1e-3
SMOOTH = 0.0  # σ of the expected-gain objective (set_gain); 0: the value at the nearest grid α


def prepare(data: dict[str, list[Q]], norm: str, depth: int | None = None,
            prior: tuple[int, float] = NO_PRIOR) -> dict[str, np.ndarray]:
    return {s: np.array([alpha_grid_rr(q, norm, depth, prior) for q in qs]) for s, qs in data.items()}


def fit(method: str, ranks: dict[str, np.ndarray], data: dict[str, list[Q]], norm: str,
        names: list[str] = AUTO_FEATURES, smooth: float | None = None,
        prior: tuple[int, float] = NO_PRIOR, weigh: str = "sets") -> Fitted:
    """Fit on the sets in `ranks` (never on a left-out one; ranks made with `prior`; `weigh`: set_weights).
    convex_const: one α; convex_auto: logistic α."""
    weights = set_weights(ranks, weigh)
    if method == "convex_const":
        return Fitted(method, alpha_const=fit_constant(ranks, weights), norm=norm, prior=prior)
    feats = {s: feature_matrix(data[s], names) for s in ranks}
    best = {s: best_route(data[s]) for s in ranks}
    smooth = SMOOTH if smooth is None else smooth
    scale = {s: visible(data[s]) for s in ranks}
    return Fitted(method, coefs=fit_logistic(ranks, feats, names, l2=L2, best=best, smooth=smooth, scale=scale,
                                             weights=weights),
                  norm=norm,
                  prior=prior)


def training_gain(m: Fitted, ranks: dict[str, np.ndarray], data: dict[str, list[Q]],
                  best: dict[str, tuple[float, float]], weigh: str = "sets") -> float:
    """The fit's objective without its L2 term: the weighted mean over the sets in `ranks` of `set_gain` at each
    question's α (`best`: each set's better-route (MRR@10, Hit@1), `best_route`)."""
    w = set_weights(ranks, weigh)
    return float(sum(w[s] * set_gain(ranks[s], m.alphas(data[s]), best[s], 0.0) for s in ranks))


def fit_with_prior(grids: dict[tuple[int, float], dict[str, np.ndarray]], train: list[str],
                   data: dict[str, list[Q]], norm: str, weigh: str = "sets",
                   names: list[str] = AUTO_FEATURES) -> Fitted:
    """convex_auto in two steps on the sets `train`: the α model fitted without the prior (exactly the fit of
    the sessions before it), then the (cap, β) of `grids` whose addition, α model fixed, gains most there (ties:
    the smaller β, then the smaller cap — the grid order). Fitting α jointly with each β was measured too and
    not kept: it moves the α model (up to +0.36 on one novel question) for no gain on the left-out sets."""
    base = fit("convex_auto", {s: grids[NO_PRIOR][s] for s in train}, data, norm, names=names, weigh=weigh)
    routes = {s: best_route(data[s]) for s in train}  # once: it scores every question on both routes
    best, top = base, -math.inf
    for prior, ranks in grids.items():
        m = Fitted(base.name, coefs=base.coefs, norm=norm, prior=prior)
        g = training_gain(m, {s: ranks[s] for s in train}, data, routes, weigh)
        if g > top + 1e-9:
            best, top = m, g
    return best


def fitted_ranks(m: Fitted, qs: list[Q]) -> list[float]:
    """First-hit rank of every question at its own α (not the grid), through the same normalisation and prior."""
    ranks = []
    for q, al in zip(qs, m.alphas(qs)):
        msk = union_mask(q, m.depth)
        s = al * normed(q.sb, msk, m.norm) + (1 - al) * normed(q.sc, msk, m.norm)
        pr = q.prior(*m.prior)
        ranks.append(first_hit_rank(s if pr is None else s + pr, q, msk))
    return ranks


def score_fitted(m: Fitted, qs: list[Q]) -> dict:
    out = summarize(fitted_ranks(m, qs))
    out["mean_alpha"] = round(float(m.alphas(qs).mean()), 3)
    if m.prior[1] > 0:
        out["length_prior"] = {"cap": m.prior[0], "beta": m.prior[1]}
    return out


def paired_bootstrap(a, b, seed: int = 0, boots: int = 2000) -> dict:
    """Mean per-question difference a − b, its standard error and a 95 % percentile interval (paired
    resampling of questions): what is noise on a set of ~100 questions."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), (boots, len(d)))].mean(axis=1)
    return {"diff": round(float(d.mean()), 4), "se": round(float(d.std(ddof=1) / math.sqrt(len(d))), 4),
            "ci95": [round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]}


def versus(ranks: list[float], other: list[float]) -> dict:
    """Paired bootstrap of MRR@10 and Hit@1 differences between two rankings of the same questions."""
    a, b = np.asarray(ranks, dtype=np.float64), np.asarray(other, dtype=np.float64)
    return {"mrr@10": paired_bootstrap(np.where(a <= K, 1.0 / a, 0.0), np.where(b <= K, 1.0 / b, 0.0)),
            "hit@1": paired_bootstrap(a <= 1, b <= 1)}


def baselines(qs: list[Q], adaptive=None) -> dict[str, dict]:
    """The routes, the union oracle, RRF and — given the profile's `adaptive_rrf` (slope, floor) — adaptive RRF."""
    out = {"bm25": summarize([route_rank(q, q.rb) for q in qs]),
           "vector": summarize([route_rank(q, q.rv) for q in qs]),
           "union_oracle": summarize([oracle_rank(q) for q in qs]),
           "rrf": summarize([rrf_rank(q) for q in qs])}
    if adaptive is not None:
        out["adaptive_rrf"] = summarize([adaptive_rrf_rank(q, adaptive.slope, adaptive.floor) for q in qs])
    return out


def prior_grids(data: dict[str, list[Q]], norm: str, grid=None) -> dict[tuple[int, float], dict[str, np.ndarray]]:
    """Every set's α-grid ranks at every (cap, β) of `grid` (PRIOR_GRID; only no prior when a dump lacks lengths)."""
    grid = PRIOR_GRID if grid is None else grid
    return {p: prepare(data, norm, prior=p) for p in grid}


def family_groups(names) -> dict[str, list[str]]:
    """The sets among `names` by family of text (devsets.FAMILIES); a set of no family is a group of its own."""
    groups: dict[str, list[str]] = {fam: [] for fam in FAMILIES}
    for n in names:
        groups.setdefault(family_of(n), []).append(n)
    return {g: sets for g, sets in groups.items() if sets}


def cross_validate(data: dict[str, list[Q]], norms=("minmax", "zscore"),
                   methods=("convex_const", "convex_auto_noprior", "convex_auto"), grid=None, adaptive=None,
                   groups: dict[str, list[str]] | None = None, weigh: str = "sets",
                   names: list[str] = AUTO_FEATURES) -> dict:
    """For each left-out set: the baselines (`adaptive`: the profile's adaptive_rrf, for its row), and every
    (method, norm) fitted on the sets outside its group only. `groups`: the sets left out together (a family of
    text, family_groups); default: each set alone (leave one set out). `names`: the inputs the α model reads."""
    out: dict = {"sets": {}}
    grids = {n: prior_grids(data, n, grid) for n in norms}
    for group, held_sets in (groups or {s: [s] for s in data}).items():
        train = [s for s in data if s not in held_sets]
        fitted = {}
        for norm, by_prior in grids.items():
            for method in methods:
                if method == "convex_auto":
                    fitted[method, norm] = fit_with_prior(by_prior, train, data, norm, weigh, names)
                else:
                    fitted[method, norm] = fit(method.removesuffix("_noprior"),
                                               {s: by_prior[NO_PRIOR][s] for s in train}, data, norm, names=names,
                                               weigh=weigh)
        for held in held_sets:
            out["sets"][held] = _scored(data[held], fitted, adaptive) | ({"left_out_with": group} if groups else {})
    variants = list(next(iter(out["sets"].values()))["routes"])
    out["average"] = {v: {k: round(float(np.mean([r["routes"][v][k] for r in out["sets"].values()])), 4)
                          for k in ("mrr@10", "hit@1", "hit@5")} for v in variants}
    out["chosen"] = "/".join(CHOSEN)
    return out


def _scored(qs: list[Q], fitted: dict, adaptive) -> dict:
    """One left-out set: the baselines and every fitted (method, norm), plus the chosen one's paired bootstrap."""
    res = {"questions": len(qs), "routes": baselines(qs, adaptive), "fitted": {}}
    for (method, norm), m in fitted.items():
        key = f"{method}/{norm}"
        res["routes"][key] = score_fitted(m, qs)
        res["fitted"][key] = {"alpha": m.alpha_const, "coefs": m.coefs,
                              "length_prior": {"cap": m.prior[0], "beta": m.prior[1]}}
    chosen = fitted.get(CHOSEN)
    if chosen is not None:  # noise: paired bootstrap of the chosen fusion against the better route and RRF
        best = max(("bm25", "vector"), key=lambda k: res["routes"][k]["mrr@10"])
        mine = fitted_ranks(chosen, qs)
        res["chosen_vs"] = {best: versus(mine, [route_rank(q, q.rb if best == "bm25" else q.rv) for q in qs]),
                            "rrf": versus(mine, [rrf_rank(q) for q in qs])}
    return res


def fit_all(data: dict[str, list[Q]], embedding_model: str = PACKAGED_E5, weigh: str = "sets",
            names: list[str] = AUTO_FEATURES) -> dict:
    """The shipped weights: the chosen procedure fitted on every set (the LOSO tables estimate how it does on
    sets it has not seen). One coefficient set per normalisation, over every input the engine computes (0 for an
    input outside `names`)."""
    out = {"embedding_model": embedding_model, "features": AUTO_FEATURES, "inputs_read": list(names),
           "fitted_on": sorted(data),
           "about": "alpha = lo + (hi - lo) * sigmoid(bias + sum(c_f * f)); fused += beta * min(1, log(1 + len) / "
                    "log(1 + cap)) (length_prior); tools.eval.fusion_cv.fit_all", "length_prior": {}}
    for norm in ("zscore", "minmax"):
        m = fit_with_prior(prior_grids(data, norm), list(data), data, norm, weigh, names)
        out[norm] = {n: m.coefs.get(n, 0.0) for n in AUTO_FEATURES} | {"bias": m.coefs["bias"]}
        out["length_prior"][norm] = {"cap": m.prior[0], "beta": m.prior[1]}
    return out


def print_cv(result: dict) -> None:
    for held, r in result["sets"].items():
        best = max(("bm25", "vector"), key=lambda k: r["routes"][k]["mrr@10"])
        family = f" with the whole {r['left_out_with']} family" if r.get("left_out_with", held) != held else ""
        print(f"\nleft out: {held}{family} ({r['questions']} questions; best single route: {best})")
        print("| fusion | MRR@10 | Hit@1 | Hit@5 |\n|---|---|---|---|")
        for v, m in r["routes"].items():
            mark = "**" if v == result.get("chosen") else ""
            print(f"| {mark}{v}{mark} | {m['mrr@10']} | {m['hit@1']} | {m['hit@5']} |")
        for other, d in r.get("chosen_vs", {}).items():
            print(f"chosen − {other}, paired bootstrap over questions: " + "; ".join(
                f"{k} {v['diff']:+.4f} (se {v['se']}, 95% [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}])"
                for k, v in d.items()))
    print("\naverage over left-out sets")
    print("| fusion | MRR@10 | Hit@1 | Hit@5 |\n|---|---|---|---|")
    for v, m in result["average"].items():
        print(f"| {v} | {m['mrr@10']} | {m['hit@1']} | {m['hit@5']} |")


def check_features(names) -> list[str]:
    """The α model's inputs as a list; ValueError naming the known ones when one is unknown or none is given."""
    names = list(names)
    unknown = [n for n in names if n not in AUTO_FEATURES]
    if unknown or not names:
        raise ValueError(f"features {', '.join(unknown) or '(none)'}: each one of {', '.join(AUTO_FEATURES)}")
    return names


def parse_features(ap, text: str) -> list[str]:
    """--features as a list of AUTO_FEATURES names (check_features; its error as a usage error)."""
    try:
        return check_features(n for n in text.split(",") if n)
    except ValueError as exc:
        ap.error(f"--{exc}")


def main(argv=None) -> int:
    ap = command_parser("tools.eval.fusion_cv", __doc__)
    ap.add_argument("dumps", nargs="+", help="per-set dump files (set name = file name up to the first dot)")
    ap.add_argument("--write-weights", default=None,
                    help="fit on every set and write that fit as JSON here (a report: the app reads the calibration "
                         "profile, which `python -m tools.eval.calibrate` writes)")
    ap.add_argument("--embedding-model", default=PACKAGED_E5, help="model id the dumps were made with")
    ap.add_argument("--families", action="store_true",
                    help="leave one family of text out (tools/eval/devsets.FAMILIES), not one set")
    ap.add_argument("--weigh", default="sets", choices=("sets", "families"),
                    help="how the training sets count in a fit: alike, or their families alike (set_weights)")
    ap.add_argument("--features", default=",".join(AUTO_FEATURES),
                    help="comma-separated inputs of the α model (default: all of fusion.AUTO_FEATURES)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = parse_features(ap, args.features)
    from pipeline.calibration import profile_for

    data = {Path(p).name.split(".")[0]: load_dump(Path(p)) for p in args.dumps}
    res = cross_validate(data, adaptive=profile_for(args.embedding_model).profile.fusion.adaptive_rrf,
                         groups=family_groups(data) if args.families else None, weigh=args.weigh, names=names)
    print_cv(res)
    if args.write_weights:
        w = fit_all(data, args.embedding_model, args.weigh, names)
        Path(args.write_weights).write_text(json.dumps(w, indent=2) + "\n", encoding="utf-8")
        res["weights"] = w
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
