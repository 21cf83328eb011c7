"""The timer behind the per-URL and per-folder intervals: one daemon thread per app process that, every
`poll_s`, lets the web sources and the folder sync claim what is due (each due row goes to exactly one process,
store/sources.py claim_due) — only while the engine is ready, since a fetch ends in an upload."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.components import Components
    from pipeline.services.audit_log import AuditLog
    from pipeline.services.documents import DocumentService
    from pipeline.settings import Settings

log = logging.getLogger(__name__)

POLL_S = 30.0


class FollowedSources:
    """What the web pages and the synced folders a knowledge base follows share: their wiring, and the
    scheduler's tick that runs every source of this kind whose interval ran out and that this process claimed.
    A subclass names its store (`store_type`, over the database) and what one scheduled run does (`_run_due_one`)."""

    store_type: Any
    kind = "source"

    def __init__(self, c: Components, documents: DocumentService, audit: AuditLog,
                 settings: Callable[[], Settings], clock: Callable[[], float] = time.time):
        self.c = c
        self.documents = documents
        self.audit = audit
        self.settings = settings
        self.clock = clock
        self.store = self.store_type(c.db)

    def run_due(self, now: float | None = None) -> int:
        claimed = self.store.claim_due(self.clock() if now is None else now)
        for source_id in claimed:
            src = self.store.get(source_id)
            if src is not None:
                try:
                    self._run_due_one(src)
                except Exception:  # one broken source must not stop the others
                    log.exception("scheduled run of %s %s failed", self.kind, source_id)
        return len(claimed)

    def _run_due_one(self, src: dict) -> None:
        raise NotImplementedError


class SourceSchedule:
    def __init__(self, ticks: list[Callable[[], int]], ready: Callable[[], bool], poll_s: float = POLL_S):
        self.ticks = ticks
        self.ready = ready
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="source-schedule", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self.ready():
                continue
            for tick in self.ticks:
                if self._stop.is_set():
                    return
                try:
                    tick()
                except Exception:  # a broken source must not stop the timer for the others
                    log.exception("source schedule tick failed")

    def close(self, timeout: float = 30.0) -> None:
        """Stop; a fetch or sync in progress finishes first (it writes into the stores)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
