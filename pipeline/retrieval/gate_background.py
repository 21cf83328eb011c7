"""The knowledge base's own background for the no-answer gate: how the probe questions (gate_probes.py) score.

A raw cosine means little across knowledge bases (e5 puts every question near 0.9 in a legal corpus); the same
cosine measured against what unrelated questions get in this very knowledge base does. `GateBackground` scores
the probes, keeps robust statistics (median, MAD-scale) in SQLite (store/gate_stats.py) and hands them to the
gate. It is refreshed after every ingest / delete / rebuild (the engine's post-change hook); a question that finds
it stale (first start of an old data dir) refreshes it once.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.retrieval.gate_features import GateFeatures
from pipeline.retrieval.gate_probes import PROBES
from store.gate_stats import GateStatsStore

log = logging.getLogger(__name__)

MIN_SIM_SCALE = 0.005   # a background whose probes all score alike must not turn tiny gaps into huge z
MIN_COV_SCALE = 0.05
MAD_TO_SD = 1.4826      # MAD of a normal distribution × this = its standard deviation
REFRESH_DELAY_S = 2.0


@dataclass(frozen=True)
class Background:
    probes: int
    sim_median: float
    sim_scale: float
    cov_median: float
    cov_scale: float
    measured_ms: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Background":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def sim_z(self, sim: float) -> float:
        return (sim - self.sim_median) / self.sim_scale

    def cov_z(self, cov: float) -> float:
        return (cov - self.cov_median) / self.cov_scale


def _robust(values: Sequence[float], floor: float) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    med = float(np.median(v))
    return med, max(float(np.median(np.abs(v - med))) * MAD_TO_SD, floor)


def summarize(feats: Sequence[GateFeatures], measured_ms: float = 0.0) -> Background:
    sim_med, sim_scale = _robust([f.max_similarity for f in feats], MIN_SIM_SCALE)
    cov_med, cov_scale = _robust([f.coverage for f in feats], MIN_COV_SCALE)
    return Background(len(feats), sim_med, sim_scale, cov_med, cov_scale, round(measured_ms, 1))


class GateBackground:
    """Measure / store / serve the background. `measure_probe(q)` runs one question through retrieval."""

    def __init__(self, store: GateStatsStore, model_id: Callable[[], str],
                 measure_probe: Callable[[str], GateFeatures], snapshot: Callable[[], object],
                 probes: Sequence[str] = PROBES):
        self.store = store
        self.model_id = model_id
        self.measure_probe = measure_probe
        self.snapshot = snapshot    # the BM25 snapshot object: replaced on every knowledge-base change
        self.probes = tuple(probes)
        self._cached: tuple[object, Background | None] | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def fingerprint(self) -> str:
        count, max_id = self.store.ready_fingerprint_parts()
        return f"{self.model_id()}|{count}|{max_id}|{len(self.probes)}"

    def refresh(self) -> Background | None:
        """Score the probes now and store the result (None for an empty knowledge base)."""
        with self._lock:
            return self._refresh_locked()

    def refresh_soon(self, delay: float = REFRESH_DELAY_S) -> None:
        """Refresh once the knowledge base has been quiet for `delay` seconds (a bulk upload drains the ingest
        queue many times; scoring the probes after each would cost ~1 s each time)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(delay, self._refresh_quietly)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except Exception:  # noqa: BLE001 — a failed refresh is retried by the next question (current())
            log.exception("gate background refresh failed")

    def _refresh_locked(self) -> Background | None:
        snap = self.snapshot()
        fp = self.fingerprint()
        if fp.split("|")[1] == "0":
            self._cached = (snap, None)
            return None
        t0 = time.perf_counter()
        bg = summarize([self.measure_probe(q) for q in self.probes], (time.perf_counter() - t0) * 1000)
        self.store.save(fp, bg.to_dict())
        self._cached = (snap, bg)
        log.info("gate background: %d probes, similarity median %.4f scale %.4f (%.0f ms)", bg.probes,
                 bg.sim_median, bg.sim_scale, bg.measured_ms)
        return bg

    def current(self) -> Background | None:
        """The background of the knowledge base as it is now (measured first if it is stale)."""
        snap = self.snapshot()
        cached = self._cached
        if cached is not None and cached[0] is snap:
            return cached[1]
        with self._lock:
            cached = self._cached
            if cached is not None and cached[0] is snap:
                return cached[1]
            stored = self.store.load()
            if stored is not None and stored[0] == self.fingerprint():
                bg = Background.from_dict(stored[1])
                self._cached = (snap, bg)
                return bg
            return self._refresh_locked()
