"""One route over several knowledge bases: each knowledge base's own retriever, merged into one ranked list.

Every knowledge base keeps its own collection and BM25 index, so a question scoped to several of them asks each
and merges the hits by score (cosine similarities are comparable across collections; BM25 scores come from
indexes with their own IDF, close enough to merge for recall — fusion then works on ranks). Ties go to the
lower chunk_id, so results are reproducible. A single knowledge base uses its retriever directly.
"""
from __future__ import annotations

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle


class MergedRetriever(BaseRetriever):
    def __init__(self, retrievers: list[BaseRetriever], top_k: int):
        self._retrievers = retrievers
        self._top_k = top_k
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = [n for r in self._retrievers for n in r.retrieve(query_bundle)]
        hits.sort(key=lambda n: (-(n.score or 0.0), int(n.node.node_id)))
        return hits[: self._top_k]


def scoped(retrievers: list[BaseRetriever], top_k: int) -> BaseRetriever | None:
    if not retrievers:
        return None
    return retrievers[0] if len(retrievers) == 1 else MergedRetriever(retrievers, top_k)
