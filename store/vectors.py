"""Chroma persistent collection `rag_docs` (cosine), ids = str(chunk_id), metadata {doc_id, doc_name}.

The collection metadata records which embedding model (id + dimension) made the vectors, so starting with a
different model is detected ("需要全量重建") and vectors of two models are never mixed.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import chromadb
from chromadb.config import Settings as ChromaSettings  # telemetry off per client (anonymized_telemetry)

log = logging.getLogger(__name__)

COLLECTION = "rag_docs"
BATCH = 256


class VectorStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.client = chromadb.PersistentClient(
            path=str(self.path), settings=ChromaSettings(anonymized_telemetry=False, allow_reset=False))
        self.collection = self._open()

    def _open(self):
        # Created by us with cosine space: LlamaIndex's ChromaVectorStore would create an L2 collection.
        return self.client.get_or_create_collection(COLLECTION, metadata={"hnsw:space": "cosine"})

    # --- model bookkeeping -------------------------------------------------------------------
    def model_info(self) -> tuple[str | None, int | None]:
        meta = self.collection.metadata or {}
        return meta.get("embedding_model"), meta.get("embedding_dim")

    def check_model(self, model_id: str, dim: int) -> str | None:
        """None when compatible; else a Chinese message saying a full rebuild is needed."""
        stored_id, stored_dim = self.model_info()
        if self.count() == 0 or stored_id is None:
            return None
        if stored_id != model_id or int(stored_dim or 0) != int(dim):
            return (f"向量库由模型 {stored_id}（{stored_dim} 维）生成，当前模型为 {model_id}（{dim} 维），"
                    f"需要全量重建")
        return None

    def claim_model(self, model_id: str, dim: int) -> None:
        """Record the model of the vectors about to be written (only when empty or already this model)."""
        stored_id, stored_dim = self.model_info()
        if stored_id == model_id and stored_dim == dim:
            return
        if self.count() and stored_id is not None:
            raise RuntimeError(self.check_model(model_id, dim) or "embedding model mismatch")
        # Only our keys: re-sending hnsw:space raises ("changing the distance function…"); the space stays
        # in the collection's configuration.
        self.collection.modify(metadata={"embedding_model": model_id, "embedding_dim": int(dim)})

    def reset(self) -> None:
        """Drop every vector (full rebuild with another embedding model)."""
        self.client.delete_collection(COLLECTION)
        self.collection = self._open()

    # --- data --------------------------------------------------------------------------------
    def add(self, chunk_ids: Sequence[int], embeddings: Sequence[Sequence[float]], texts: Sequence[str],
            doc_id: int, doc_name: str) -> None:
        n = len(chunk_ids)
        self.add_many(chunk_ids, embeddings, texts, [doc_id] * n, [doc_name] * n)

    def add_many(self, chunk_ids: Sequence[int], embeddings: Sequence[Sequence[float]], texts: Sequence[str],
                 doc_ids: Sequence[int], doc_names: Sequence[str]) -> None:
        """Vectors of one or several documents in as few calls as possible (each add costs ~30 ms)."""
        for i in range(0, len(chunk_ids), BATCH):
            sl = slice(i, i + BATCH)
            self.collection.add(
                ids=[str(c) for c in chunk_ids[sl]],
                embeddings=[list(map(float, e)) for e in embeddings[sl]],
                documents=list(texts[sl]),
                metadatas=[{"doc_id": int(d), "doc_name": n} for d, n in zip(doc_ids[sl], doc_names[sl])],
            )

    def delete_doc(self, doc_id: int) -> None:
        # ChromaVectorStore.delete_nodes(filters=...) without ids raises: use the collection directly.
        self.collection.delete(where={"doc_id": int(doc_id)})

    def delete_ids(self, chunk_ids: Sequence[int]) -> None:
        ids = [str(c) for c in chunk_ids]
        for i in range(0, len(ids), 1000):
            self.collection.delete(ids=ids[i:i + 1000])

    def embeddings_of(self, chunk_ids: Sequence[int]) -> dict[int, list[float]]:
        """Stored vectors by chunk id (ids without a vector are absent)."""
        got = self.collection.get(ids=[str(c) for c in chunk_ids], include=["embeddings"])
        return {int(i): list(e) for i, e in zip(got["ids"], got["embeddings"])}

    def all_ids(self) -> set[int]:
        out: set[int] = set()
        offset = 0
        while True:
            got = self.collection.get(include=[], limit=5000, offset=offset)
            if not got["ids"]:
                break
            out.update(int(i) for i in got["ids"])
            offset += len(got["ids"])
        return out

    def count(self) -> int:
        return self.collection.count()
