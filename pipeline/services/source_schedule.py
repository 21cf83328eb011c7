"""The timer behind the per-URL and per-folder intervals: one daemon thread per app process that, every
`poll_s`, lets the web sources and the folder sync claim what is due (each due row goes to exactly one process,
store/sources.py claim_due) — only while the engine is ready, since a fetch ends in an upload."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

POLL_S = 30.0


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
