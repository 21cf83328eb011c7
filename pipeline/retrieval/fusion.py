"""Fusion of the BM25 and vector routes: pure scoring functions + the hybrid LlamaIndex BaseRetriever.

Full information: every chunk of the union of both routes' lists is scored on BOTH routes — the BM25 score
of a chunk only the vector route returned (bm25s scores the whole corpus for a query anyway; we read the
union's entries) and the cosine of a chunk only BM25 returned (its stored embedding). A fusion then compares
like with like instead of treating "absent from the other list" as a very bad rank.

Modes (setting `fusion_mode`):
- "rrf": the SRS's Reciprocal Rank Fusion, score = Σ_route w_route / (rrf_k + rank_route), ranks from 1 in
  each route's own list (a route that missed the chunk adds nothing). With `bm25_adaptive` the BM25 weight is
  scaled per query by BM25's top-1/top-2 ratio (the previous default); with both weights 1 it is plain RRF.
- "convex": fused = α·N(bm25) + (1 − α)·N(cosine), N = min-max (default) or z-score over the query's
  candidates (Bruch, Gai & Ingber, ACM TOIS 2023: convex combination beats RRF in and out of domain). α, the
  BM25 share, is the `convex_bm25_weight` setting, or with `convex_auto_weight` a logistic function of cheap
  per-query features (`query_features`), α = σ(b + Σ c_f·f), coefficients in the embedding model's calibration
  profile (pipeline/calibration, section `fusion`). Fitting and its leave-one-set-out check: tools/eval/fusion_cv.py,
  docs/retrieval-eval.md.
  The auto α is then scaled by the question's *visible share*: the IDF-weighted share of its content words that
  some chunk of the knowledge base holds (JiebaBM25Retriever.visible_share). Words no chunk holds give the keyword
  route nothing to match — 「钱被撕成两半了，拿去银行换要收手续费吗？」 against a regulation that says 「残缺、污损的
  人民币…兑换」 leaves BM25 only 银行 and 手续费, and its top chunks are the rules that happen to say those — so its
  share of the fusion shrinks with the part of the question it cannot see. Not fitted (no parameter); on the
  encyclopedic and web dev sets nearly every word is in the KB (median share 1.0), on everyday questions against
  regulations about half is (docs/retrieval-eval.md, session 16). The no-answer gate keeps reading the order of the
  unscaled α (`FusionOutput.evidence`): its thresholds were fitted on that order.
  With `convex_length_prior` a fragment prior is added: + β·L(chunk length), L = log(1 + len) / log(1 + cap)
  capped at 1. Why: the dense route ranks short fragments that merely echo the question (a page title 「爬爬垫什么
  材质好」, a heading, a navigation line) above the passage that answers it — on the web-passage dev sets half the
  vector top-1s are such fragments under 80 characters; a chunk that says something needs some length. β and
  cap are fitted after the α coefficients (same file, same leave-one-set-out check). Only a document's first
  chunk can be a fragment: a later one continues the passage before it (a tail is short by where the cut fell),
  and a verified Q&A entry is curated; both count as full length. The prior orders what is shown and quoted; it is not
  evidence that the knowledge base holds an answer (an out-of-KB question also gets long chunks on top, with
  more words to match), so the no-answer gate reads `FusionOutput.evidence`: the same candidates in the order
  of the fusion without the prior (and with the α model's weight before the visible-share scaling, above).
Ties are broken by chunk_id (numeric) so results are reproducible.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from pipeline.retrieval import timing

# Metadata every fused node carries (None where a score cannot be known, e.g. the vector route is off).
FUSION_KEYS = ["bm25_rank", "bm25_score", "vector_rank", "similarity", "rrf_score", "fused_score", "length_prior"]
RATIO_CAP = 4.0  # bm25 top-1/top-2 ratio above this is "decisive" either way; keeps log features bounded

AUTO_FEATURES = ["bm25_ratio", "coverage", "agree3", "agree10", "dense_margin", "dense_spread", "cos1", "qlen"]
NO_PRIOR = {"beta": 0.0, "cap": 1}



# ------------------------------------------------------------------------------------------ pure functions
def adaptive_bm25_weight(bm25_top: Sequence[float], cap: float, slope: float, floor: float) -> float:
    """The adaptive-RRF BM25 weight from BM25's best scores: clamp((s1 / s2 − 1)·slope, floor, cap); slope and
    floor from the calibration profile (fusion.adaptive_rrf). Never above `cap` (bm25_weight)."""
    scores = [float(v or 0.0) for v in bm25_top[:2]]
    if len(scores) < 2 or scores[1] <= 0:
        return cap  # a single lexical hit is as decisive as it gets
    ratio = scores[0] / scores[1]
    return min(cap, max(floor, (ratio - 1.0) * slope))


def rrf_scores(bm25_ranks: Sequence[int | None], vector_ranks: Sequence[int | None], rrf_k: int = 60,
               bm25_weight: float = 1.0, vector_weight: float = 1.0) -> np.ndarray:
    """RRF score per candidate from its 1-based rank in each route's list (None: not in that list)."""
    out = np.zeros(len(bm25_ranks), dtype=np.float64)
    for i, (rb, rv) in enumerate(zip(bm25_ranks, vector_ranks)):
        if rb is not None:
            out[i] += bm25_weight / (rrf_k + rb)
        if rv is not None:
            out[i] += vector_weight / (rrf_k + rv)
    return out


