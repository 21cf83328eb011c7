"""Closing the vocabulary gap offline, measured left out by family (issue 25, item 3): query expansion of the BM25
route — pseudo-relevance feedback (RM3) from the first-pass BM25 or fused ranking, and nearest neighbours of the
question's words in the knowledge base's own vocabulary — re-scored over study packs (tools/eval/prf_pack.py) and
the candidate dumps of today's pipeline (`evaluate --dump`), then the fusion refitted by family on the expanded
BM25 scores (tools/eval/fusion_cv.py's procedure).

    python -m tools.eval.prf_study --packs DIR --dumps DIR [--json OUT] [--family rm3,fused,nb] [--no-refit]
    python -m tools.eval.prf_study --report OUT     (the tables of an earlier run's --json)

Per variant and per set: the BM25 route's MRR@10 / Hit@1 with the expanded query, the union's recall (gold in
BM25 top-k ∪ vector top-k, k = 10 / 50), and the fused ranking left out by family (the α model and fragment prior
fitted on the other two families' expanded dumps — "refit" — and, "kept", the fold's fit on the unexpanded dumps
applied as it is). A variant's parameters are chosen per left-out family on the two
other families (in sample there: the fold's fit scored on its own training sets), the objective being the mean over
the training sets of ½(ΔMRR@10 + ΔHit@1) of the fused ranking against no expansion.
"""
from __future__ import annotations

import argparse
import json
import math
import pickle
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.bm25 import SegmentView
from pipeline.retrieval.bm25_segments import Segment
from pipeline.retrieval.fusion import NORMS, length_prior, query_features
from pipeline.retrieval.lexical import STOPWORDS, content_terms
from tools.eval import fusion_cv
from tools.eval.devsets import FAMILIES, family_of, norm
from tools.eval.fusion_cv import ALPHAS, Fitted, Q, load_dump

K = 10
RECALL = 50
NEAREST = 8  # vocabulary neighbours looked up per question word (the variants keep at most n of them ≥ τ)
K1, B = 1.5, 0.75  # Settings.bm25_k1 / bm25_b (the cached KBs' BM25)
PRIORS = fusion_cv.PRIOR_GRID
_WORD = re.compile(r"\w")
_DIGITS = re.compile(r"^[\d.,%]+$")


def expandable(t: str) -> bool:
    """A token worth adding to a query: a word, not a function word, not a lone ASCII character or a number."""
    return bool(_WORD.search(t)) and t not in STOPWORDS and not (len(t) == 1 and t.isascii()) \
        and not _DIGITS.match(t)


# ------------------------------------------------------------------------------------------ one set
@dataclass
class SetData:
    name: str
    ids: np.ndarray            # chunk ids, ascending = score positions of `view`
    doc: np.ndarray
    index: np.ndarray
    text: list[str]
    tokens: list[list[str]]
    vec: np.ndarray
    view: SegmentView
    questions: list[dict]
    qtokens: list[list[str]]
    base: list[Q]              # the dump's candidates (today's pipeline)
    vlist: list[list[tuple[int, float]]]  # the vector route's top-50 (chunk id, cosine), from the dump
    dump_rows: list[dict]
    _tf: dict = field(default_factory=dict)
    _near: dict = field(default_factory=dict)
    vocab: list = field(default_factory=list)
    vocab_vec: np.ndarray | None = None
    term_vec: dict = field(default_factory=dict)
    _pos: dict = field(default_factory=dict)

    def tf(self, p: int) -> Counter:
        got = self._tf.get(p)
        if got is None:
            got = self._tf[p] = Counter(self.tokens[p])
        return got

    def nearest(self, term: str, k: int) -> list[tuple[str, float]]:
        """The `k` vocabulary terms nearest to `term` (cosine of the e5 term vectors), best first; cached."""
        got = self._near.get(term)
        if got is None:
            vec = self.term_vec.get(term)
            if vec is None:
                got = []
            else:
                sims = self.vocab_vec @ vec
                top = np.argpartition(-sims, k)[:k]
                got = [(self.vocab[i], float(sims[i])) for i in sorted(top.tolist(), key=lambda i: -float(sims[i]))]
            self._near[term] = got
        return got

    def pos(self, cid: int) -> int:
        return self._pos[cid]


