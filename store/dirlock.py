"""An advisory lock on a data dir (`<data>/.lock`, flock): held by the running app for its whole life.

Offline tools (audit, repair, backup on a data dir) refuse a dir whose lock is held — the app is writing there
and only the app itself can pause its writes (they go through its HTTP API instead). The kernel drops the lock
when the process dies, so a crash never leaves a stale lock behind.

Roles (app.py --role, docs/deploy.md#roles) share one data dir only where that is safe — vectors on a Chroma
server, so no process opens the embedded Chroma another one writes:

    exclusive ("both", offline tools)   LOCK_EX on .lock: alone on the dir
    "worker"                            LOCK_SH on .lock: any number of ingest workers
    "web"                               LOCK_SH on .lock + LOCK_EX on .web.lock: one web process (it alone writes
                                        the BM25 files of the data dir), with workers beside it

So a `both` process and a worker, two web processes, or a tool and any app process never hold one dir together.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"
WEB_LOCK_NAME = ".web.lock"


def _flock(path: Path, how: int, note_pid: bool) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if note_pid:  # only a sole holder writes its pid (shared holders would overwrite each other's)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
    return fd


class DataDirLock:
    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / LOCK_NAME
        self.web_path = Path(data_dir) / WEB_LOCK_NAME
        self._fds: list[int] = []

    def acquire(self, role: str = "both") -> bool:
        """True when this process now holds the lock for `role` ("both" / tools: exclusive; "worker": shared;
        "web": shared + the web lock); False when a holder that excludes it has it."""
        if self._fds:
            return True
        if role == "both":
            fd = _flock(self.path, fcntl.LOCK_EX, note_pid=True)
            if fd is None:
                return False
            self._fds = [fd]
            return True
        fd = _flock(self.path, fcntl.LOCK_SH, note_pid=False)
        if fd is None:
            return False
        self._fds = [fd]
        if role == "web":
            web = _flock(self.web_path, fcntl.LOCK_EX, note_pid=True)
            if web is None:
                self.release()
                return False
            self._fds.append(web)
        return True

    def holder(self) -> str:
        for path in (self.path, self.web_path):
            try:
                text = path.read_text().strip()
            except OSError:
                continue
            if text:
                return text
        return "?"

    def release(self) -> None:
        for fd in reversed(self._fds):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._fds = []
