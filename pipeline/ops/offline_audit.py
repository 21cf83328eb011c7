"""Audit and backup of a data dir no app is running on (the offline forms of tools.ops.audit / tools.ops.backup).

Opening an Engine would already change things (its start-up recovery requeues stuck documents and drops
orphan vectors), so a read-only audit takes only the components (stores, no models, no recovery). The data
dir's lock is taken exclusively: a dir the running app holds is refused (DataDirBusy) — only the app can
pause its own writes. An offline repair is an Engine start (recovery) followed by Engine.repair (tools/ops/audit.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.components import Components, DataDirBusy, build_components
from pipeline.models.paths import embedding_model_id
from pipeline.ops.audit import KBAuditor, ModelIds
from pipeline.ops.backup import backup
from pipeline.settings import settings_from_stored
from store.dirlock import DataDirLock


def ensure_free(data_dir: Path) -> None:
    """DataDirBusy when the running app holds the dir (before an Engine, which only warns, opens it)."""
    lock = DataDirLock(Path(data_dir))
    if not lock.acquire():
        raise DataDirBusy(f"数据目录 {data_dir} 正被运行中的应用（pid {lock.holder()}）使用：请用 --url 让应用自己执行，"
                          f"或先停止应用")
    lock.release()


@contextmanager
def offline_components(data_dir: Path) -> Iterator[Components]:
    data_dir = Path(data_dir).resolve()
    if not (data_dir / "app.db").is_file():
        raise FileNotFoundError(f"不是数据目录（缺少 app.db）：{data_dir}")
    holder: list = []
    c = build_components(data_dir, settings=lambda: holder[0], exclusive=True)
    try:
        holder.append(settings_from_stored(c.config.load())[0])
        yield c
    finally:
        c.close()


def audit_data_dir(data_dir: Path, check_tokens: bool = True) -> dict:
    with offline_components(data_dir) as c:
        expected = embedding_model_id(c.ingest.get_settings().embedding_model_path, c.project_root)
        vectors = c.kbs.all_vectors  # every knowledge base's collection
        auditor = KBAuditor(c.docs, vectors, c.files, c.tokenizer, lambda: ModelIds(*vectors.model_info(), expected),
                            bm25_ids=vectors.bm25_persisted_ids, write_lock=c.write_lock)
        return auditor.audit(check_tokens).to_dict()


def backup_data_dir(data_dir: Path, dest: Path) -> dict:
    with offline_components(data_dir) as c:
        return backup(dest, c.data_dir, c.db, c.kbs.all_vectors, c.files, c.write_lock)