def load_set(name: str, packs: Path, dumps: Path, tok: ChineseTokenizer) -> SetData:
    with open(packs / f"{name}.pkl", "rb") as fh:
        p = pickle.load(fh)
    ch = p["chunks"]
    seg = Segment.build(name, zip(ch["ids"].tolist(), ch["tokens"]))
    assert (seg.chunk_ids == ch["ids"]).all()
    view = SegmentView((seg,), (np.ones(seg.size, dtype=bool),), K1, B)
    rows = [json.loads(line) for line in open(dumps / f"{name}.jsonl", encoding="utf-8")]
    qs = p["questions"]
    assert len(rows) == len(qs) and all(r["q"] == q["q"] for r, q in zip(rows, qs)), name
    vlist = [sorted(((int(c[0]), c[4]) for c in r["cands"] if c[2] is not None),
                    key=lambda x: next(c[2] for c in r["cands"] if int(c[0]) == x[0])) for r in rows]
    d = SetData(name, ch["ids"], ch["doc"], ch["index"], ch["text"], ch["tokens"], ch["vec"], view, qs,
                [tok(q["q"]) for q in qs], load_dump(dumps / f"{name}.jsonl"), vlist, rows)
    d._pos = {int(c): i for i, c in enumerate(ch["ids"])}
    return d


def weighted_scores(view: SegmentView, weights: dict[str, float]) -> np.ndarray:
    out = np.zeros(view.size, dtype=np.float64)
    for term, w in weights.items():
        for pos, contrib in view.contributions(term)[1]:
            out[pos] += w * contrib
    return out


def top_positions(scores: np.ndarray, ids: np.ndarray, k: int) -> list[int]:
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    top = sorted(top.tolist(), key=lambda i: (-float(scores[i]), int(ids[i])))
    return [i for i in top if scores[i] > 0]


def is_hit(d: SetData, qi: int, p: int) -> bool:
    q = d.questions[qi]
    if int(d.doc[p]) not in q["gold"]:
        return False
    if not q["answers"]:
        return True
    t = norm(d.text[p]) if q["ws_free"] else d.text[p]
    return any(a in t for a in q["answers"])


def candidates(d: SetData, qi: int, scores: np.ndarray, qv: np.ndarray | None = None) -> tuple[Q, list[int]]:
    """The question's full-information candidates with these BM25 scores: the BM25 top-50 of `scores` ∪ the vector
    route's top-50 of the dump, every one with its expanded BM25 score and its cosine. `qv`: another question vector
    (tools/eval/adapter_study.py) — the vector route re-run with it over every stored vector, and every candidate's
    cosine its product with `qv`. Returns (Q, BM25 top list)."""
    btop = top_positions(scores, d.ids, RECALL)
    base = d.base[qi]
    known = {int(c): i for i, c in enumerate(base.ids)}
    order: list[int] = []
    rb: dict[int, int] = {}
    for r, p in enumerate(btop, 1):
        cid = int(d.ids[p])
        rb[cid] = r
        order.append(cid)
    sims = None if qv is None else d.vec @ qv
    vlist = d.vlist[qi] if sims is None else [(int(d.ids[p]), float(sims[p]))
                                              for p in np.argsort(-sims, kind="stable")[:RECALL]]
    rv = {cid: r for r, (cid, _) in enumerate(vlist, 1)}
    for cid, _ in vlist:
        if cid not in rb:
            order.append(cid)
    qv = d.questions[qi]["vec"] if qv is None else qv
    n = len(order)
    ids = np.array(order, dtype=np.int64)
    sc = np.zeros(n)
    hit = np.zeros(n, dtype=bool)
    ln = np.zeros(n)
    sb = np.zeros(n)
    for i, cid in enumerate(order):
        p = d.pos(cid)
        sb[i] = scores[p]
        j = known.get(cid)
        if j is not None:
            sc[i], hit[i], ln[i] = base.sc[j], base.hit[j], base.ln[j]
        else:
            hit[i] = is_hit(d, qi, p)
            ln[i] = math.inf if int(d.index[p]) > 0 else float(len(d.text[p]))
        if j is None or sims is not None:
            sc[i] = min(1.0, max(0.0, float(d.vec[p] @ qv if sims is None else sims[p])))
    inf = math.inf
    q = Q(ids, np.array([rb.get(c, inf) for c in order], dtype=np.float64),
          np.array([rv.get(c, inf) for c in order], dtype=np.float64), sb, sc, hit, {}, ln)
    # the auto weight's features, as HybridRetriever.features: the question's own tokens for the coverage; the
    # share of them the keyword route can see (the engine scales α by it) is the question's, as the dump has it
    if btop and vlist:
        cov = d.view.coverage(d.qtokens[qi], btop[0])
        v10 = vlist[:10]
        q.f = query_features([scores[p] for p in btop[:10]], [c for _, c in v10],
                             [str(int(d.ids[p])) for p in btop[:10]], [str(c) for c, _ in v10], cov,
                             len(d.questions[qi]["q"])) | {"visible": base.f.get("visible", 1.0)}
    return q, btop


