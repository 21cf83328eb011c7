"""A write lock over the whole data dir: writes that span stores hold it shared, a backup holds it exclusively.

SQLite alone would give a consistent snapshot (its online backup API), but a document lives in three places
(SQLite rows, Chroma vectors, the original under uploads/). A delete that had removed the vectors but not yet
the rows, caught by a backup, would restore as a 就绪 document without vectors. So every write that touches
more than one store runs inside `writing()`, and a backup copies inside `frozen()`: it waits for the writes in
flight, new writes wait for it, questions (readers) never wait.

Writer-preferring (a waiting backup is not starved by a steady stream of writes) and re-entrant per thread
for `writing()` (a repair that cleans a document through the ingest service must not deadlock on itself).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager


class WriteLock:
    def __init__(self):
        self._cond = threading.Condition()
        self._writers = 0
        self._frozen = False
        self._waiting_freeze = 0
        self._local = threading.local()

    @contextmanager
    def writing(self):
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            with self._cond:
                while self._frozen or self._waiting_freeze:
                    self._cond.wait()
                self._writers += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._writers -= 1
                    self._cond.notify_all()

    @contextmanager
    def frozen(self):
        if getattr(self._local, "depth", 0):
            raise RuntimeError("cannot freeze the data dir from inside a write")
        with self._cond:
            self._waiting_freeze += 1
            try:
                while self._frozen or self._writers:
                    self._cond.wait()
            finally:
                self._waiting_freeze -= 1
            self._frozen = True
        try:
            yield
        finally:
            with self._cond:
                self._frozen = False
                self._cond.notify_all()
