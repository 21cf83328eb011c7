"""Questions computing now, and what background work yields to them.

A question's CPU work is retrieval (embedding, both routes, fusion, the gate), the rerank and an extractive answer;
while an LLM writes the answer this process only waits, so that is not counted. Background work in the same
process — the gate background's re-measurement between probes, the ingest between embedding batches — calls
`wait_idle` first: it goes on once no question computes, or after a bounded wait so that it never starves under
a steady stream of questions (8 clients asking back to back keep one in flight nearly all the time).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class QuestionsInFlight:
    def __init__(self):
        self._n = 0
        self._idle = threading.Condition()

    @contextmanager
    def computing(self) -> Iterator[None]:
        with self._idle:
            self._n += 1
        try:
            yield
        finally:
            with self._idle:
                self._n -= 1
                if self._n == 0:
                    self._idle.notify_all()

    def busy(self) -> bool:
        return self._n > 0

    def wait_idle(self, timeout: float) -> bool:
        """Block until no question computes (True) or `timeout` seconds passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._n == 0, timeout)


BACKGROUND_NICE = 10  # how much lower background threads run than the threads answering questions


def lower_this_thread() -> None:
    """Run the calling thread (and processes it starts, e.g. a parse worker) at a lower priority. Linux keeps a
    nice value per thread, so within the app's process the scheduler gives the cores to the threads answering
    questions first, while background work (ingest, BM25 rebuilds, the gate background refresh) still uses
    whatever they leave. Where the platform has no per-thread nice this does nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICE))
    except (AttributeError, OSError):
        pass
