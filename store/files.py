"""Uploaded originals under `<data>/uploads/` with generated names.

A user's file name never chooses a path (`../../x.txt`, `/`, NUL, 300 characters): the stored name is
`<md5>.<ext>` with a whitelisted extension; the display name is kept only in SQLite.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import unicodedata
from pathlib import Path

SAFE_EXTS = {"txt", "md", "pdf", "docx", "xlsx", "csv"}


def display_name(raw: str) -> str:
    """A printable display name: last path component, control characters dropped, ≤ 200 characters."""
    name = (raw or "").replace("\\", "/").split("/")[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip()
    if len(name) > 200:
        stem, dot, ext = name.rpartition(".")
        name = (stem[: 200 - len(ext) - 1] + "." + ext) if dot and len(ext) <= 10 else name[:200]
    return name or "未命名"


def file_digest(path: Path, algorithm: str = "md5") -> str:
    """Hex digest of a file, read in 1 MiB blocks (md5 names uploads; backups record sha256)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def md5_of(path: Path) -> str:
    return file_digest(path, "md5")


class FileStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)  # originals: the owner only (mkstemp files 0600)

    def stored_name(self, md5: str, file_type: str, kb_id: int = 1) -> str:
        """`<md5>.<ext>` in the default knowledge base (as the first release named them), `kb<id>-<md5>.<ext>` in
        the others: the same file in two knowledge bases is two stored files, deleted independently."""
        if file_type not in SAFE_EXTS or not all(c in "0123456789abcdef" for c in md5):
            raise ValueError("unsafe stored name")
        return f"{md5}.{file_type}" if int(kb_id) == 1 else f"kb{int(kb_id)}-{md5}.{file_type}"

    def path_of(self, stored_name: str) -> Path:
        p = (self.root / stored_name).resolve()
        if p.parent != self.root.resolve():
            raise ValueError("path escapes the upload folder")
        return p

    def save(self, src: Path, md5: str, file_type: str, kb_id: int = 1) -> str:
        """Copy an uploaded temp file in atomically; returns the stored name."""
        name = self.stored_name(md5, file_type, kb_id)
        dest = self.path_of(name)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".up-")
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)  # into mkstemp's 0600 file: the mode stays
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return name

    def delete(self, stored_name: str | None) -> None:
        if not stored_name:
            return
        try:
            self.path_of(stored_name).unlink(missing_ok=True)
        except ValueError:
            pass

    def listing(self) -> dict[str, float]:
        """name → modification time of every file in the upload folder (temp files of uploads included)."""
        return {p.name: p.stat().st_mtime for p in self.root.iterdir() if p.is_file()}

