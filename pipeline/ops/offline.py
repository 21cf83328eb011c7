"""The audit of a data dir no app is running on: stores opened read-only in spirit, no models, no recovery.

Opening an Engine would already change things (its start-up recovery requeues stuck documents and drops
orphan vectors), so a read-only audit opens only the stores. An offline repair, on the other hand, is an
Engine start (recovery) followed by Engine.repair — see tools/audit.py.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pipeline.models.paths import embedding_model_id
from pipeline.ops.audit import KBAuditor, ModelIds
from pipeline.tokenize_zh import ChineseTokenizer
from store.config_store import ConfigStore
from store.db import Database
from store.dirlock import DataDirLock
from store.documents import DocumentStore
from store.files import FileStore
from store.vectors import VectorStore


class DataDirBusy(RuntimeError):
    """The app (another process) holds the data dir: go through its HTTP API instead."""


@contextmanager
def locked(data_dir: Path):
    """Hold the data dir's lock for an offline operation; DataDirBusy when the app runs there."""
    lock = DataDirLock(Path(data_dir))
    if not lock.acquire():
        raise DataDirBusy(f"数据目录 {data_dir} 正被运行中的应用（pid {lock.holder()}）使用："
                          f"请用 --url 让应用自己执行，或先停止应用")
    try:
        yield
    finally:
        lock.release()


def persisted_bm25_ids(bm25_dir: Path) -> set[int]:
    """Chunk ids of the BM25 index on disk (empty when there is none)."""
    try:
        return set(np.load(Path(bm25_dir) / "chunk_ids.npy").tolist())
    except (OSError, ValueError):
        return set()


def audit_data_dir(data_dir: Path, project_root: Path, check_tokens: bool = True) -> dict:
    data_dir = Path(data_dir).resolve()
    if not (data_dir / "app.db").is_file():
        raise FileNotFoundError(f"不是数据目录（缺少 app.db）：{data_dir}")
    with locked(data_dir):
        db = Database(data_dir / "app.db")
        try:
            docs, vectors = DocumentStore(db), VectorStore(data_dir / "chroma")
            settings = ConfigStore(db).load()
            expected = embedding_model_id(settings.get("embedding_model_path", ""), project_root)
            auditor = KBAuditor(docs, vectors, FileStore(data_dir / "uploads"),
                                ChineseTokenizer(user_dict=data_dir / "userdict.txt"),
                                lambda: ModelIds(*vectors.model_info(), expected),
                                bm25_ids=lambda: persisted_bm25_ids(data_dir / "bm25"))
            return auditor.audit(check_tokens).to_dict()
        finally:
            db.close()
