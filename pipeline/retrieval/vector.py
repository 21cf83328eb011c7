"""Vector route: VectorStoreIndex over ChromaVectorStore (our cosine collection).

ChromaVectorStore reports similarity as exp(−distance); the SRS wants cosine similarity = 1 − distance in 0–1.
We undo the exp (distance = −ln s) and report 1 − distance, clamped to [0, 1].
Only chunks of 就绪 documents are returned: chunks are written to Chroma before their document turns 就绪,
so hits are filtered against SQLite; the query widens only while not-ready vectors crowd the top.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.vector_stores.chroma import ChromaVectorStore

from pipeline.retrieval.nodes import ChunkLookup, node_from_row, retrievable


def cosine_from_chroma_score(score: float | None) -> float:
    if score is None or score <= 0:
        return 0.0
    distance = -math.log(score)
    return max(0.0, min(1.0, 1.0 - distance))


def stored_cosines(collection, query_embedding, chunk_ids: list[str]) -> dict[str, float]:
    """Cosine (clamped to [0, 1], like the route's own scores) of the query with the stored vectors of given
    chunks — the vector score of chunks the vector route did not return. Missing ids are left out."""
    if not chunk_ids:
        return {}
    got = collection.get(ids=list(chunk_ids), include=["embeddings"])
    if not len(got["ids"]):
        return {}
    q = np.asarray(query_embedding, dtype=np.float32)
    m = np.asarray(got["embeddings"], dtype=np.float32)
    cos = m @ q / (np.linalg.norm(m, axis=1) * np.linalg.norm(q) + 1e-9)
    return {i: float(min(1.0, max(0.0, c))) for i, c in zip(got["ids"], cos)}


def chroma_index(collection, embed_model: BaseEmbedding) -> VectorStoreIndex:
    """The LlamaIndex view of our collection; build once per collection, not per query."""
    return VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=collection),
                                              embed_model=embed_model)


class ReadyVectorRetriever(BaseRetriever):
    """Top-k cosine hits of 就绪 documents. Built once per settings change: the index comes from `index` at
    query time (the Chroma collection object changes when vectors of another model are reset), and the route
    answers nothing while `enabled()` is false (collection holds another model's vectors)."""

    def __init__(self, index: Callable[[], VectorStoreIndex], lookup: ChunkLookup, top_k: int,
                 extra_fetch: Callable[[], int] = lambda: 0, enabled: Callable[[], bool] = lambda: True,
                 ready_count: Callable[[], int | None] = lambda: None, kb_id: int | None = None):
        self._index = index
        self._kb_id = kb_id  # whose documents a filter's allowed set picks for this collection
        self._lookup = lookup
        self._top_k = top_k
        self._extra_fetch = extra_fetch
        self._ready_count = ready_count  # chunks of 就绪 documents: no point widening past all of them
        self._enabled = enabled
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if not self._enabled():
            return []
        index = self._index()
        count = index.vector_store.client.count()  # the chroma collection
        if count == 0:
            return []
        # Fetch a little more than top_k and widen only while not-ready vectors crowd out the ready ones, up to
        # top_k + every not-ready vector. Fetching that bound every time made each question read thousands of
        # hits while a long document ingests (4–6 s per question at 8.8k chunks; docs/benchmarks.md#load).
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
                    continue  # orphan vector, document not 就绪 yet, or an old version
                scored.append(NodeWithScore(node=node_from_row(row), score=cosine_from_chroma_score(h.score)))
            if len(scored) >= want or k >= cap:
                break
            k = min(cap, 4 * k)
        scored.sort(key=lambda n: (-n.score, int(n.node.node_id)))
        return scored[: self._top_k]

    def retrieve_allowed(self, query_bundle: QueryBundle, allowed) -> list[NodeWithScore]:
        """Top-k among the documents a filter allows (pipeline/retrieval/doc_filter.Allowed): Chroma's `where` on
        doc_id restricts the ANN search itself, so the hits are the best allowed chunks however low they rank
        without the filter. The allowed documents are 就绪 and active, so no widening is needed."""
        if not self._enabled():
            return []
        doc_ids = allowed.docs_in(self._kb_id) if self._kb_id is not None else allowed.all_doc_ids
        if not doc_ids:
            return []
        index = self._index()
        where = {"doc_id": doc_ids[0]} if len(doc_ids) == 1 else {"doc_id": {"$in": doc_ids}}
        k = max(1, min(self._top_k, allowed.chunk_count))
        hits = index.as_retriever(similarity_top_k=k, vector_store_kwargs={"where": where}).retrieve(query_bundle)
        rows = self._lookup([int(h.node.node_id) for h in hits])
        scored = [NodeWithScore(node=node_from_row(rows[int(h.node.node_id)]), score=cosine_from_chroma_score(h.score))
                  for h in hits if retrievable(rows.get(int(h.node.node_id)))]
        scored.sort(key=lambda n: (-n.score, int(n.node.node_id)))
        return scored[: self._top_k]
