"""What one question's retrieval produced — plain data, rendered by pipeline.events, stored for retry."""
from __future__ import annotations

from dataclasses import dataclass, field

from llama_index.core.schema import NodeWithScore


@dataclass
class RetrievalResult:
    query: str
    bm25: list[NodeWithScore] = field(default_factory=list)    # BM25 route, its own order and scores
    vector: list[NodeWithScore] = field(default_factory=list)  # vector route, cosine similarities
    fused: list[NodeWithScore] = field(default_factory=list)   # the fusion's order (route ranks in metadata)
    final: list[NodeWithScore] = field(default_factory=list)   # after rerank: the numbered sources [1]…[k]
    rerank_status: dict = field(default_factory=dict)          # {"status": ok|skipped|fallback, "msg": …}
    ms: dict = field(default_factory=dict)                     # embed, bm25, vector, rrf, rerank, total
    hit: bool = False                                          # passed the no-answer gate
    bm25_weight: float = 1.0                                   # the BM25 weight (rrf) / share α (convex) used
    fusion_mode: str = "rrf"                                   # settings.fusion_mode when it ran
    fusion_features: dict = field(default_factory=dict)        # the query features the auto weight came from
    max_similarity: float = 0.0
    min_similarity: float = 0.0
    gate: dict | None = None  # the no-answer gate's outcome and evidence (pipeline/retrieval/gate.py GateDecision.trace)
    calibration: dict | None = None  # the calibration profile the fusion and gate ran on (ActiveProfile.info)
    doc_filter: dict | None = None  # the document filter both routes applied (pipeline/retrieval/doc_filter.py)
    # the LLM's multi-query searched with the question (pipeline/conversation/multi_query.Expansion.to_dict);
    # None: the question alone (no LLM, the setting off, or the gate refused — then no LLM saw the question)
    expansion: dict | None = None
    query_embedding: list[float] | None = field(default=None, repr=False)
    started: float = field(default=0.0, repr=False)            # perf_counter() at the start, for ms["total"]


    @property
    def weak(self) -> bool:
        """Answered, but with the 「资料相关度较低，请核对原文」 banner."""
        return bool(self.gate and self.gate.get("weak"))


def rounded(x, nd: int = 4) -> float | None:
    """A score for the trace: rounded to `nd` places, None kept."""
    return None if x is None else round(float(x), nd)


def fused_row(n: NodeWithScore) -> dict:
    """A fused candidate's numbers for the trace and the debug view: the fused score, the RRF score, and both
    routes' rank (None: not in that route's list) and real score; the fragment prior's term (None: off)."""
    m = n.node.metadata
    return {"fused_score": rounded(m.get("fused_score"), 6), "rrf_score": rounded(m.get("rrf_score"), 6),
            "bm25_rank": m.get("bm25_rank"), "bm25_score": rounded(m.get("bm25_score")),
            "vector_rank": m.get("vector_rank"), "similarity": rounded(m.get("similarity")),
            "length_prior": rounded(m.get("length_prior"))}


def fusion_info(mode: str, weight: float, features: dict) -> dict:
    """The fusion mode, the BM25 weight used for this query and the features it came from."""
    return {"mode": mode, "bm25_weight": rounded(weight, 3),
            "features": {k: rounded(v, 3) for k, v in features.items()}}
