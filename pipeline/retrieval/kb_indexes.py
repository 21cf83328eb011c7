"""Knowledge bases: each one is its own Chroma collection + its own BM25 index over its own documents.

`KnowledgeBases` maps kb_id → `KnowledgeBase` (made on first use and kept). The default knowledge base (1)
keeps the first release's collection `rag_docs` and BM25 folder `bm25/`, so a data dir made before knowledge
bases existed opens with everything in it and nothing to move; others get `rag_docs_kb<id>` and `bm25_kb<id>/`.
"""
from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.retrieval.bm25 import BM25Index
from store.documents import DocumentStore
from store.knowledge_bases import KBStore
from store.migrations import DEFAULT_KB_ID
from store.vectors import COLLECTION, VectorStore

__all__ = ["DEFAULT_KB_ID", "AllVectors", "KnowledgeBase", "KnowledgeBases", "collection_name", "bm25_dir"]

MAX_NAME = 50
MAX_DESCRIPTION = 500


@dataclass
class KnowledgeBase:
    kb_id: int
    vectors: VectorStore
    bm25: BM25Index


def collection_name(kb_id: int) -> str:
    return COLLECTION if kb_id == DEFAULT_KB_ID else f"{COLLECTION}_kb{kb_id}"


def bm25_dir(data_dir: Path, kb_id: int) -> Path:
    return data_dir / ("bm25" if kb_id == DEFAULT_KB_ID else f"bm25_kb{kb_id}")


def clean_name(name, field: str = "name", limit: int = MAX_NAME, required: bool = True) -> str:
    if not isinstance(name, str):
        raise EngineError(CODE_VALIDATION, f"{field} 必须是文本", field)
    name = " ".join(name.split())
    if required and not name:
        raise EngineError(CODE_VALIDATION, "知识库名称不能为空", field)
    if len(name) > limit:
        raise EngineError(CODE_VALIDATION, f"{field} 过长（最多 {limit} 字）", field)
    return name


MAX_READERS = 200


def clean_readers(readers) -> list[str] | None:
    """None = open to every logged-in user; else the list of user names (blank names dropped, duplicates too)."""
    if readers is None:
        return None
    if not isinstance(readers, (list, tuple)) or not all(isinstance(r, str) for r in readers):
        raise EngineError(CODE_VALIDATION, "readers 必须是用户名列表（或 null 表示所有登录用户可读）", "readers")
    names = sorted({r.strip() for r in readers if r.strip()})
    if len(names) > MAX_READERS or any(len(n) > MAX_NAME for n in names):
        raise EngineError(CODE_VALIDATION, f"readers 过长（最多 {MAX_READERS} 个用户名，每个最多 {MAX_NAME} 字）",
                          "readers")
    return names


class KnowledgeBases:
    def __init__(self, data_dir: Path, store: KBStore, docs: DocumentStore,
                 open_vectors: Callable[[int], VectorStore], open_bm25: Callable[[int], BM25Index]):
        """`open_vectors(kb_id)` / `open_bm25(kb_id)` make a knowledge base's collection handle and BM25 index
        (pipeline.components decides where they live); the default knowledge base is opened at once."""
        self.data_dir = Path(data_dir)
        self.store = store
        self.docs = docs
        self._open_vectors, self._open_bm25 = open_vectors, open_bm25
        self._open: dict[int, KnowledgeBase] = {}
        self._lock = threading.Lock()
        self._open[DEFAULT_KB_ID] = self._make(DEFAULT_KB_ID)

    def _make(self, kb_id: int) -> KnowledgeBase:
        return KnowledgeBase(kb_id, self._open_vectors(kb_id), self._open_bm25(kb_id))

    # --- lookup --------------------------------------------------------------------------------------------
    def get(self, kb_id: int) -> KnowledgeBase:
        """The knowledge base (3002 when there is none with this id)."""
        kb_id = self.check(kb_id)
        with self._lock:
            kb = self._open.get(kb_id)
            if kb is None:
                kb = self._open[kb_id] = self._make(kb_id)
            return kb

    def check(self, kb_id, fresh: bool = False) -> int:
        """kb_id as an int (1001), of a knowledge base that exists (3002). An open handle counts as existing
        unless `fresh`: then the database says (another process may have deleted it; its handle goes)."""
        try:
            kb_id = int(kb_id)
        except (TypeError, ValueError):
            raise EngineError(CODE_VALIDATION, "kb_id 必须是整数", "kb_id") from None
        if (fresh or kb_id not in self._open) and not self.store.exists(kb_id):
            with self._lock:
                self._open.pop(kb_id, None)
            raise EngineError(CODE_NO_DOC, f"知识库不存在：{kb_id}", "kb_id")
        return kb_id

    def forget_missing(self) -> list[int]:
        """Drop the handles of knowledge bases no longer in the database (deleted by another process); their ids."""
        ids = set(self.store.ids())
        with self._lock:
            gone = [k for k in self._open if k not in ids]
            for k in gone:
                self._open.pop(k)
        return gone

    def ids(self) -> list[int]:
        return self.store.ids()

    def opened(self) -> list[KnowledgeBase]:
        """The knowledge bases this process has open (no database read, nothing opened)."""
        with self._lock:
            return list(self._open.values())

    def all(self) -> list[KnowledgeBase]:
        return [self.get(i) for i in self.ids()]

    @property
    def default(self) -> KnowledgeBase:
        return self.get(DEFAULT_KB_ID)

    # --- changes -------------------------------------------------------------------------------------------
    def create(self, name, description="", readers=None) -> dict:
        name = clean_name(name)
        description = clean_name(description or "", "description", MAX_DESCRIPTION, required=False)
        readers = clean_readers(readers)
        if self.store.find_by_name(name):
            raise EngineError(CODE_VALIDATION, f"已有同名知识库「{name}」", "name")
        row = self.store.create(name, description, readers)
        self.get(row["kb_id"])  # its collection exists from now on
        return row

    def update(self, kb_id, name=None, description=None, readers=...) -> dict:
        """`readers` ... = unchanged, None = open to everyone, a list = only these users (and KB admins)."""
        kb_id = self.check(kb_id)
        if name is not None:
            name = clean_name(name)
            other = self.store.find_by_name(name)
            if other and other["kb_id"] != kb_id:
                raise EngineError(CODE_VALIDATION, f"已有同名知识库「{name}」", "name")
        if description is not None:
            description = clean_name(description, "description", MAX_DESCRIPTION, required=False)
        if readers is not ...:
            readers = clean_readers(readers)
        return self.store.update(kb_id, name, description, readers)

    def drop(self, kb_id: int) -> None:
        """Forget a knowledge base whose documents are gone: its collection, its BM25 folder, its row."""
        kb = self.get(kb_id)
        kb.vectors.drop()
        with self._lock:
            self._open.pop(kb.kb_id, None)
        kb.bm25.discard()  # a merge in flight would write into the folder removed next
        shutil.rmtree(kb.bm25.persist_dir, ignore_errors=True)
        self.store.delete(kb.kb_id)

    @property
    def all_vectors(self) -> "AllVectors":
        return AllVectors(self)

    def model_warning(self, model_id: str, dim: int) -> str | None:
        """The first knowledge base whose vectors come from another embedding model (需要全量重建), else None."""
        for kb in self.all():
            w = kb.vectors.check_model(model_id, dim)
            if w:
                return w
        return None