# ------------------------------------------------------------------------------------------ expansions
def original_weights(tokens: list[str]) -> dict[str, float]:
    w: dict[str, float] = {}
    for t in tokens:
        w[t] = w.get(t, 0.0) + 1.0
    return w


def rm3(d: SetData, tokens: list[str], fb: list[tuple[int, float]], n_terms: int, lam: float,
        idf_weighted: bool) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """RM3: the relevance model of the feedback chunks `fb` = [(position, weight)], p(t|R) = Σ_d w_d·tf(t,d)/|d|
    (× idf with `idf_weighted`), its top `n_terms` expandable terms, interpolated with the question's own tokens:
    q' = n·(λ·q/n + (1 − λ)·R/ΣR), n = the question's token count (λ = 1: the question as it is)."""
    orig = original_weights(tokens)
    n = float(len(tokens))
    if not fb or lam >= 1.0 or n == 0:
        return orig, []
    wsum = sum(w for _, w in fb) or 1.0
    rel: dict[str, float] = {}
    for p, w in fb:
        tf = d.tf(p)
        ln = float(sum(tf.values())) or 1.0
        for t, c in tf.items():
            if expandable(t):
                rel[t] = rel.get(t, 0.0) + (w / wsum) * c / ln
    if idf_weighted:
        rel = {t: v * d.view.idf(d.view.doc_freq(t)) for t, v in rel.items()}
    top = sorted(rel.items(), key=lambda x: (-x[1], x[0]))[:n_terms]
    z = sum(v for _, v in top) or 1.0
    out = {t: lam * c for t, c in orig.items()}
    for t, v in top:
        out[t] = out.get(t, 0.0) + (1.0 - lam) * n * v / z
    return out, [(t, round(n * (1.0 - lam) * v / z, 3)) for t, v in top]


@dataclass(frozen=True)
class Variant:
    source: str        # "bm25": feedback from the first-pass BM25 top; "fused": from the first-pass fused top
    docs: int
    terms: int
    lam: float
    idf: bool

    @property
    def key(self) -> str:
        return f"{self.source}/d{self.docs}/t{self.terms}/l{self.lam}/{'idf' if self.idf else 'rm'}"


@dataclass(frozen=True)
class NbVariant:
    """Question words expanded by their nearest neighbours in the knowledge base's vocabulary (e5 term vectors):
    for each content word (`scope` "unseen": only words no chunk holds; "all": every one), the `n` vocabulary
    terms with cosine ≥ `tau`, each weighted `mu` × the word's own weight."""
    scope: str
    tau: float
    n: int
    mu: float
    source: str = "nb"

    @property
    def key(self) -> str:
        return f"nb/{self.scope}/tau{self.tau}/n{self.n}/mu{self.mu}"


