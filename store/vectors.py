"""Chroma collections (cosine), one per knowledge base, ids = str(chunk_id), metadata {doc_id, doc_name}.

The default knowledge base keeps the first release's collection `rag_docs`; others are `rag_docs_kb<id>`
(pipeline.retrieval.kb_indexes); all collections of a data dir share one client.

Embedded (default): a PersistentClient in the data dir. Team mode (`--chroma-url http://host:port[/database]`):
an HttpClient to a Chroma server (`chroma run`) that several app processes share; the optional path names a
Chroma database on that server (created when missing). The collection metadata records which embedding model
(id + dimension) made the vectors, so starting with a different model is detected ("需要全量重建") and vectors
of two models are never mixed — the same check on both.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import chromadb
from chromadb.config import Settings as ChromaSettings  # telemetry off per client (anonymized_telemetry)
from chromadb.errors import NotFoundError

log = logging.getLogger(__name__)

COLLECTION = "rag_docs"
BATCH = 256


def parse_chroma_url(url: str) -> tuple[str, int, bool, str | None]:
    """`http(s)://host:port[/database]` → (host, port, ssl, database or None); a clear error otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"Chroma 地址无效：{url}（应为 http://主机:端口，例如 http://127.0.0.1:8000）")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 8000)
    except ValueError:
        raise ValueError(f"Chroma 地址端口无效：{url}") from None
    database = parts.path.strip("/") or None
    if database and "/" in database:
        raise ValueError(f"Chroma 地址的路径只能是一个数据库名：{url}")
    return parts.hostname, port, parts.scheme == "https", database


def http_client(url: str):
    """chromadb.HttpClient for `url`, creating the named Chroma database on the server when missing."""
    host, port, ssl, database = parse_chroma_url(url)
    settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
    if database:
        admin = chromadb.AdminClient(ChromaSettings(
            chroma_api_impl="chromadb.api.fastapi.FastAPI", chroma_server_host=host, chroma_server_http_port=port,
            chroma_server_ssl_enabled=ssl, anonymized_telemetry=False))
        try:
            admin.get_database(database)
        except NotFoundError:
            try:
                admin.create_database(database)
            except Exception:  # another app process may have created it meanwhile (409): fine if it exists now
                admin.get_database(database)
    kw = {"database": database} if database else {}
    return chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=settings, **kw)


class VectorStore:
    """`VectorStore(path)` → embedded Chroma in `path`; `VectorStore(url="http://host:port")` → Chroma server.
    `name` picks the collection (one per knowledge base); `client` shares an open client between collections."""

    def __init__(self, path: Path | None = None, *, url: str | None = None, name: str = COLLECTION, client=None):
        self.name = name
        if client is not None:
            self.path, self.url = (Path(path) if path is not None else None), url
            self.client = client
        elif url:
            self.path, self.url = None, url
            parse_chroma_url(url)  # a malformed address is a ValueError; anything after that is connectivity
            try:
                self.client = http_client(url)
                self.client.heartbeat()
            except Exception as exc:  # chromadb says "Could not connect…" with a ValueError
                raise ConnectionError(f"无法连接 Chroma 服务（{url}）：{exc}") from exc
        else:
            self.path, self.url = Path(path), None
            self.path.mkdir(parents=True, exist_ok=True)
            self.client = chromadb.PersistentClient(
                path=str(self.path), settings=ChromaSettings(anonymized_telemetry=False, allow_reset=False))
        self.collection = self._open()
        # Held by every write; a backup holds it while copying the folder so no write lands mid-copy.
        self.write_lock = threading.RLock()

    def _open(self):
        # Created by us with cosine space: LlamaIndex's ChromaVectorStore would create an L2 collection.
        return self.client.get_or_create_collection(self.name, metadata={"hnsw:space": "cosine"})

    # --- model bookkeeping -------------------------------------------------------------------
    def model_info(self) -> tuple[str | None, int | None]:
        # On a shared server another process may have claimed the collection since we opened it: ask afresh.
        col = self.client.get_collection(self.name) if self.url else self.collection
        meta = col.metadata or {}
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
        with self.write_lock:
            self.collection.modify(metadata={"embedding_model": model_id, "embedding_dim": int(dim)})

    def reopen(self) -> None:
        """Pick up a collection another app process re-created (a full rebuild with another model)."""
        col = self._open()
        if col.id != self.collection.id:
            self.collection = col

    def reset(self) -> None:
        """Drop every vector (full rebuild with another embedding model)."""
        with self.write_lock:
            self.client.delete_collection(self.name)
            self.collection = self._open()

    def drop(self) -> None:
        """Delete the collection for good (its knowledge base is deleted)."""
        try:
            self.client.delete_collection(self.name)
        except Exception as exc:  # already gone
            log.warning("dropping collection %s: %s", self.name, exc)

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
            with self.write_lock:
                self.collection.add(
                    ids=[str(c) for c in chunk_ids[sl]],
                    embeddings=[list(map(float, e)) for e in embeddings[sl]],
                    documents=list(texts[sl]),
                    metadatas=[{"doc_id": int(d), "doc_name": n} for d, n in zip(doc_ids[sl], doc_names[sl])],
                )

    def delete_doc(self, doc_id: int) -> None:
        # ChromaVectorStore.delete_nodes(filters=...) without ids raises: use the collection directly.
        with self.write_lock:
            self.collection.delete(where={"doc_id": int(doc_id)})

    def delete_ids(self, chunk_ids: Sequence[int]) -> None:
        ids = [str(c) for c in chunk_ids]
        for i in range(0, len(ids), 1000):
            with self.write_lock:
                self.collection.delete(ids=ids[i:i + 1000])

    def ids_of_doc(self, doc_id: int) -> set[int]:
        got = self.collection.get(where={"doc_id": int(doc_id)}, include=[])
        return {int(i) for i in got["ids"]}

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

    def entries(self) -> dict[int, tuple[int | None, str]]:
        """chunk_id → (doc_id, stored text) of every vector (the audit compares them with SQLite)."""
        out: dict[int, tuple[int | None, str]] = {}
        offset = 0
        while True:
            got = self.collection.get(include=["documents", "metadatas"], limit=5000, offset=offset)
            if not got["ids"]:
                break
            for i, doc, meta in zip(got["ids"], got["documents"], got["metadatas"]):
                out[int(i)] = ((meta or {}).get("doc_id"), doc or "")
            offset += len(got["ids"])
        return out

    def count(self) -> int:
        return self.collection.count()