class _AllLocks:
    """Holds the write locks of every collection (in kb_id order, so two holders never deadlock)."""

    def __init__(self, locks: list):
        self._locks = locks

    def __enter__(self):
        for lock in self._locks:
            lock.acquire()
        return self

    def __exit__(self, *exc):
        for lock in reversed(self._locks):
            lock.release()
        return False


class AllVectors:
    """Every knowledge base's collection seen as one VectorStore, for what looks at the whole data dir: the
    consistency audit, its repair and the backup (pipeline.ops). Writes go to the collection of the chunk's
    knowledge base; a delete by id goes to all (an id is in one of them)."""

    def __init__(self, kbs: KnowledgeBases):
        self._kbs = kbs

    @property
    def path(self) -> Path:
        return self._kbs.data_dir / "chroma"  # one Chroma folder holds every collection

    @property
    def write_lock(self) -> _AllLocks:
        return _AllLocks([kb.vectors.write_lock for kb in self._kbs.all()])

    def _stores(self) -> list[VectorStore]:
        return [kb.vectors for kb in self._kbs.all()]

    def _store_of(self, doc_id: int) -> VectorStore | None:
        doc = self._kbs.docs.get(int(doc_id))
        return self._kbs.get(doc["kb_id"]).vectors if doc else None

    def entries(self) -> dict:
        out: dict = {}
        for vs in self._stores():
            out.update(vs.entries())
        return out

    def count(self) -> int:
        return sum(vs.count() for vs in self._stores())

    def model_info(self) -> tuple[str | None, int | None]:
        """The model of the first collection holding vectors (a mismatch is reported by check_model)."""
        for vs in self._stores():
            if vs.count():
                return vs.model_info()
        return self._kbs.default.vectors.model_info()

    def claim_model(self, model_id: str, dim: int) -> None:
        for vs in self._stores():
            vs.claim_model(model_id, dim)

    def reset(self) -> None:
        for vs in self._stores():
            vs.reset()

    def delete_ids(self, chunk_ids) -> None:
        for vs in self._stores():
            vs.delete_ids(chunk_ids)

    def delete_doc(self, doc_id: int) -> None:
        vs = self._store_of(doc_id)
        for store in [vs] if vs is not None else self._stores():
            store.delete_doc(doc_id)

    def add_many(self, chunk_ids, embeddings, texts, doc_ids, doc_names) -> None:
        by_store: dict[int, tuple[VectorStore, list[int]]] = {}
        for i, d in enumerate(doc_ids):
            vs = self._store_of(d) or self._kbs.default.vectors
            by_store.setdefault(id(vs), (vs, []))[1].append(i)
        for vs, idx in by_store.values():
            vs.add_many([chunk_ids[i] for i in idx], [embeddings[i] for i in idx], [texts[i] for i in idx],
                        [doc_ids[i] for i in idx], [doc_names[i] for i in idx])

    def bm25_indexed_ids(self) -> set[int]:
        """Chunk ids the BM25 indexes of all knowledge bases find now."""
        return set().union(*(kb.bm25.indexed_ids() for kb in self._kbs.all()))

    def bm25_persisted_ids(self) -> set[int]:
        return set().union(*(kb.bm25.persisted_ids() for kb in self._kbs.all()))