def load_terms(d: SetData, packs: Path) -> None:
    path = packs / f"{d.name}.terms.pkl"
    with open(path, "rb") as fh:
        t = pickle.load(fh)
    d.vocab, d.vocab_vec = t["vocab"], t["vocab_vec"]
    d.term_vec = {w: v for w, v in zip(t["vocab"], t["vocab_vec"])} | \
        {w: v for w, v in zip(t["qterms"], t["qterm_vec"])}


def neighbours(d: SetData, tokens: list[str], v: NbVariant) -> tuple[dict[str, float], list]:
    w = original_weights(tokens)
    out = dict(w)
    shown = []
    for t in content_terms(tokens):
        if v.scope == "unseen" and d.view.doc_freq(t) > 0:
            continue
        near = d.nearest(t, NEAREST)
        got = [(term, c) for term, c in near if c >= v.tau and term != t and term not in w][:v.n]
        for term, _ in got:
            out[term] = out.get(term, 0.0) + v.mu * w[t]
        if got:
            shown.append((t, [(x, round(c, 3)) for x, c in got]))
    return out, shown


def fused_order(q: Q, m: Fitted) -> list[int]:
    """Candidate indexes of `q` in the order of the fitted fusion `m` (ties by chunk id), as fusion_cv scores."""
    al = float(m.alphas([q])[0])
    msk = np.ones(len(q.ids), dtype=bool)
    s = al * fusion_cv.normed(q.sb, msk, m.norm) + (1 - al) * fusion_cv.normed(q.sc, msk, m.norm)
    pr = q.prior(*m.prior)
    if pr is not None:
        s = s + pr
    return sorted(range(len(q.ids)), key=lambda i: (-float(s[i]), int(q.ids[i])))


def expand_set(d: SetData, v: Variant | None, first_pass: Fitted | None) -> tuple[list[Q], list[list[int]], list]:
    """Every question of the set with the variant's expanded BM25 query (None: the question as it is)."""
    out, tops, shown = [], [], []
    for qi, toks in enumerate(d.qtokens):
        if v is None:
            w, terms = original_weights(toks), []
        elif v.source == "nb":
            w, terms = neighbours(d, toks, v)
        else:
            if v.source == "bm25":
                s0 = weighted_scores(d.view, original_weights(toks))
                top = top_positions(s0, d.ids, v.docs)
                fb = [(p, float(s0[p])) for p in top]
            else:
                q0 = d.base[qi]
                fb = [(d.pos(int(q0.ids[i])), 1.0) for i in fused_order(q0, first_pass)[:v.docs]]
            w, terms = rm3(d, toks, fb, v.terms, v.lam, v.idf)
        scores = weighted_scores(d.view, w)
        q, btop = candidates(d, qi, scores)
        out.append(q)
        tops.append(btop)
        shown.append(terms)
    return out, tops, shown


# ------------------------------------------------------------------------------------------ scoring
def grid_ranks(q: Q, prior: tuple[int, float]) -> np.ndarray:
    """fusion_cv.alpha_grid_rr (depth None), vectorised over the α grid."""
    nb, nc = NORMS["minmax"](q.sb), NORMS["minmax"](q.sc)
    base = 0.0 if prior[1] <= 0 or q.ln is None else length_prior(q.ln, prior[1], prior[0])
    s = ALPHAS[:, None] * nb[None, :] + (1 - ALPHAS)[:, None] * nc[None, :] + base
    if not q.hit.any():
        return np.full(len(ALPHAS), math.inf)
    hs = np.where(q.hit[None, :], s, -np.inf)
    best = hs.max(axis=1)
    at_best = q.hit[None, :] & (s == best[:, None])
    best_id = np.where(at_best, q.ids[None, :], np.iinfo(np.int64).max).min(axis=1)
    ahead = (s > best[:, None]) | ((s == best[:, None]) & (q.ids[None, :] < best_id[:, None]))
    return ahead.sum(axis=1).astype(np.float64) + 1


def grids(data: dict[str, list[Q]]) -> dict:
    return {p: {s: np.array([grid_ranks(q, p) for q in qs]) for s, qs in data.items()} for p in PRIORS}


def rr(ranks) -> tuple[float, float]:
    r = np.asarray(ranks, dtype=np.float64)
    return float(np.where(r <= K, 1.0 / r, 0.0).mean()), float((r <= 1).mean())


