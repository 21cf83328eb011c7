"""Keeps one app process in step with what other processes changed: the counters in `app_state`.

`check()` costs one read of a three-row table; the engine calls it before answering, searching, reporting
health and reading settings. When a counter moved since this process last saw it:

    engine_version  → reload models and settings (another process pressed 重载引擎)
    config_version  → re-read the settings from the database (another process saved settings)
    kb_generation   → rebuild BM25 from the stored tokens (a document turned 就绪 or was deleted elsewhere)

A BM25 rebuild runs in one background thread; the question that noticed the change waits up to `kb_wait_s` for
it (small knowledge bases rebuild in milliseconds, so the answer sees the new document) and questions meanwhile
use the previous index. Deleted documents are never cited even before the rebuild lands: both routes look every
hit up in the database and drop chunks that are gone or not 就绪.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pipeline.retrieval.in_flight import lower_this_thread
from store.shared_state import CONFIG_VERSION, ENGINE_VERSION, KB_GENERATION, SharedState

log = logging.getLogger(__name__)


class SharedSync:
    def __init__(self, state: SharedState, *, on_kb: Callable[[], None], on_config: Callable[[], None],
                 on_engine: Callable[[], None], kb_wait_s: float = 3.0):
        self.state = state
        self.on_kb = on_kb
        self.on_config = on_config
        self.on_engine = on_engine
        self.kb_wait_s = kb_wait_s
        self.seen = state.read()
        self._lock = threading.Lock()
        self._kb_cond = threading.Condition()
        self._kb_wanted = 0      # refresh requests so far
        self._kb_done = 0        # requests served by a finished pass
        self._kb_running = False
        self._closed = False     # close(): the app is stopping, no pass starts or goes on

    # --- what other processes changed -------------------------------------------------------------
    def check(self) -> None:
        now = self.state.read()
        with self._lock:
            engine_moved = now.get(ENGINE_VERSION) != self.seen.get(ENGINE_VERSION)
            config_moved = now.get(CONFIG_VERSION) != self.seen.get(CONFIG_VERSION)
            if engine_moved or config_moved:
                self.seen[ENGINE_VERSION], self.seen[CONFIG_VERSION] = now[ENGINE_VERSION], now[CONFIG_VERSION]
        if engine_moved:
            log.info("engine reloaded by another process: reloading here")
            self.on_engine()
        elif config_moved:
            log.info("settings changed by another process: re-reading them")
            self.on_config()
        if now.get(KB_GENERATION) != self.seen.get(KB_GENERATION):
            with self._kb_cond:
                busy = self._kb_running or self._kb_wanted > self._kb_done
            if not busy:  # a pass already under way will record what it saw; the next check catches up
                self.refresh_kb(wait=self.kb_wait_s)

    def catch_up(self) -> None:
        """`check`, best effort: the request that asked reports a database outage itself."""
        try:
            self.check()
        except Exception:
            log.exception("checking shared state failed")

    # --- what this process changed ----------------------------------------------------------------
    def bumped(self, name: str, value: int) -> None:
        """This process moved counter `name` to `value`: no need to react to it. When another process moved it
        meanwhile (value skips), leave it unseen so the next check picks their change up."""
        with self._lock:
            if value == self.seen.get(name, 0) + 1:
                self.seen[name] = value

    def bump(self, name: str) -> int:
        value = self.state.bump(name)
        self.bumped(name, value)
        return value

    def refresh_kb(self, wait: float | None = None) -> bool:
        """Rebuild BM25 in a pass that starts after this call; wait up to `wait` seconds (None: until done).
        True when that pass finished in time."""
        with self._kb_cond:
            self._kb_wanted += 1
            want = self._kb_wanted
            if not self._kb_running and not self._closed:
                self._kb_running = True
                threading.Thread(target=self._kb_passes, name="bm25-refresh", daemon=True).start()
            return self._kb_cond.wait_for(lambda: self._kb_done >= want or (self._closed and not self._kb_running),
                                          timeout=wait) and self._kb_done >= want

    def close(self, timeout: float = 30.0) -> None:
        """No new refresh pass starts; one in flight is waited for (it rebuilds BM25 into the data dir)."""
        with self._kb_cond:
            self._closed = True
            self._kb_cond.wait_for(lambda: not self._kb_running, timeout=timeout)

    def _kb_passes(self) -> None:
        lower_this_thread()  # BM25 rebuilds: questions first (pipeline/retrieval/in_flight.py)
        while True:
            with self._kb_cond:
                target = self._kb_wanted
            try:
                gen = self.state.read()[KB_GENERATION]  # read before the tokens: a later change stays unseen
                self.on_kb()
                with self._lock:
                    self.seen[KB_GENERATION] = max(self.seen.get(KB_GENERATION, 0), gen)
            except Exception:
                log.exception("BM25 refresh failed")
            with self._kb_cond:
                self._kb_done = target
                self._kb_cond.notify_all()
                if self._kb_wanted == target or self._closed:
                    self._kb_running = False
                    return
