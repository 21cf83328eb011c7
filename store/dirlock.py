"""An advisory lock on a data dir (`<data>/.lock`, flock): held by the running app for its whole life.

Offline tools (audit, repair, backup on a data dir) refuse a dir whose lock is held — the app is writing there
and only the app itself can pause its writes (they go through its HTTP API instead). The kernel drops the lock
when the process dies, so a crash never leaves a stale lock behind.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class DataDirLock:
    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """True when this process now holds the lock; False when another holder has it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
