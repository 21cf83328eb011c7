"""What the no-answer gate looks at, measured from one query's retrieval (no model call, < 1 ms).

Pure functions of the two routes' ranked lists and the knowledge base's term statistics, so the calibration
tool computes exactly what the running app computes (tools/eval/calibrate_gate.py dumps these per question).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from llama_index.core.schema import NodeWithScore

from pipeline.retrieval.lexical import TermWeights, content_bigrams, content_terms, coverage, normalize

COVERAGE_TOP = 3   # the fused top chunks whose best lexical coverage counts
AGREE_TOP = 5      # route agreement: overlap of the two routes' top-5
TOP_AGREE = 3      # the fused top chunk counts as agreed when it is in the top-3 of both routes


@dataclass(frozen=True)
class GateFeatures:
    max_similarity: float    # best cosine of the vector route
    similarity_gap: float    # best cosine − the 10th best: how much the top stands out of this query's list
    similarity_gap50: float  # best cosine − the last (≤ 50th) of the list
    coverage: float          # IDF-weighted share of the question's content words in the best fused top-3 chunk
    phrase_coverage: float   # share of the question's character bigrams (inside runs of content words) in that chunk
    coverage_vector: float   # the same share in the vector route's top chunk
    coverage_mass: float     # IDF of the covered words / the largest IDF: how many "rare words" the best chunk shares
    unseen: float            # IDF-weighted share of the question's content words that no chunk contains
    agreement: float         # |vector top-5 ∩ BM25 top-5| / 5
    top_agreement: float     # ~1 when the fused top chunk is in the top-3 of BOTH routes: words and meaning agree
    bm25_top: float          # BM25 score of the best lexical hit (0 when BM25 found nothing)
    n_terms: int             # content words in the question
    routes_agree: bool = False  # the plain fact behind top_agreement (shown in 检索过程; not a model input)
    # best cosine of the question against single sentences of the fused top-3 chunks (sentence_evidence.py);
    # None until measured: the gate asks for it only when the cheap inputs leave the outcome open
    best_sentence: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _ids(nodes: Sequence[NodeWithScore], k: int) -> set[str]:
    return {n.node.node_id for n in list(nodes)[:k]}


def measure(question_tokens: list[str], question_segments: list[str], weights: TermWeights, bm25: Sequence[NodeWithScore],
            vector: Sequence[NodeWithScore], fused: Sequence[NodeWithScore]) -> GateFeatures:
    terms = content_terms(question_tokens)
    sims = [float(n.score or 0.0) for n in vector]
    top = sims[0] if sims else 0.0
    tenth = sims[min(9, len(sims) - 1)] if sims else 0.0
    texts = [normalize(n.node.get_content()) for n in list(fused)[:COVERAGE_TOP]]
    covs = [coverage(terms, weights, t) for t in texts]
    best = max(range(len(covs)), key=covs.__getitem__) if covs else None
    cov = covs[best] if covs else 0.0
    mass = (sum(weights.idf(t) for t in terms if t in texts[best]) / weights.max_idf) if best is not None else 0.0
    grams = content_bigrams(question_segments)
    phrase = max((sum(g in t for g in grams) / len(grams) for t in texts), default=0.0) if grams else 0.0
    cov_vec = coverage(terms, weights, normalize(vector[0].node.get_content())) if vector else 0.0
    agree = len(_ids(vector, AGREE_TOP) & _ids(bm25, AGREE_TOP)) / AGREE_TOP if vector and bm25 else 0.0
    first = fused[0].node.node_id if fused else None
    agreed = first is not None and first in _ids(vector, TOP_AGREE) and first in _ids(bm25, TOP_AGREE)
    # In a knowledge base of a handful of chunks every chunk is in both top-3s: discount the agreement by its
    # chance (TOP_AGREE / N)² so it says nothing there (≥ 300 chunks, as on every dev set: a factor ≥ 0.9999).
    top_agree = float(agreed) * (1.0 - min(1.0, TOP_AGREE / weights.n) ** 2)
    return GateFeatures(
        max_similarity=top, similarity_gap=top - tenth, similarity_gap50=top - (sims[-1] if sims else 0.0),
        coverage=cov, phrase_coverage=phrase, coverage_vector=cov_vec, coverage_mass=mass, unseen=weights.unseen_share(terms),
        agreement=agree, top_agreement=top_agree, bm25_top=float(bm25[0].score or 0.0) if bm25 else 0.0,
        n_terms=len(terms), routes_agree=agreed)