def route_metrics(qs: list[Q]) -> dict:
    b = rr([fusion_cv.route_rank(q, q.rb) for q in qs])
    u10 = float(np.mean([(q.hit & ((q.rb <= 10) | (q.rv <= 10))).any() for q in qs]))
    u50 = float(np.mean([(q.hit & ((q.rb <= 50) | (q.rv <= 50))).any() for q in qs]))
    b50 = float(np.mean([(q.hit & (q.rb <= 50)).any() for q in qs]))
    return {"bm25_mrr": b[0], "bm25_h1": b[1], "union10": u10, "union50": u50, "bm25_r50": b50}


def by_family(data: dict[str, list[Q]], only: str | None = None) -> dict:
    """For each family left out: the fusion fitted on the other two (fusion_cv.fit_with_prior on the prior grid
    PRIORS), scored on every set (left-out sets: out of sample; training sets: in sample, for choosing)."""
    g = grids(data)
    out = {}
    for fam, held in FAMILIES.items():
        if only is not None and fam != only:
            continue
        train = [s for s in data if s not in held]
        m = fusion_cv.fit_with_prior(g, train, data, "minmax")
        out[fam] = {"fit": m, "scores": {s: rr(fusion_cv.fitted_ranks(m, qs)) for s, qs in data.items()}}
    return out


