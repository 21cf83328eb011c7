"""Query flow (SRS §4.2): embed query → BM25 ‖ vector recall → weighted RRF → rerank → no-answer gate.

Produces a RetrievalResult that carries everything the trace, the sources panel and the debug view need,
with the milliseconds of each stage.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from llama_index.core.schema import NodeWithScore, QueryBundle

from store.documents import DocumentStore
from store.vectors import VectorStore

from pipeline.retrieval.bm25 import BM25Index
from pipeline.retrieval.fusion import FusionOutput, HybridRRFRetriever
from pipeline.retrieval.rerank import SafeRerank
from pipeline.settings import Settings
from pipeline.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.vector import ReadyVectorRetriever, chroma_index

log = logging.getLogger(__name__)

TRACE_TOP = 10
SNIPPET = 120

# min_similarity calibrated per embedding model on CMRC (answerable) vs XQuAD (not in the KB);
# see docs/retrieval-eval.md. The SRS's 0.3 suits bge-small-zh; e5's cosines sit high.
CALIBRATED_MIN_SIMILARITY = {
    "packaged:multilingual-e5-small": 0.88,
}
SRS_MIN_SIMILARITY = 0.3


def default_min_similarity(model_id: str) -> float:
    return CALIBRATED_MIN_SIMILARITY.get(model_id, SRS_MIN_SIMILARITY)


@dataclass
class RetrievalResult:
    query: str
    bm25: list[NodeWithScore] = field(default_factory=list)
    vector: list[NodeWithScore] = field(default_factory=list)
    fused: list[NodeWithScore] = field(default_factory=list)
    final: list[NodeWithScore] = field(default_factory=list)
    rerank_status: dict = field(default_factory=dict)
    ms: dict = field(default_factory=dict)
    hit: bool = False
    bm25_weight: float = 1.0
    _query_embedding: list | None = field(default=None, repr=False)
    _t_start: float = field(default=0.0, repr=False)
    max_similarity: float = 0.0
    min_similarity: float = 0.0

    def sources(self) -> list[dict]:
        """Numbered like the citations: `no` = position in the rerank output, from 1."""
        out = []
        for i, n in enumerate(self.final, start=1):
            m = n.node.metadata
            out.append({
                "no": i, "chunk_id": int(n.node.node_id), "doc_id": m.get("doc_id"),
                "doc_name": m.get("doc_name"), "page": m.get("page"), "source": m.get("source", "text"),
                "text": n.node.get_content(), "similarity": _r(m.get("similarity_full")),
                "rerank_score": _r(m.get("rerank_score")), "cited": False, "verified": bool(m.get("verified")),
            })
        return out

    def trace(self) -> dict:
        def snippet(n):
            t = n.node.get_content().replace("\n", " ")
            return t[:SNIPPET] + ("…" if len(t) > SNIPPET else "")

        def base(n):
            m = n.node.metadata
            return {"chunk_id": int(n.node.node_id), "doc_name": m.get("doc_name"), "page": m.get("page"),
                    "text": snippet(n)}

        return {
            "bm25": [base(n) | {"rank": i, "score": _r(n.score)} for i, n in enumerate(self.bm25[:TRACE_TOP], 1)],
            "vector": [base(n) | {"rank": i, "similarity": _r(n.score)}
                       for i, n in enumerate(self.vector[:TRACE_TOP], 1)],
            "rrf": [base(n) | {"rank": i, "rrf_score": _r(n.node.metadata.get("rrf_score"), 6),
                               "bm25_rank": n.node.metadata.get("bm25_rank"),
                               "vector_rank": n.node.metadata.get("vector_rank")}
                    for i, n in enumerate(self.fused[:TRACE_TOP], 1)],
            "rerank": [base(n) | {"no": i, "rerank_score": _r(n.node.metadata.get("rerank_score")),
                                  "rrf_score": _r(n.node.metadata.get("rrf_score"), 6),
                                  "similarity": _r(n.node.metadata.get("similarity_full"))}
                       for i, n in enumerate(self.final, 1)],
            "rerank_status": self.rerank_status,
            "fusion": {"bm25_weight": _r(self.bm25_weight, 3)},
            "gate": {"hit": self.hit, "max_similarity": _r(self.max_similarity),
                     "min_similarity": self.min_similarity},
            "ms": {k: round(v, 1) for k, v in self.ms.items()},
        }


def _r(x, nd: int = 4):
    return None if x is None else round(float(x), nd)


class RetrievalService:
    def __init__(self, docs: DocumentStore, vectors: VectorStore, bm25_index: BM25Index,
                 tokenizer: ChineseTokenizer, embed_model, reranker: SafeRerank,
                 pending_vectors: Callable[[], int] = lambda: 0, vector_enabled: Callable[[], bool] = lambda: True):
        self.docs = docs
        self.vectors = vectors
        self.bm25_index = bm25_index
        self.tokenizer = tokenizer
        self.embed_model = embed_model
        self.reranker = reranker
        self.pending_vectors = pending_vectors
        self.vector_enabled = vector_enabled
        self._index = None  # (collection, VectorStoreIndex); the collection object changes on a model reset

    def _vector_index(self):
        col = self.vectors.collection
        if self._index is None or self._index[0] is not col:
            self._index = (col, chroma_index(col, self.embed_model))
        return self._index[1]

    def _routes(self, s: Settings, recall: int) -> HybridRRFRetriever:
        lookup = self.docs.get_chunks
        bm25 = self.bm25_index.retriever(self.tokenizer, lookup, recall)
        vec = (ReadyVectorRetriever(self._vector_index(), lookup, recall, extra_fetch=self.pending_vectors)
               if self.vector_enabled() else None)
        return HybridRRFRetriever(bm25, vec, rrf_k=s.rrf_k, bm25_weight=s.bm25_weight,
                                  vector_weight=s.vector_weight, adaptive=s.bm25_adaptive)

    def _embed_query(self, query: str) -> list[float]:
        return self.embed_model.get_query_embedding(query)

    def recall(self, query: str, s: Settings, recall: int | None = None) -> tuple[QueryBundle, FusionOutput, float]:
        t0 = time.perf_counter()
        emb = self._embed_query(query) if self.vector_enabled() else None
        embed_ms = (time.perf_counter() - t0) * 1000
        bundle = QueryBundle(query_str=query, embedding=emb)
        fusion = self._routes(s, recall or s.recall_size).run(bundle)
        return bundle, fusion, embed_ms

    def retrieve(self, query: str, s: Settings) -> RetrievalResult:
        return self.rerank_stage(self.recall_stage(query, s), s)

    def recall_stage(self, query: str, s: Settings) -> RetrievalResult:
        """Both routes + fusion + the no-answer gate (the answer stream reports it as stage "recall")."""
        t_start = time.perf_counter()
        bundle, fusion, embed_ms = self.recall(query, s)
        res = RetrievalResult(query=query, bm25=fusion.bm25, vector=fusion.vector, fused=fusion.fused,
                              min_similarity=s.min_similarity, bm25_weight=fusion.bm25_weight)
        res.max_similarity = max((n.score or 0.0 for n in fusion.vector), default=0.0)
        # Gate (F3-4): nothing similar enough → no hit, and no LLM call downstream.
        res.hit = bool(fusion.fused) and res.max_similarity >= s.min_similarity
        res.ms = {"embed": embed_ms, **fusion.ms}
        res._query_embedding, res._t_start = bundle.embedding, t_start
        return res

    def rerank_stage(self, res: RetrievalResult, s: Settings) -> RetrievalResult:
        """Cross-encoder (or its skip/fallback) over the fused candidates → the final, numbered sources."""
        t_r = time.perf_counter()
        if res.hit:
            final, status = self.reranker.rerank(res.fused, res.query, top_n=s.final_top_k,
                                                 candidates=s.rerank_candidates)
        else:
            final, status = [], {"status": "skipped", "msg": "未命中相关资料，跳过精排"}
        rerank_ms = (time.perf_counter() - t_r) * 1000
        for n in final:
            n.node.metadata["rerank_score"] = float(n.score) if status["status"] == "ok" else None
        self._fill_similarity(final, res._query_embedding)
        res.final, res.rerank_status = final, status
        res.ms.update(rerank=rerank_ms, total=(time.perf_counter() - res._t_start) * 1000)
        log.info("retrieval q=%r bm25=%.1fms vector=%.1fms rerank=%.1fms hit=%s",
                 res.query[:40], res.ms.get("bm25", 0), res.ms.get("vector", 0), rerank_ms, res.hit)
        return res

    def _fill_similarity(self, nodes: list[NodeWithScore], query_emb) -> None:
        """Cosine similarity for every final node, also those the vector route did not return."""
        missing = [n for n in nodes if n.node.metadata.get("similarity") is None]
        for n in nodes:
            n.node.metadata["similarity_full"] = n.node.metadata.get("similarity")
        if not missing or query_emb is None:
            return
        got = self.vectors.collection.get(ids=[n.node.node_id for n in missing], include=["embeddings"])
        by_id = {i: e for i, e in zip(got["ids"], got["embeddings"])}
        q = np.asarray(query_emb, dtype=np.float32)
        for n in missing:
            e = by_id.get(n.node.node_id)
            if e is not None:
                e = np.asarray(e, dtype=np.float32)
                n.node.metadata["similarity_full"] = float(e @ q / (np.linalg.norm(e) * np.linalg.norm(q) + 1e-9))

    def debug_search(self, query: str, top_k: int, s: Settings) -> dict:
        """SRS §7.2 shape: bm25 / vector / rrf groups, each top_k long."""
        _, fusion, _ = self.recall(query, s, recall=max(top_k, s.recall_size))

        def row(n):
            return {"chunk_id": int(n.node.node_id), "doc_name": n.node.metadata.get("doc_name"),
                    "text": n.node.get_content()}

        return {
            "bm25": [row(n) | {"score": _r(n.score)} for n in fusion.bm25[:top_k]],
            "vector": [row(n) | {"similarity": _r(n.score)} for n in fusion.vector[:top_k]],
            "rrf": [{"chunk_id": int(n.node.node_id), "doc_name": n.node.metadata.get("doc_name"),
                     "text": n.node.get_content(), "rrf_score": _r(n.score, 6),
                     "bm25_rank": n.node.metadata.get("bm25_rank"),
                     "vector_rank": n.node.metadata.get("vector_rank")} for n in fusion.fused[:top_k]],
            "ms": {k: round(v, 1) for k, v in fusion.ms.items()},
            "bm25_weight": round(fusion.bm25_weight, 3),
        }
