"""Backup of a live data dir and restore into a new one, with a manifest of counts and checksums.

What a backup holds: `app.db` (SQLite online backup API: one consistent snapshot even while the app writes),
`chroma/` (its own SQLite the same way, its index files copied), the originals under `uploads/` that the
backed-up rows reference, and the user dictionary. Not the BM25 index: it is derived and rebuilt at start.

Consistency across the stores: everything is copied inside one freeze of the data dir's write lock
(store.write_lock) while holding the vector store's write lock — writes in flight finish first, new writes wait,
questions keep being answered. A document caught mid-ingest is 处理中 in the backup; the restored app
re-ingests it from its original (Engine._recover), so a restored dir audits clean once that is done.
Checksums are computed on the copies, after the freeze.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from datetime import datetime
from pathlib import Path

from store.db import Database
from store.files import FileStore, file_digest
from store.secrets import KEY_ENV, KEY_FILE
from store.secrets import PREFIX as SEALED_PREFIX
from store.vectors import VectorStore
from store.write_lock import WriteLock

MANIFEST = "manifest.json"
FORMAT = 1
USERDICT = "userdict.txt"
CHROMA_DB = "chroma.sqlite3"


class BackupError(ValueError):
    """A refused backup/restore: `field` names the argument at fault (for the 1001 envelope)."""

    def __init__(self, msg: str, field: str = "dest"):
        super().__init__(msg)
        self.msg = msg
        self.field = field


def _sqlite_copy(src: Path, dst: Path) -> None:
    """SQLite's online backup: a consistent copy even while other connections write (WAL included)."""
    s = sqlite3.connect(src, timeout=30)
    d = sqlite3.connect(dst)
    try:
        s.backup(d)
    finally:
        d.close()
        s.close()


def _sha256(path: Path) -> str:
    return file_digest(path, "sha256")


def _counts(db_path: Path) -> dict:
    conn = sqlite3.connect(db_path)
    try:
        status = dict(conn.execute("SELECT status, COUNT(*) FROM kb_document GROUP BY status").fetchall())
        return {"docs": sum(status.values()), "ready_docs": status.get("ready", 0),
                "processing_docs": status.get("processing", 0), "failed_docs": status.get("failed", 0),
                "chunks": conn.execute("SELECT COUNT(*) FROM kb_chunk").fetchone()[0]}
    finally:
        conn.close()


def check_new_dir(path: Path, field: str, data_dir: Path | None = None) -> Path:
    """An absolute target that does not exist yet (or is an empty folder), and not inside the data dir."""
    path = Path(path)
    if not path.is_absolute():
        raise BackupError(f"{field} 必须是绝对路径：{path}", field)
    path = path.resolve()
    if data_dir is not None and (path == data_dir or data_dir in path.parents or path in data_dir.parents):
        raise BackupError(f"{field} 不能在数据目录 {data_dir} 之内或之上", field)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{field} 已存在且不是空目录：{path}", field)
    return path


