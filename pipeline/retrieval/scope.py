"""One route over several knowledge bases: each knowledge base's own retriever, merged into one ranked list.

Every knowledge base keeps its own collection and BM25 index, so a question scoped to several of them asks each
and merges the hits by score (cosine similarities are comparable across collections; BM25 scores come from
indexes with their own IDF, close enough to merge for recall). Ties go to the lower chunk_id, so results are
reproducible. A single knowledge base uses its retriever directly (nothing changes for one knowledge base).

The BM25 side offers the interface the fusion uses (pipeline.retrieval.fusion.HybridRetriever): `query_scores`
→ (a scorer, the scores), and on the scorer `hits`, `scores_of`, `coverage` — here over every index in scope
(a chunk sits in exactly one of them).
"""
from __future__ import annotations

import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from pipeline.retrieval.bm25 import LiveBM25Retriever
from pipeline.retrieval.lexical import MergedWeights, content_terms


def _merge(hits: list[NodeWithScore], top_k: int) -> list[NodeWithScore]:
    hits.sort(key=lambda n: (-(n.score or 0.0), int(n.node.node_id)))
    return hits[:top_k]


class MergedRetriever(BaseRetriever):
    def __init__(self, retrievers: list[BaseRetriever], top_k: int):
        self._retrievers = retrievers
        self._top_k = top_k
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _merge([n for r in self._retrievers for n in r.retrieve(query_bundle)], self._top_k)

    def retrieve_allowed(self, query_bundle: QueryBundle, allowed) -> list[NodeWithScore]:
        """Each knowledge base's top-k among a filter's allowed documents (ReadyVectorRetriever), merged."""
        return _merge([n for r in self._retrievers for n in r.retrieve_allowed(query_bundle, allowed)], self._top_k)


class _MergedScorer:
    """The snapshot scorers of several BM25 indexes; `scores` is the list of their score arrays."""

    def __init__(self, inners: list, top_k: int):
        self._inners = inners
        self.similarity_top_k = top_k

    def restrict(self, scores: list[np.ndarray], allowed) -> list[np.ndarray]:
        """Each index's scores with chunks outside a filter's allowed set zeroed (JiebaBM25Retriever.restrict)."""
        return [inner.restrict(sc, allowed) for inner, sc in zip(self._inners, scores)]

    def hits(self, scores: list[np.ndarray]) -> list[NodeWithScore]:
        return _merge([n for inner, sc in zip(self._inners, scores) for n in inner.hits(sc)], self.similarity_top_k)

    def scores_of(self, scores: list[np.ndarray], chunk_ids: list[str]) -> dict[str, float]:
        out = dict.fromkeys(chunk_ids, 0.0)
        for inner, sc in zip(self._inners, scores):
            for cid, v in inner.scores_of(sc, chunk_ids).items():
                out[cid] = max(out[cid], v)
        return out

    def coverage(self, query: str, chunk_id: str) -> float:
        cid = int(chunk_id)
        for inner in self._inners:  # the index holding the chunk
            if inner.holds(cid):
                return inner.coverage(query, chunk_id)
        return 0.0

    def visible_share(self, query: str) -> float:
        """JiebaBM25Retriever.visible_share over the knowledge bases together (their summed document counts)."""
        terms = content_terms(self._inners[0].tokenizer(query)) if self._inners else []
        return MergedWeights([i.view.weights() for i in self._inners]).visible_share(terms)


class MergedBM25:
    """LiveBM25Retrievers of several knowledge bases behind the one interface the fusion uses."""

    def __init__(self, lives: list[LiveBM25Retriever], top_k: int):
        self._lives = lives
        self._top_k = top_k

    def query_scores(self, query: str) -> tuple[_MergedScorer, list[np.ndarray]] | None:
        got = [x for x in (live.query_scores(query) for live in self._lives) if x is not None]
        if not got:
            return None
        return _MergedScorer([inner for inner, _ in got], self._top_k), [sc for _, sc in got]

    def retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        got = self.query_scores(query_bundle.query_str)
        return got[0].hits(got[1]) if got else []


def scoped(retrievers: list[BaseRetriever], top_k: int) -> BaseRetriever | None:
    if not retrievers:
        return None
    return retrievers[0] if len(retrievers) == 1 else MergedRetriever(retrievers, top_k)


def scoped_bm25(lives: list[LiveBM25Retriever], top_k: int):
    if not lives:
        return None
    return lives[0] if len(lives) == 1 else MergedBM25(lives, top_k)
