"""What one question's retrieval produced — plain data, rendered by pipeline.events, stored for retry."""
from __future__ import annotations

from dataclasses import dataclass, field

from llama_index.core.schema import NodeWithScore

from pipeline.retrieval.gate import GateDecision


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
    bm25_weight: float = 1.0                                   # the BM25 weight the fusion used for this query
    max_similarity: float = 0.0
    min_similarity: float = 0.0
    gate: GateDecision | None = None                           # the no-answer gate's outcome and evidence

    @property
    def weak(self) -> bool:
        """Answered, but with the 「资料相关度较低，请核对原文」 banner."""
        return self.gate is not None and self.gate.weak
    query_embedding: list[float] | None = field(default=None, repr=False)
    started: float = field(default=0.0, repr=False)            # perf_counter() at the start, for ms["total"]