def backup(dest: Path, data_dir: Path, db: Database, vectors: VectorStore, files: FileStore,
           write_lock: WriteLock) -> dict:
    """Write a complete backup to `dest` (must not exist or be empty); returns the manifest."""
    data_dir = Path(data_dir).resolve()
    dest = check_new_dir(dest, "dest", data_dir)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o700)
    (tmp / "chroma").mkdir()
    (tmp / "uploads").mkdir()
    t0 = time.perf_counter()
    with write_lock.frozen(), vectors.write_lock:
        t_frozen = time.perf_counter()
        _sqlite_copy(db.path, tmp / "app.db")
        for p in sorted(vectors.path.rglob("*")):
            rel = p.relative_to(vectors.path)
            if p.is_dir():
                (tmp / "chroma" / rel).mkdir(parents=True, exist_ok=True)
            elif p.name == CHROMA_DB:
                _sqlite_copy(p, tmp / "chroma" / rel)
            elif not p.name.startswith(CHROMA_DB + "-"):  # its -wal/-shm are inside the online copy
                shutil.copy2(p, tmp / "chroma" / rel)
        vector_count = vectors.count()
        model, dim = vectors.model_info()
        conn = sqlite3.connect(tmp / "app.db")
        try:
            names = [r[0] for r in conn.execute("SELECT stored_name FROM kb_document WHERE stored_name IS NOT NULL")]
        finally:
            conn.close()
        missing = []
        for name in names:
            src = files.path_of(name)
            if src.exists():
                shutil.copy2(src, tmp / "uploads" / name)
            else:
                missing.append(name)
        if (data_dir / USERDICT).is_file():
            shutil.copy2(data_dir / USERDICT, tmp / USERDICT)
        frozen_ms = (time.perf_counter() - t_frozen) * 1000
    checksums = {str(p.relative_to(tmp)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "created_at": datetime.now().isoformat(timespec="seconds"),
                "source": str(data_dir), "counts": {**_counts(tmp / "app.db"), "vectors": vector_count,
                                                    "files": len(names) - len(missing)},
                "embedding_model": model, "embedding_dim": dim, "missing_originals": missing,
                "frozen_ms": round(frozen_ms), "elapsed_ms": None, "files": checksums}
    manifest["elapsed_ms"] = round((time.perf_counter() - t0) * 1000)
    (tmp / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=2), encoding="utf-8")
    owner_only(tmp)
    if dest.exists():
        dest.rmdir()
    tmp.rename(dest)  # the manifest inside marks a complete backup
    return manifest


def owner_only(root: Path) -> None:
    """Folders 0700, files 0600 below `root`: a backup or a restored data dir holds everything the app knows."""
    root.chmod(0o700)
    for p in root.rglob("*"):
        p.chmod(0o700 if p.is_dir() else 0o600)


def sealed_settings(db_path: Path) -> list[str]:
    """The settings stored sealed (store/secrets.py) in a backup's or data dir's app.db: what the key file opens."""
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute("SELECT key, value FROM sys_config").fetchall()
    finally:
        conn.close()
    return sorted(k for k, v in rows if isinstance(v, str) and v.startswith('"' + SEALED_PREFIX))


def verify(src: Path) -> dict:
    """The manifest of a complete, untouched backup; BackupError naming the first file that differs."""
    src = Path(src)
    try:
        manifest = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackupError(f"不是完整的备份（缺少或无法读取 {MANIFEST}）：{src}", "src") from exc
    if manifest.get("format") != FORMAT:
        raise BackupError(f"不支持的备份格式 {manifest.get('format')!r}", "src")
    listed = manifest.get("files") or {}
    for rel, want in listed.items():
        p = src / rel
        if not p.is_file():
            raise BackupError(f"备份缺少文件：{rel}", "src")
        if p.stat().st_size != want["bytes"] or _sha256(p) != want["sha256"]:
            raise BackupError(f"备份文件校验失败（内容已改变）：{rel}", "src")
    extra = sorted(str(p.relative_to(src)) for p in src.rglob("*")
                   if p.is_file() and p.name != MANIFEST and str(p.relative_to(src)) not in listed)
    if extra:
        raise BackupError(f"备份中有清单之外的文件：{', '.join(extra[:5])}", "src")
    return manifest


def restore(src: Path, data_dir: Path, secret_key: Path | None = None) -> dict:
    """Verify `src` and copy it into `data_dir` (must not exist or be empty). Returns the manifest, with
    `secrets_to_reenter`: the sealed settings the restored app cannot open — none when `secret_key` (the source's
    secret.key, never in a backup) is given, or when the key comes from $KBQA_SECRET_KEY."""
    manifest = verify(src)
    target = check_new_dir(Path(data_dir).absolute(), "data_dir")
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(MANIFEST))
    (tmp / "restored_from.json").write_text(json.dumps(
        {"src": str(Path(src).resolve()), "created_at": manifest["created_at"], "counts": manifest["counts"]},
        ensure_ascii=False, indent=2), encoding="utf-8")
    if secret_key is not None:
        shutil.copyfile(secret_key, tmp / KEY_FILE)
    owner_only(tmp)
    if target.exists():
        target.rmdir()
    tmp.rename(target)
    keyed = secret_key is not None or bool(os.environ.get(KEY_ENV, "").strip())
    return {**manifest, "secrets_to_reenter": [] if keyed else sealed_settings(target / "app.db")}