def kept_alpha(data: dict[str, list[Q]], fits: dict[str, Fitted]) -> dict:
    """Each fold's fusion fitted on the *unexpanded* dumps of its training families, applied as it is to the
    expanded candidates: the expansion's own effect, without the noise of a refit."""
    return {fam: {"fit": m, "scores": {s: rr(fusion_cv.fitted_ranks(m, qs)) for s, qs in data.items()}}
            for fam, m in fits.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.eval.prf_study", description=__doc__)
    ap.add_argument("--packs", default=None)
    ap.add_argument("--dumps", default=None)
    ap.add_argument("--sets", default="xquad_zh,cmrc_trial,cmrc_dev_news,dureader_dev,dureader_train,regulations")
    ap.add_argument("--json", default=None)
    ap.add_argument("--check", action="store_true", help="only check the rebuilt baseline against the dumps")
    ap.add_argument("--no-refit", action="store_true",
                    help="score only with each fold's fusion fitted on the unexpanded dumps (no refit)")
    ap.add_argument("--family", default="rm3,fused,nb", help="which variant families to run: rm3, fused, nb")
    ap.add_argument("--report", default=None, help="print the tables of an earlier run's --json (no re-scoring)")
    args = ap.parse_args(argv)
    if args.report:
        got = json.loads(Path(args.report).read_text(encoding="utf-8"))
        report(got["results"], args.sets.split(","), got["shown"], None)
        return 0
    tok = ChineseTokenizer()
    t0 = time.perf_counter()
    sets = {n: load_set(n, Path(args.packs), Path(args.dumps), tok) for n in args.sets.split(",")}
    print(f"# loaded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    base = {n: expand_set(d, None, None)[0] for n, d in sets.items()}
    for n, d in sets.items():  # the rebuilt baseline must be the dump's
        same_rb = np.mean([set(zip(a.ids[np.isfinite(a.rb)].tolist(), a.rb[np.isfinite(a.rb)].tolist())) ==
                           set(zip(b.ids[np.isfinite(b.rb)].tolist(), b.rb[np.isfinite(b.rb)].tolist()))
                           for a, b in zip(base[n], d.base)])
        print(f"# {n}: BM25 list as in the dump for {same_rb:.4f} of questions; route {route_metrics(base[n])}; "
              f"dump {route_metrics(d.base)}", file=sys.stderr)
    if args.check:
        return 0
    none_cv = by_family(base)
    first = {fam: r["fit"] for fam, r in none_cv.items()}
    results = {"none": {"routes": {n: route_metrics(qs) for n, qs in base.items()}, "cv": none_cv,
                        "kept": none_cv}}
    variants: list = []
    fams = args.family.split(",")
    if "nb" in fams:
        for d in sets.values():
            load_terms(d, Path(args.packs))
        for scope in ("unseen", "all"):
            for tau in (0.90, 0.92, 0.94):
                for mu in (0.3, 0.6):
                    variants.append(NbVariant(scope, tau, 3, mu))
    for source in [s for s, f in (("bm25", "rm3"), ("fused", "fused")) if f in fams]:
        for docs in (3, 10):
            for terms in (10, 30):
                for lam in (0.5, 0.7):
                    for idf in (False, True):
                        variants.append(Variant(source, docs, terms, lam, idf))
    shown_examples = {}
    for v in variants:
        t1 = time.perf_counter()
        res = {"routes": {}, "cv": {}, "kept": {}}
        # the fused first pass of a fold is the baseline fusion fitted without that fold's family; every set is
        # expanded with it for that fold's fit (so no gold of the left-out family enters its expansions or its fit)
        for fam in FAMILIES:
            if v.source in ("bm25", "nb"):  # one expansion for every fold: it reads no fitted number
                data = {}
                for n, d in sets.items():
                    qs, _, shown = expand_set(d, v, None)
                    data[n] = qs
                    if n == "regulations":
                        shown_examples[v.key] = shown
                res["routes"] = {n: route_metrics(qs) for n, qs in data.items()}
                res["kept"] = kept_alpha(data, first)
                res["cv"] = res["kept"] if args.no_refit else by_family(data)
                break
            data = {}
            for n, d in sets.items():
                qs, _, shown = expand_set(d, v, first[fam])
                data[n] = qs
                if n in FAMILIES[fam]:
                    res["routes"][n] = route_metrics(qs)
                if n == "regulations" and fam == "formal":
                    shown_examples[v.key] = shown
            res["kept"][fam] = kept_alpha(data, {fam: first[fam]})[fam]
            res["cv"][fam] = res["kept"][fam] if args.no_refit else by_family(data, only=fam)[fam]
        results[v.key] = res
        print(f"# {v.key}: {time.perf_counter() - t1:.0f} s; " + "; ".join(
            f"{n} bm25 {r['bm25_mrr']:.4f} u10 {r['union10']:.3f} fused(lo) "
            f"{res['cv'][family_of(n)]['scores'][n][0]:.4f}/{res['cv'][family_of(n)]['scores'][n][1]:.4f} kept "
            f"{res['kept'][family_of(n)]['scores'][n][0]:.4f}/{res['kept'][family_of(n)]['scores'][n][1]:.4f}"
            for n, r in res["routes"].items()), file=sys.stderr)
    report(plain(results), list(sets), shown_examples, args.json)
    return 0


def gain(res: dict, none: dict, fam: str, sets: list[str], mode: str) -> float:
    """Mean over the sets of ½(ΔMRR@10 + ΔHit@1) of the fold `fam`'s fused ranking against no expansion
    (`mode` "cv": the fusion refitted on the expanded dumps; "kept": the fold's unexpanded fit)."""
    return float(np.mean([0.5 * ((res[mode][fam]["scores"][s][0] - none[mode][fam]["scores"][s][0]) +
                                 (res[mode][fam]["scores"][s][1] - none[mode][fam]["scores"][s][1])) for s in sets]))


def plain(results: dict) -> dict:
    return {k: {"routes": r["routes"],
                **{mode: {f: {"scores": c["scores"], "coefs": c["fit"].coefs, "prior": list(c["fit"].prior)}
                          for f, c in r[mode].items()} for mode in ("cv", "kept")}}
            for k, r in results.items()}


def report(results: dict, sets: list[str], shown: dict, json_out: str | None) -> None:
    """`results`: variant → {"routes", "cv", "kept"} as `plain` writes them."""
    none = results["none"]
    keys = [k for k in results if k != "none"]
    print("\n## every variant, condensed: regulations (formal) BM25 route MRR@10 / Hit@1 · union top-10 / top-50 · "
          "fused left out refitted · kept; the other families' worst set ΔMRR@10 / ΔHit@1 of the fused ranking "
          "left out (points; refitted · kept)")
    print("| variant | formal BM25 | formal union | formal fused refit | formal fused kept | encyclopedic worst Δ "
          "refit · kept | web worst Δ refit · kept |\n|---|---|---|---|---|---|---|")

    def worst(k: str, fam: str, mode: str) -> str:
        d = [(100 * (results[k][mode][fam]["scores"][s][0] - none[mode][fam]["scores"][s][0]),
              100 * (results[k][mode][fam]["scores"][s][1] - none[mode][fam]["scores"][s][1]))
             for s in FAMILIES[fam] if s in sets]
        return f"{min(x for x, _ in d):+.2f} / {min(y for _, y in d):+.2f}"

    for k in ["none", *keys]:
        r = results[k]
        if "regulations" in sets:
            ro = r["routes"]["regulations"]
            f, g = r["cv"]["formal"]["scores"]["regulations"], r["kept"]["formal"]["scores"]["regulations"]
            cells = [f"{ro['bm25_mrr']:.4f} / {ro['bm25_h1']:.4f}", f"{ro['union10']:.3f} / {ro['union50']:.3f}",
                     f"{f[0]:.4f} / {f[1]:.4f}", f"{g[0]:.4f} / {g[1]:.4f}"]
        else:
            cells = ["–"] * 4
        cells += [f"{worst(k, fam, 'cv')} · {worst(k, fam, 'kept')}" for fam in ("encyclopedic", "web")]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("\n## every variant: per set, BM25 route MRR@10 / Hit@1 · union recall top-10 / top-50 · fused left out "
          "MRR@10 / Hit@1 (α refitted by family) · fused left out (the fold's unexpanded fit kept)")
    print("| variant | " + " | ".join(sets) + " |\n|---|" + "---|" * len(sets))
    for k in ["none", *keys]:
        r = results[k]
        cells = []
        for s in sets:
            ro = r["routes"][s]
            f, g = r["cv"][family_of(s)]["scores"][s], r["kept"][family_of(s)]["scores"][s]
            cells.append(f"{ro['bm25_mrr']:.4f}/{ro['bm25_h1']:.4f} · {ro['union10']:.3f}/{ro['union50']:.3f} · "
                         f"{f[0]:.4f}/{f[1]:.4f} · {g[0]:.4f}/{g[1]:.4f}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    chosen: dict = {}
    for mode in ("cv", "kept"):
        print(f"\n## mode {mode}: chosen per left-out family on the two others (in-sample gain there)")
        chosen[mode] = {}
        for fam, held in FAMILIES.items():
            train = [s for s in sets if s not in held]
            best = max(keys, key=lambda k: gain(results[k], none, fam, train, mode))
            g = gain(results[best], none, fam, train, mode)
            chosen[mode][fam] = best if g > 0 else "none"
            print(f"{fam}: {chosen[mode][fam]} (training gain {g:+.4f})")
        print("\n| left out | set | BM25 before | BM25 after | union top-10 / top-50 before | after | fused before | "
              "fused after |\n|---|---|---|---|---|---|---|---|")
        for fam, held in FAMILIES.items():
            k = chosen[mode][fam]
            for s in held:
                b, a = none["routes"][s], results[k]["routes"][s]
                fb, fa = none[mode][fam]["scores"][s], results[k][mode][fam]["scores"][s]
                print(f"| {fam} ({k}) | {s} | {b['bm25_mrr']:.4f} / {b['bm25_h1']:.4f} | {a['bm25_mrr']:.4f} / "
                      f"{a['bm25_h1']:.4f} | {b['union10']:.3f} / {b['union50']:.3f} | {a['union10']:.3f} / "
                      f"{a['union50']:.3f} | {fb[0]:.4f} / {fb[1]:.4f} | {fa[0]:.4f} / {fa[1]:.4f} |")
    print("\nexpanded terms of the first regulations question, per chosen variant:")
    for k in sorted({k for m in chosen.values() for k in m.values()}):
        if k in shown:
            print(f"{k}: {shown[k][:1]}")
    if json_out:
        Path(json_out).write_text(json.dumps({"results": results, "chosen": chosen, "shown": shown},
                                             ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
