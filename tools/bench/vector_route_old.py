"""The vector route as shipped before issue #29 (commit 222b295), kept only so tools.bench.bench_vector_route can
time old and new in the same run. Not used by the app."""
from __future__ import annotations

from collections.abc import Callable

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from pipeline.retrieval.nodes import ChunkLookup, node_from_row, retrievable
from pipeline.retrieval.vector import cosine_from_chroma_score


class OldReadyVectorRetriever(BaseRetriever):
    def __init__(self, index: Callable, lookup: ChunkLookup, top_k: int,
                 extra_fetch: Callable[[], int] = lambda: 0, enabled: Callable[[], bool] = lambda: True,
                 ready_count: Callable[[], int | None] = lambda: None):
        self._index = index
        self._lookup = lookup
        self._top_k = top_k
        self._extra_fetch = extra_fetch
        self._ready_count = ready_count
        self._enabled = enabled
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if not self._enabled():
            return []
        index = self._index()
        count = index.vector_store.client.count()
        if count == 0:
            return []
        cap = min(count, self._top_k + max(0, int(self._extra_fetch())))
        ready = self._ready_count()
        want = self._top_k if ready is None else min(self._top_k, int(ready))
        k = min(cap, 2 * self._top_k)
        while True:
            hits = index.as_retriever(similarity_top_k=k).retrieve(query_bundle)
            rows = self._lookup([int(h.node.node_id) for h in hits])
            scored = []
            for h in hits:
                row = rows.get(int(h.node.node_id))
                if not retrievable(row):
                    continue
                scored.append(NodeWithScore(node=node_from_row(row), score=cosine_from_chroma_score(h.score)))
            if len(scored) >= want or k >= cap:
                break
            k = min(cap, 4 * k)
        scored.sort(key=lambda n: (-n.score, int(n.node.node_id)))
        return scored[: self._top_k]
