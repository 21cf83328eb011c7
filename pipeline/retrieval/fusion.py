"""Weighted Reciprocal Rank Fusion of the BM25 and vector routes (a LlamaIndex BaseRetriever).

score(chunk) = Σ_route  w_route / (rrf_k + rank_route(chunk)),  ranks from 1, rrf_k = 60 (SRS).
With both weights 1 this is plain RRF. Weights are settings; their defaults were chosen by measurement
(docs/retrieval-eval.md): on real search questions (DuReader) equal weights let BM25's noise pull fusion below
the vector route alone, while on passage-worded questions (CMRC, XQuAD) BM25 is the stronger route.
Adaptive mode (default) therefore scales the BM25 weight per query by how decisive BM25's own ranking is:
w_bm25 = clamp((s1 / s2 − 1) · ADAPTIVE_SLOPE, ADAPTIVE_FLOOR, bm25_weight), s1/s2 its top two scores.
A query whose words single out one passage keeps BM25's full say; a query whose words match many passages
about equally (typical search phrasing) leans on the vector route.
Each fused node keeps bm25_rank, bm25_score, vector_rank, similarity, rrf_score (None where a route missed).
Ties are broken by chunk_id so results are reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from pipeline.retrieval import timing

FUSION_KEYS = ["bm25_rank", "bm25_score", "vector_rank", "similarity", "rrf_score", "fusion_weight"]
ADAPTIVE_SLOPE = 1.5
ADAPTIVE_FLOOR = 0.2


def adaptive_bm25_weight(bm25: list[NodeWithScore], cap: float) -> float:
    """The BM25 weight for this query (see module doc). Never above `cap` (the bm25_weight setting)."""
    scores = [float(n.score or 0.0) for n in bm25[:2]]
    if len(scores) < 2 or scores[1] <= 0:
        return cap  # a single lexical hit is as decisive as it gets
    ratio = scores[0] / scores[1]
    return min(cap, max(ADAPTIVE_FLOOR, (ratio - 1.0) * ADAPTIVE_SLOPE))


@dataclass
class FusionOutput:
    bm25: list[NodeWithScore] = field(default_factory=list)
    vector: list[NodeWithScore] = field(default_factory=list)
    fused: list[NodeWithScore] = field(default_factory=list)
    ms: dict[str, float] = field(default_factory=dict)
    bm25_weight: float = 1.0  # the weight actually used for this query


def rrf_fuse(bm25: list[NodeWithScore], vector: list[NodeWithScore], rrf_k: int = 60,
             bm25_weight: float = 1.0, vector_weight: float = 1.0) -> list[NodeWithScore]:
    """Pure function: fuse two ranked lists. Input order is the rank (1-based)."""
    info: dict[str, dict] = {}
    nodes: dict[str, NodeWithScore] = {}
    routes = ((bm25, "bm25_rank", "bm25_score", bm25_weight), (vector, "vector_rank", "similarity", vector_weight))
    for ranked, rank_key, score_key, weight in routes:
        for rank, n in enumerate(ranked, start=1):
            nid = n.node.node_id
            nodes.setdefault(nid, n)
            d = info.setdefault(nid, {k: None for k in FUSION_KEYS} | {"rrf_score": 0.0})
            d[rank_key], d[score_key] = rank, float(n.score or 0.0)
            d["rrf_score"] += weight / (rrf_k + rank)

    def sort_key(nid: str):
        try:
            tie = int(nid)
        except ValueError:
            tie = nid
        return (-info[nid]["rrf_score"], 0 if isinstance(tie, int) else 1, tie if isinstance(tie, int) else 0,
                str(tie))

    out = []
    for nid in sorted(info, key=sort_key):
        node = nodes[nid].node.model_copy()
        node.metadata = {**node.metadata, **info[nid]}
        for k in FUSION_KEYS:
            if k not in node.excluded_llm_metadata_keys:
                node.excluded_llm_metadata_keys = [*node.excluded_llm_metadata_keys, k]
                node.excluded_embed_metadata_keys = [*node.excluded_embed_metadata_keys, k]
        out.append(NodeWithScore(node=node, score=info[nid]["rrf_score"]))
    return out


class HybridRRFRetriever(BaseRetriever):
    """Runs both routes (each recalling its own top-k) and fuses them with weighted RRF.

    Built once per settings change and shared by concurrent questions: it holds no per-question state.
    `retrieve(query_bundle)` (LlamaIndex's public method) returns the fused nodes, each carrying both routes'
    ranks and scores and the weight used (`fusion_weight`) in its metadata; `run()` returns the same together
    with the route lists for callers that want them separately (evaluation). Route timings go to
    pipeline.retrieval.timing when the caller collects them.
    """

    def __init__(self, bm25_retriever: BaseRetriever | None, vector_retriever: BaseRetriever | None,
                 rrf_k: int = 60, bm25_weight: float = 1.0, vector_weight: float = 1.0, adaptive: bool = True):
        self.bm25_retriever = bm25_retriever
        self.vector_retriever = vector_retriever
        self.rrf_k = rrf_k
        self.adaptive = adaptive
        self.bm25_weight = bm25_weight
        self.vector_weight = vector_weight
        super().__init__()

    def run(self, query_bundle: QueryBundle) -> FusionOutput:
        out = FusionOutput()
        with timing.collect() as ms:
            with timing.stage("bm25"):
                out.bm25 = self.bm25_retriever.retrieve(query_bundle) if self.bm25_retriever else []
            with timing.stage("vector"):
                out.vector = self.vector_retriever.retrieve(query_bundle) if self.vector_retriever else []
            with timing.stage("rrf"):
                out.bm25_weight = (adaptive_bm25_weight(out.bm25, self.bm25_weight) if self.adaptive and out.vector
                                   else self.bm25_weight)
                out.fused = rrf_fuse(out.bm25, out.vector, self.rrf_k, out.bm25_weight, self.vector_weight)
                for n in out.fused:
                    n.node.metadata["fusion_weight"] = out.bm25_weight
        out.ms = dict(ms)
        timing.merge(ms)  # an outer collector (the engine's) sees the route timings too
        return out

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.run(query_bundle).fused


def route_lists(fused: list[NodeWithScore]) -> tuple[list[NodeWithScore], list[NodeWithScore]]:
    """Recover each route's own ranked list (with its own scores) from fused nodes' metadata."""
    def route(rank_key: str, score_key: str) -> list[NodeWithScore]:
        hits = [n for n in fused if n.node.metadata.get(rank_key) is not None]
        hits.sort(key=lambda n: n.node.metadata[rank_key])
        return [NodeWithScore(node=n.node, score=n.node.metadata.get(score_key)) for n in hits]

    return route("bm25_rank", "bm25_score"), route("vector_rank", "similarity")