def zscore(x: np.ndarray) -> np.ndarray:
    """Standard scores over the query's candidates; a constant column carries no preference → all 0."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    sd = float(x.std())
    return (x - float(x.mean())) / sd if sd > 0 else np.zeros_like(x)


def minmax(x: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] over the query's candidates; a constant column carries no preference → all 0."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


NORMS = {"zscore": zscore, "minmax": minmax}


def convex_scores(bm25: np.ndarray, cosine: np.ndarray, alpha: float, norm: str = "minmax",
                  prior: np.ndarray | None = None) -> np.ndarray:
    """α·N(bm25) + (1 − α)·N(cosine) over the same candidates, N = z-score or min-max; plus `prior` (each
    candidate's fragment term β·L, `length_prior`) when given."""
    n = NORMS[norm]
    out = alpha * n(bm25) + (1.0 - alpha) * n(cosine)
    return out if prior is None else out + prior


def length_prior(lengths: Sequence[float], beta: float, cap: int) -> np.ndarray:
    """β·min(1, log(1 + len) / log(1 + cap)) per candidate: 0 for an empty chunk, β from `cap` characters on.
    β = 0 (or cap ≤ 1) → all zeros: no prior."""
    x = np.asarray(lengths, dtype=np.float64)
    if beta <= 0 or cap <= 1 or x.size == 0:
        return np.zeros(x.size)
    return beta * np.minimum(np.log1p(np.maximum(x, 0.0)), math.log1p(cap)) / math.log1p(cap)


def fragment_length(node) -> float:
    """The length the fragment prior reads: the characters of a document's first chunk. A later chunk continues
    the passage before it (a page's or a document's tail is short by where the cut fell, not because it says
    little), and a verified Q&A entry is curated: both count as unbounded."""
    n = getattr(node, "node", node)
    meta = getattr(n, "metadata", None) or {}
    if meta.get("verified") or (meta.get("chunk_index") or 0) > 0:
        return math.inf
    return float(len(getattr(n, "text", "") or ""))


def query_features(bm25_sorted: Sequence[float], cos_sorted: Sequence[float], bm25_top: Sequence[str],
                   vec_top: Sequence[str], coverage: float, n_chars: int) -> dict[str, float]:
    """Cheap per-query signals of which route to trust, from numbers the routes produce anyway.

    bm25_sorted / cos_sorted: each route's scores in its own rank order; bm25_top / vec_top: its chunk ids.
    bm25_ratio    log of BM25's top-1/top-2 score ratio: high when the query's words single out one chunk.
    coverage      idf-weighted share of the query's indexed tokens found in BM25's top-1 chunk.
    agree3/10     share of BM25's top-3 (top-10) that is also in the vector top-3 (top-10).
    dense_margin  (cosine top-1 − top-2) × 10;  dense_spread  (top-1 − top-10) × 10.
    cos1          the top cosine (e5 places passages that paraphrase a question very high).
    qlen          log(1 + question length in characters).
    The cosine features are on the embedding model's scale: the fitted coefficients belong to that model (its
    calibration profile).
    """
    s = [float(v) for v in bm25_sorted[:2]]
    if not s or s[0] <= 0:
        ratio = 1.0
    elif len(s) < 2 or s[1] <= 0:
        ratio = RATIO_CAP
    else:
        ratio = min(RATIO_CAP, s[0] / s[1])
    c = [float(v) for v in cos_sorted[:10]]
    margin = (c[0] - c[1]) * 10 if len(c) >= 2 else 0.0
    spread = (c[0] - c[-1]) * 10 if len(c) >= 2 else 0.0

    def agree(k: int) -> float:
        return len(set(bm25_top[:k]) & set(vec_top[:k])) / float(k)

    return {"bm25_ratio": math.log(ratio), "coverage": float(coverage), "agree3": agree(3), "agree10": agree(10),
            "dense_margin": margin, "dense_spread": spread, "cos1": c[0] if c else 0.0,
            "qlen": math.log1p(max(0, n_chars))}


def fully_visible(features: dict[str, float]) -> dict[str, float]:
    """The features as if every word of the question were visible: they give the α the no-answer gate's thresholds
    were fitted on (the unscaled α model)."""
    return {k: v for k, v in features.items() if k != "visible"}


def auto_weight(features: dict[str, float], coefs: dict[str, float]) -> float:
    """α = lo + (hi − lo)·σ(bias + Σ c_f·f) — the BM25 share of the convex combination for this query.

    lo/hi (default 0/1) bound the share; the other keys are feature names (query_features)."""
    lo, hi = coefs.get("lo", 0.0), coefs.get("hi", 1.0)
    z = coefs.get("bias", 0.0) + sum(c * features.get(k, 0.0) for k, c in coefs.items() if k not in _NOT_FEATURES)
    return lo + (hi - lo) / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


_NOT_FEATURES = {"bias", "lo", "hi"}


def order_by(scores: np.ndarray, chunk_ids: Sequence[str]) -> list[int]:
    """Indices sorted by score descending; equal scores by numeric chunk_id ascending (deterministic)."""
    def tie(cid: str):
        return (0, int(cid), "") if cid.isdigit() else (1, 0, cid)
    return sorted(range(len(chunk_ids)), key=lambda i: (-float(scores[i]), tie(chunk_ids[i])))


# ------------------------------------------------------------------------------------------ candidates
@dataclass
class Candidates:
    """The union of both routes' lists, one row per chunk, with both routes' real scores."""

    ids: list[str] = field(default_factory=list)
    nodes: list[NodeWithScore] = field(default_factory=list)
    bm25_rank: list[int | None] = field(default_factory=list)
    vector_rank: list[int | None] = field(default_factory=list)
    bm25_score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cosine: np.ndarray | None = None  # None when the vector route is off (no query embedding)
    lengths: list[float] = field(default_factory=list)  # fragment_length of each chunk (the length prior)

    @classmethod
    def union(cls, bm25: list[NodeWithScore], vector: list[NodeWithScore]) -> "Candidates":
        c = cls()
        pos: dict[str, int] = {}
        for ranked, ranks in ((bm25, c.bm25_rank), (vector, c.vector_rank)):
            for rank, n in enumerate(ranked, start=1):
                nid = n.node.node_id
                if nid not in pos:
                    pos[nid] = len(c.ids)
                    c.ids.append(nid)
                    c.nodes.append(n)
                    c.bm25_rank.append(None)
                    c.vector_rank.append(None)
                    c.lengths.append(fragment_length(n))
                ranks[pos[nid]] = rank
        return c


@dataclass
class FusionParams:
    """What one fusion needs: the settings, and the fitted numbers of the embedding model's calibration profile
    (`from_settings`). Built by hand (tests, tools), the fitted parts are given or left off: no auto weight without
    `auto_coefs`, no adaptive RRF weight without its slope and floor."""

    mode: str = "convex"
    rrf_k: int = 60
    bm25_weight: float = 1.0
    vector_weight: float = 1.0
    bm25_adaptive: bool = False
    convex_bm25_weight: float | None = None  # None → per-query auto weight from auto_coefs
    norm: str = "minmax"
    auto_coefs: dict[str, float] | None = None  # the α model for `norm` (calibration profile)
    prior_beta: float = 0.0  # the fragment prior (convex mode): β and cap of `length_prior`; β = 0: off
    prior_cap: int = 1
    adaptive_slope: float | None = None  # the adaptive RRF weight rule (calibration profile, fusion.adaptive_rrf)
    adaptive_floor: float | None = None

    @property
    def auto_alpha(self) -> bool:
        """The convex share comes from the α model per question (and is scaled by its visible share)."""
        return self.mode == "convex" and self.convex_bm25_weight is None

    @classmethod
    def from_settings(cls, s, calibration) -> "FusionParams":
        """`calibration`: the `fusion` section of the embedding model's profile (pipeline.calibration)."""
        lp = calibration.length_prior[s.convex_norm]
        prior = {"beta": lp.beta, "cap": lp.cap} if s.convex_length_prior else NO_PRIOR
        return cls(mode=s.fusion_mode, rrf_k=s.rrf_k, bm25_weight=s.bm25_weight, vector_weight=s.vector_weight,
                   bm25_adaptive=s.bm25_adaptive, norm=s.convex_norm,
                   convex_bm25_weight=None if s.convex_auto_weight else s.convex_bm25_weight,
                   auto_coefs=dict(calibration.alpha_model[s.convex_norm]),
                   prior_beta=prior["beta"], prior_cap=prior["cap"],
                   adaptive_slope=calibration.adaptive_rrf.slope, adaptive_floor=calibration.adaptive_rrf.floor)


@dataclass
class FusionOutput:
    bm25: list[NodeWithScore] = field(default_factory=list)
    vector: list[NodeWithScore] = field(default_factory=list)
    fused: list[NodeWithScore] = field(default_factory=list)
    ms: dict[str, float] = field(default_factory=dict)
    mode: str = "rrf"
    bm25_weight: float = 1.0  # the BM25 weight (rrf) or share α (convex) actually used for this query
    features: dict[str, float] = field(default_factory=dict)
    evidence: list[NodeWithScore] = field(default_factory=list)  # `fused` in the order of the unscaled α, no prior


def without_prior(fused: list[NodeWithScore]) -> list[NodeWithScore]:
    """The fused nodes in the order of their score without the fragment prior (fused_score − length_prior),
    ties by chunk_id as in `fuse`; the list itself when no prior was added."""
    if not any(n.node.metadata.get("length_prior") for n in fused):
        return fused
    base = np.array([float(n.node.metadata["fused_score"]) - float(n.node.metadata.get("length_prior") or 0.0)
                     for n in fused])
    return [fused[i] for i in order_by(base, [n.node.node_id for n in fused])]


def fuse(cands: Candidates, p: FusionParams, features: dict[str, float] | None = None
         ) -> tuple[list[NodeWithScore], float]:
    """Fused, ordered nodes (metadata: FUSION_KEYS) and the BM25 weight used. Pure: no I/O."""
    n = len(cands.ids)
    if n == 0:
        return [], p.bm25_weight
    has_vec = cands.cosine is not None and any(r is not None for r in cands.vector_rank)
    has_bm25 = any(r is not None for r in cands.bm25_rank)
    top = sorted((r, float(cands.bm25_score[i])) for i, r in enumerate(cands.bm25_rank) if r is not None)[:2]
    if p.bm25_adaptive and has_vec:
        if p.adaptive_slope is None or p.adaptive_floor is None:
            raise ValueError("bm25_adaptive needs the adaptive RRF slope and floor (FusionParams.from_settings)")
        rrf_w = adaptive_bm25_weight([v for _, v in top], p.bm25_weight, p.adaptive_slope, p.adaptive_floor)
    else:
        rrf_w = p.bm25_weight
    rrf = rrf_scores(cands.bm25_rank, cands.vector_rank, p.rrf_k, rrf_w, p.vector_weight)
    prior = None
    if p.mode == "convex" and has_vec and has_bm25:
        if p.convex_bm25_weight is None and p.auto_coefs is None:
            raise ValueError("the auto weight needs the α model (FusionParams.from_settings)")
        alpha = (p.convex_bm25_weight if p.convex_bm25_weight is not None
                 else auto_weight(features or {}, p.auto_coefs) * (features or {}).get("visible", 1.0))
        if p.prior_beta > 0:
            prior = length_prior(cands.lengths, p.prior_beta, p.prior_cap)
        fused, weight = convex_scores(cands.bm25_score, cands.cosine, alpha, p.norm, prior), alpha
    elif p.mode == "convex":  # one route only: its own order (α = 1 for BM25 alone, 0 for vectors alone)
        weight = 1.0 if has_bm25 else 0.0
        fused = NORMS[p.norm](cands.bm25_score if has_bm25 else cands.cosine)
    else:
        fused, weight = rrf, rrf_w
    out = []
    for i in order_by(fused, cands.ids):
        node = cands.nodes[i].node.model_copy()
        info = {"bm25_rank": cands.bm25_rank[i], "bm25_score": _known(cands.bm25_score[i]),
                "vector_rank": cands.vector_rank[i],
                "similarity": None if cands.cosine is None else _known(cands.cosine[i]),
                "rrf_score": float(rrf[i]), "fused_score": float(fused[i]),
                "length_prior": None if prior is None else float(prior[i])}
        node.metadata = {**node.metadata, **info}
        hidden = [k for k in FUSION_KEYS if k not in node.excluded_llm_metadata_keys]
        node.excluded_llm_metadata_keys = [*node.excluded_llm_metadata_keys, *hidden]
        node.excluded_embed_metadata_keys = [*node.excluded_embed_metadata_keys, *hidden]
        out.append(NodeWithScore(node=node, score=float(fused[i])))
    return out, weight


def best_of(lists: Sequence[list[NodeWithScore]]) -> list[NodeWithScore]:
    """One ranked list from several of the same route (one per phrasing of the question): each chunk once, with
    its best score, best first (ties by chunk_id as in `fuse`); as long as the longest of them."""
    best: dict[str, NodeWithScore] = {}
    for ranked in lists:
        for n in ranked:
            kept = best.get(n.node.node_id)
            if kept is None or float(n.score or 0.0) > float(kept.score or 0.0):
                best[n.node.node_id] = n
    ids = list(best)
    order = order_by(np.array([float(best[i].score or 0.0) for i in ids]), ids)
    return [best[ids[i]] for i in order][:max(len(x) for x in lists)]


def _known(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def rrf_fuse(bm25: list[NodeWithScore], vector: list[NodeWithScore], rrf_k: int = 60,
             bm25_weight: float = 1.0, vector_weight: float = 1.0) -> list[NodeWithScore]:
    """Weighted RRF of two ranked lists (input order is the rank); scores known only from the lists (no
    completion: a chunk's score on the route that missed it is None)."""
    c = Candidates.union(bm25, vector)
    pos = {cid: i for i, cid in enumerate(c.ids)}
    c.bm25_score, c.cosine = np.full(len(c.ids), np.nan), np.full(len(c.ids), np.nan)  # NaN: not known here
    for ranked, arr in ((bm25, c.bm25_score), (vector, c.cosine)):
        for n in ranked:
            arr[pos[n.node.node_id]] = float(n.score or 0.0)
    params = FusionParams(mode="rrf", rrf_k=rrf_k, bm25_weight=bm25_weight, vector_weight=vector_weight,
                          bm25_adaptive=False)
    return fuse(c, params)[0]


# ------------------------------------------------------------------------------------------ the retriever
class HybridRetriever(BaseRetriever):
    """Both routes, full-information completion of their scores, then the fusion of `params`.

    Built once per settings change and shared by concurrent questions: it holds no per-question state.
    `bm25_retriever` is a LiveBM25Retriever (`query_scores(query)` → (snapshot retriever, whole-corpus scores);
    that retriever gives the top list `hits(scores)`, `scores_of(scores, ids)` and `coverage(query, id)`);
    `cosines(query_embedding, ids[, others])` gives the stored-vector cosine of chunks the vector route did not return
    (with `others`, the expansions' embeddings: the best over all of them).
    `retrieve()` returns the fused nodes (both routes' rank and real score, the fused and the RRF score in their
    metadata); `run()` returns them with the route lists, the weight used and the features. Stage timings go to
    pipeline.retrieval.timing when the caller collects them.
    """

    def __init__(self, bm25_retriever, vector_retriever: BaseRetriever | None,
                 cosines: Callable[..., dict[str, float]] | None,
                 params: FusionParams):
        self.bm25_retriever = bm25_retriever
        self.vector_retriever = vector_retriever
        self.cosines = cosines
        self.params = params
        super().__init__()

    def run(self, query_bundle: QueryBundle, keep: Callable[[NodeWithScore], bool] | None = None,
            limit: int | None = None, allowed=None, expansions: Sequence[QueryBundle] = ()) -> FusionOutput:
        """`keep` (evaluation only: tools/eval/gate_dataset's gold-removed negatives) drops hits from both route lists
        before the fusion, each list then cut to `limit` — the rest is exactly the app's fusion. `allowed` (a
        document filter's store.doc_tags.Allowed): each route ranks only those chunks (pipeline/retrieval/doc_filter.py).

        `expansions`: other phrasings of the question (the LLM's multi-query, in the documents' register), each
        with its embedding. Each route then searches with all of them and the one fusion runs over the union of
        what they found: BM25 scores the question and its phrasings as one query (a chunk that matches the words
        of several phrasings ranks higher — classic query expansion), the vector route keeps each chunk's best
        cosine over the phrasings (a paraphrase close to one of them is found). The features of the auto weight
        stay those of the question asked."""
        out = FusionOutput(mode=self.params.mode)
        bundles = [query_bundle, *expansions]
        with timing.collect() as ms:
            with timing.stage("bm25"):
                text = " ".join(b.query_str for b in bundles)
                got = self.bm25_retriever.query_scores(text) if self.bm25_retriever else None
                inner, scores = got if got is not None else (None, None)
                if inner is not None and allowed is not None:
                    scores = inner.restrict(scores, allowed)
                out.bm25 = inner.hits(scores) if inner is not None else []
            with timing.stage("vector"):
                vec = self.vector_retriever
                lists = [[] if vec is None else vec.retrieve(b) if allowed is None else vec.retrieve_allowed(b, allowed)
                         for b in (bundles if query_bundle.embedding is not None else bundles[:1])]
                out.vector = lists[0] if len(lists) == 1 else best_of(lists)
            if keep is not None:
                out.bm25 = [n for n in out.bm25 if keep(n)][:limit]
                out.vector = [n for n in out.vector if keep(n)][:limit]
            with timing.stage("fusion"):
                cands = self.complete(query_bundle, out.bm25, out.vector, inner, scores,
                                      [b.embedding for b in expansions if b.embedding is not None])
                out.features = self.features(query_bundle.query_str, inner, out.bm25, out.vector,
                                             text if self.params.auto_alpha else None)
                out.fused, out.bm25_weight = fuse(cands, self.params, out.features)
                scaled = out.features.get("visible", 1.0) < 1.0
                out.evidence = without_prior(fuse(cands, self.params, fully_visible(out.features))[0] if scaled
                                             else out.fused)
        out.ms = dict(ms)
        timing.merge(ms)  # an outer collector (the engine's) sees the route timings too
        return out

    def complete(self, qb: QueryBundle, bm25: list[NodeWithScore], vector: list[NodeWithScore], inner,
                 scores: np.ndarray | None, other_embeddings: Sequence[list[float]] = ()) -> Candidates:
        """The union with both routes' real scores; `other_embeddings` (the expansions'): a chunk's cosine is its
        best over the question's embedding and these, as the vector route ranked it."""
        c = Candidates.union(bm25, vector)
        known_b = {n.node.node_id: float(n.score or 0.0) for n in bm25}
        missing_b = [i for i in c.ids if i not in known_b]
        if missing_b and inner is not None:
            known_b |= inner.scores_of(scores, missing_b)
        c.bm25_score = np.array([known_b.get(i, 0.0) for i in c.ids], dtype=np.float64)
        if qb.embedding is not None and vector and self.cosines is not None:
            known_v = {n.node.node_id: float(n.score or 0.0) for n in vector}
            missing_v = [i for i in c.ids if i not in known_v]
            if missing_v:
                known_v |= (self.cosines(qb.embedding, missing_v, other_embeddings) if other_embeddings
                            else self.cosines(qb.embedding, missing_v))
            c.cosine = np.array([known_v.get(i, 0.0) for i in c.ids], dtype=np.float64)
        return c

    @staticmethod
    def features(query: str, inner, bm25: list[NodeWithScore], vector: list[NodeWithScore],
                 searched: str | None = None) -> dict[str, float]:
        """The α model's features of the question asked, and the visible share of what BM25 searched (`searched`:
        the question with the multi-query's phrasings, whose words in the documents' register it matches too;
        None: not measured — only the α model's share is scaled by it, a fixed weight is not)."""
        if not bm25 or not vector or inner is None:
            return {}
        cov = inner.coverage(query, bm25[0].node.node_id)
        feats = query_features([n.score for n in bm25[:10]], [n.score for n in vector[:10]],
                               [n.node.node_id for n in bm25[:10]], [n.node.node_id for n in vector[:10]],
                               cov, len(query))
        return feats if searched is None else feats | {"visible": inner.visible_share(searched)}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.run(query_bundle).fused
