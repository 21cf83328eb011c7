"""Vector route: VectorStoreIndex over ChromaVectorStore (our cosine collection).

The SRS wants cosine similarity = 1 − cosine distance in 0–1, clamped (cosine_from_distance); ChromaVectorStore
would report exp(−distance) instead, so the route reads the distances itself.
Only chunks of 就绪 documents are returned: chunks are written to Chroma before their document turns 就绪,
so hits are filtered against SQLite; the query widens only while not-ready vectors crowd the top. The route
queries the collection for ids and distances itself (ReadyVectorRetriever._search) and reads the hits' rows in
one SQL lookup; it stays a LlamaIndex BaseRetriever returning NodeWithScore with cosine scores.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from chromadb.errors import ChromaError
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.vector_stores.chroma import ChromaVectorStore

from pipeline.retrieval.nodes import ChunkLookup, node_from_row, retrievable

# Up to this many allowed chunks a filter is handed to Chroma as ids; beyond it `where` on doc_id is used, so the id
# list (read from SQL, sent to a Chroma server in team mode) stays bounded. Measured fast at 5,000 of 50,000; the
# bound itself is a cap, not a fitted value.
IDS_FILTER_MAX = 100_000


def cosine_from_distance(distance: float | None) -> float:
    """Chroma's cosine distance → cosine similarity clamped to [0, 1]."""
    if distance is None:
        return 0.0
    return max(0.0, min(1.0, 1.0 - float(distance)))


def stored_cosines(collection, query_embedding, chunk_ids: list[str], others: Sequence = ()) -> dict[str, float]:
    """Cosine (clamped to [0, 1], like the route's own scores) of the query with the stored vectors of given
    chunks — the vector score of chunks the vector route did not return. Missing ids are left out. `others`: more
    phrasings of the query (multi-query): each chunk's best cosine over all of them, from one read of the vectors."""
    if not chunk_ids:
        return {}
    got = collection.get(ids=list(chunk_ids), include=["embeddings"])
    if not len(got["ids"]):
        return {}
    m = np.asarray(got["embeddings"], dtype=np.float32)
    norms = np.linalg.norm(m, axis=1)
    cos = None
    for emb in (query_embedding, *others):
        q = np.asarray(emb, dtype=np.float32)
        one = m @ q / (norms * np.linalg.norm(q) + 1e-9)
        cos = one if cos is None else np.maximum(cos, one)
    return {i: float(min(1.0, max(0.0, c))) for i, c in zip(got["ids"], cos)}


def chroma_index(collection, embed_model: BaseEmbedding) -> VectorStoreIndex:
    """The LlamaIndex view of our collection; build once per collection, not per query."""
    return VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=collection),
                                              embed_model=embed_model)


