"""Waiting in tests by polling a condition, never by sleeping a fixed time and hoping.

    doc = wait_until(lambda: ready_doc(doc_id), timeout=300, message="the upload to read 就绪")
    holds_for(lambda: fake.sent_chunks == sent, seconds=0.5, message="no chunk after the hang-up")

A fixed sleep is either too short on a busy 2-core machine (a flaky failure) or too long everywhere else (a slow
suite); a poll returns as soon as the condition holds and, when it never does, fails saying what it waited for
and what it saw last. These are the only sleeps in the tests' own code (the scripted stand-ins — a slow model,
a slow LLM — sleep to *be* slow; that is what they simulate, not a wait).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, interval: float = 0.1, message: str = "",
               ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call `condition()` every `interval` s until it returns something truthy, and return that. After `timeout`
    s fail with `message` (what was awaited) and the last value seen. Exceptions of the `ignoring` types (e.g. a
    connection refused while a server starts) count as "not yet"; the last one is named if time runs out."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except ignoring as exc:
            value, last = None, exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            what = message or getattr(condition, "__name__", "the condition")
            raise AssertionError(f"waited {timeout:g} s for {what}; last seen: {last!r}")
        time.sleep(interval)


def holds_for(condition: Callable[[], object], seconds: float, interval: float = 0.05, message: str = "") -> None:
    """Check that `condition()` stays truthy for `seconds` s (for "X does not happen any more"); fails at the first
    falsy value, saying which."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if not value:
            what = message or getattr(condition, "__name__", "the condition")
            raise AssertionError(f"{what} stopped holding: {value!r}")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)
