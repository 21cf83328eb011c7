"""Per-question stage timings without shared mutable state.

The fusion retriever is built once and serves concurrent questions, so it cannot keep "the last timings" on
itself. The caller opens `collect()` around one `retrieve` call; code below it records into that call's own
dict with `stage(name)` (a ContextVar, so each thread/question has its own).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[dict[str, float] | None] = ContextVar("retrieval_timings", default=None)


@contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Milliseconds per stage recorded by everything run inside the block."""
    timings: dict[str, float] = {}
    token = _current.set(timings)
    try:
        yield timings
    finally:
        _current.reset(token)


@contextmanager
def stage(name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings = _current.get()
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + (time.perf_counter() - t0) * 1000


def merge(timings: dict[str, float]) -> None:
    """Add finished timings into the enclosing collector, if any."""
    outer = _current.get()
    if outer is not None:
        for k, v in timings.items():
            outer[k] = outer.get(k, 0.0) + v