class ReadyVectorRetriever(BaseRetriever):
    """Top-k cosine hits of 就绪 documents. Built once per settings change: the index comes from `index` at
    query time (the Chroma collection object changes when vectors of another model are reset), and the route
    answers nothing while `enabled()` is false (collection holds another model's vectors).

    One question costs one Chroma query for ids and distances only (`_search`) and one batched SQL lookup of
        those ids; nothing on this path scans the collection or the chunk table (docs/benchmarks.md#vector-growth:
    the per-question counts grew with the index, LlamaIndex's node conversion of every hit cost ~10 ms)."""

    def __init__(self, index: Callable[[], VectorStoreIndex], lookup: ChunkLookup, top_k: int,
                 extra_fetch: Callable[[], int] = lambda: 0, enabled: Callable[[], bool] = lambda: True,
                 ready_count: Callable[[], int | None] = lambda: None, kb_id: int | None = None,
                 allowed_chunks: Callable[[list[int]], list[str]] | None = None):
        self._index = index
        self._allowed_chunks = allowed_chunks  # doc ids → retrievable chunk ids (as Chroma ids), for a filter
        self._kb_id = kb_id  # whose documents a filter's allowed set picks for this collection
        self._lookup = lookup
        self._top_k = top_k
        self._extra_fetch = extra_fetch  # vectors not to return (not 就绪 / old versions): the widening's bound
        self._ready_count = ready_count  # chunks of 就绪 documents: no point widening past all of them
        self._enabled = enabled
        super().__init__()

    @staticmethod
    def _search(index: VectorStoreIndex, embedding, k: int, where: dict | None = None,
                ids: list[str] | None = None) -> list[tuple[int, float]]:
        """(chunk_id, cosine) of the k nearest vectors (among those `where` or `ids` allow), best first. Only ids
        and distances come back: the text and metadata of a hit are read from SQL for the hits kept, and
        LlamaIndex's ChromaVectorStore would turn every hit into a node with its text first."""
        got = index.vector_store.client.query(query_embeddings=[list(map(float, embedding))], n_results=int(k),
                                              where=where, ids=ids, include=["distances"])
        return [(int(i), cosine_from_distance(d)) for i, d in zip(got["ids"][0], got["distances"][0])]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if not self._enabled():
            return []
        index = self._index()
        emb = query_bundle.embedding
        if emb is None:
            emb = index._embed_model.get_query_embedding(query_bundle.query_str)
        # Fetch 2 × top_k and widen (×4) only while not-ready vectors crowd out the ready ones, up
        # to top_k + every not-ready vector. That bound is counted only then: counting it for every question was
        # a scan of the chunk table per question (and fetching the bound every time made each question read
        # thousands of hits while a long document ingests: 4–6 s per question at 8.8k chunks;
        # docs/benchmarks.md#load).
        k = 2 * self._top_k
        cap: int | None = None
        while True:
            hits = self._search(index, emb, k)
            rows = self._lookup([cid for cid, _ in hits])
            scored = [(cid, score) for cid, score in hits
                      if retrievable(rows.get(cid))]  # else: orphan vector, document not 就绪, or an old version
            if len(scored) >= self._top_k:
                break
            if len(hits) < k and hits and len(scored) == len(hits):
                break  # a short read of ready chunks only: the collection holds no more
            # A short read that held not-ready vectors (or nothing) is not taken as "no more": once, in a full test
            # run, a read right after vectors were deleted and re-added came back with no ready hit (HNSW skips
            # deleted elements while it searches; not reproduced since). The counts below decide, as they do when
            # not-ready vectors crowd a full read.
            if cap is None:
                cap = self._top_k + max(0, int(self._extra_fetch()))
                ready = self._ready_count()
                if ready is not None and len(scored) >= min(self._top_k, int(ready)):
                    break  # every 就绪 chunk is already here
            if k >= cap:
                break
            k = min(cap, 4 * k)
        scored.sort(key=lambda h: (-h[1], h[0]))
        return self._nodes(scored, rows)

    def _nodes(self, scored: list[tuple[int, float]], rows: dict) -> list[NodeWithScore]:
        # nodes only for the hits returned (building one costs more than finding it)
        return [NodeWithScore(node=node_from_row(rows[cid]), score=score) for cid, score in scored[: self._top_k]]

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
        emb = query_bundle.embedding
        if emb is None:
            emb = index._embed_model.get_query_embedding(query_bundle.query_str)
        k = max(1, min(self._top_k, allowed.chunk_count))
        hits = None
        if self._allowed_chunks is not None and allowed.chunk_count <= IDS_FILTER_MAX:
            # Chroma restricts the search to given ids far faster than it resolves `where` on metadata (5,000
            # allowed of 50,000: ~6 ms vs ~32 ms, same top-k; docs/benchmarks.md); the ids are cached per BM25
            # snapshot (doc_filter.AllowedChunkIds). An id without a vector (an
            # inconsistency the audit reports) makes Chroma refuse the query: then `where` answers.
            ids = self._allowed_chunks(doc_ids)
            if not ids:
                return []
            try:
                hits = self._search(index, emb, min(k, len(ids)), ids=ids)
            except ChromaError:
                pass  # hits stays None: `where` below
        if hits is None:
            where = {"doc_id": doc_ids[0]} if len(doc_ids) == 1 else {"doc_id": {"$in": doc_ids}}
            hits = self._search(index, emb, k, where)
        rows = self._lookup([cid for cid, _ in hits])
        scored = sorted(((cid, score) for cid, score in hits if retrievable(rows.get(cid))),
                        key=lambda h: (-h[1], h[0]))
        return self._nodes(scored, rows)
