"""The knowledge base's own background for the no-answer gate: how the probe questions (gate_probes.py) score.

A raw cosine means little across knowledge bases (e5 puts every question near 0.9 in a legal corpus); the same
cosine measured against what unrelated questions get in this very knowledge base does. `GateBackground` scores
the probes against ONE knowledge base (its own chunks and term statistics), keeps robust statistics (median,
MAD-scale) and the probes' own best cosines in SQLite / PostgreSQL (store/gate_stats.py, one row per kb_id) and
hands them to the gate. `GateBackgrounds` holds one per knowledge base; after every ingest / delete / rebuild
(the engine's post-change hook) each one whose knowledge base changed measures again; a question that finds one
stale (first start of an old data dir) refreshes it once.

A question over several knowledge bases gets `combine`: per probe the BEST cosine over those knowledge bases,
then the same robust statistics — exactly the background the probes would give if they were asked over the
union (the question's own best cosine is the best over the union too), without scoring the probes for every
combination of knowledge bases a user may pick.

No question waits for a measurement (issue 27: p95 21.9 s while a 64-probe refresh ran for 22.7 s during an
ingest). Under GateBackgrounds, while a knowledge base's background is being measured, or is stale and a
refresh is pending, a question uses the previous one — marked `state="previous"`, which the gate's trace
shows. A knowledge base that has never been measured has no previous background, and the floor alone answers
off-topic questions (the SRS case 「2022年世界杯…」 got an LLM answer), so its first question measures a quick
background of its own — every QUICK_STRIDE-th probe, a fraction of a second — marked `state="quick"`, and the
full measurement is scheduled; questions use the quick one until it is done.
The refresh yields to questions: between two probes it pauses while a question is being retrieved (`busy`),
and at least PROBE_PAUSE_S.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.retrieval.gate_features import GateFeatures
from pipeline.retrieval.gate_probes import PROBES
from pipeline.retrieval.in_flight import lower_this_thread
from store.gate_stats import GateStatsStore
from store.migrations import DEFAULT_KB_ID

log = logging.getLogger(__name__)

MIN_SIM_SCALE = 0.005   # a background whose probes all score alike must not turn tiny gaps into huge z
MIN_COV_SCALE = 0.05
MAD_TO_SD = 1.4826      # MAD of a normal distribution × this = its standard deviation
REFRESH_DELAY_S = 2.0
PROBE_PAUSE_S = 0.01   # between two probes of a refresh, always (other threads get the GIL and the cores)
YIELD_MAX_S = 2.0      # the longest a refresh waits, per probe, for the questions in flight to finish
QUICK_STRIDE = 8       # a never-measured knowledge base's first question scores every 8th probe (8 of 64)


@dataclass(frozen=True)
class Background:
    probes: int
    sim_median: float
    sim_scale: float
    cov_median: float
    cov_scale: float
    measured_ms: float = 0.0
    probe_sims: tuple[float, ...] = ()  # each probe's best cosine, in PROBES order (what `combine` merges)
    probe_covs: tuple[float, ...] = ()
    sent_median: float | None = None    # the probes' median best-sentence cosine (None: not measured)
    probe_sents: tuple[float, ...] = ()
    # "previous": the KB changed and its refresh is pending or running; "quick": the KB was never measured, this is
    # the quick estimate its first question made (module doc). Neither is stored.
    state: str = "current"

    def previous(self) -> "Background":
        return self if self.state == "previous" else dataclasses.replace(self, state="previous")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("state")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Background":
        got = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        for k in ("probe_sims", "probe_covs", "probe_sents"):
            got[k] = tuple(float(x) for x in got.get(k, ()))
        return cls(**got)

    def sim_z(self, sim: float) -> float:
        return (sim - self.sim_median) / self.sim_scale

    def sim_above(self, sim: float) -> float:
        """How far a cosine stands above this KB's background median, in hundredths of cosine. The raw
        difference, not a z: the MAD of 64 probes is a noisy scale that shrinks with the knowledge base, and
        dividing by it moved every score of a small knowledge base up (docs/retrieval-eval.md)."""
        return (sim - self.sim_median) * 100.0

    def sent_above(self, sent: float) -> float | None:
        return None if self.sent_median is None else (sent - self.sent_median) * 100.0


def _robust(values: Sequence[float], floor: float) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    med = float(np.median(v))
    return med, max(float(np.median(np.abs(v - med))) * MAD_TO_SD, floor)


def summarize(feats: Sequence[GateFeatures], measured_ms: float = 0.0) -> Background:
    sents = [f.best_sentence for f in feats]
    return _from_values([f.max_similarity for f in feats], [f.coverage for f in feats], measured_ms,
                        sents if sents and all(x is not None for x in sents) else ())


def _from_values(sims: Sequence[float], covs: Sequence[float], measured_ms: float = 0.0,
                 sents: Sequence[float] = ()) -> Background:
    sim_med, sim_scale = _robust(sims, MIN_SIM_SCALE)
    cov_med, cov_scale = _robust(covs, MIN_COV_SCALE)
    return Background(len(sims), sim_med, sim_scale, cov_med, cov_scale, round(measured_ms, 1),
                      tuple(round(float(x), 5) for x in sims), tuple(round(float(x), 4) for x in covs),
                      float(np.median(sents)) if len(sents) else None, tuple(round(float(x), 5) for x in sents))


def combine(backgrounds: Sequence[Background | None]) -> Background | None:
    """The background of a question asked over several knowledge bases (module doc): per probe the best cosine
    (and coverage) over them. Knowledge bases without one (empty) add nothing. Backgrounds whose probe lists
    differ (a row stored before probe values were kept) cannot be merged per probe: the strictest one — the
    highest median, so the smallest z for any cosine — stands for all."""
    got = [b for b in backgrounds if b is not None]
    if len(got) <= 1:
        return got[0] if got else None
    n = len(got[0].probe_sims)
    if n == 0 or any(len(b.probe_sims) != n or len(b.probe_covs) != n for b in got):
        out = max(got, key=lambda b: b.sim_median)
    else:
        sims = np.max([b.probe_sims for b in got], axis=0)
        covs = np.max([b.probe_covs for b in got], axis=0)
        sents = np.max([b.probe_sents for b in got], axis=0) if all(len(b.probe_sents) == n for b in got) else ()
        out = _from_values(sims, covs, sum(b.measured_ms for b in got), sents)
    return out.previous() if any(b.state == "previous" for b in got) else out


class GateBackground:
    """Measure / store / serve the background of one knowledge base. `measure_probe(q)` runs one question
    through retrieval scoped to that knowledge base; `sentences`: it measures the probes' sentence evidence too
    (the embedding model's gate is two-stage, its calibration profile says)."""

    def __init__(self, store: GateStatsStore, model_id: Callable[[], str],
                 measure_probe: Callable[[str], GateFeatures], snapshot: Callable[[], object],
                 probes: Sequence[str] = PROBES, kb_id: int = DEFAULT_KB_ID, sentences: bool = True):
        self.sentences = sentences
        self.store = store
        self.kb_id = kb_id
        self.model_id = model_id
        self.measure_probe = measure_probe
        self.snapshot = snapshot    # the KB's BM25 (snapshot, delta) pair: replaced on every change of that KB
        self.probes = tuple(probes)
        self._cached: tuple[object, Background | None] | None = None
        self._lock = threading.Lock()  # held while measuring
        self._quick_lock = threading.Lock()  # one quick estimate at a time (the others wait for it: short)
        # Set by GateBackgrounds: `schedule()` asks for a refresh in its background thread (then questions never
        # measure a stale background themselves), `pause()` runs between two probes (yield to questions).
        self.schedule: Callable[[], None] | None = None
        self.pause: Callable[[], None] = lambda: None

    def fingerprint(self) -> str:
        count, max_id = self.store.ready_fingerprint_parts(self.kb_id)
        # "s": rows measured with the probes' best-sentence cosine (a two-stage gate reads it), "q" without; a row of
        # the other kind (an older release, or the model's profile changed from one to two stages) is measured again
        return f"{self.model_id()}|{count}|{max_id}|{len(self.probes)}|{'s' if self.sentences else 'q'}"

    def refresh(self) -> Background | None:
        """Score the probes now and store the result (None for an empty knowledge base)."""
        with self._lock:
            return self._refresh_locked()

    def refresh_if_changed(self) -> Background | None:
        """Measure again only when the stored row does not match the knowledge base as it is now."""
        with self._lock:
            return self._stored_or_measured(self.snapshot(), yield_cpu=True)

    def _stored_or_measured(self, snap, yield_cpu: bool = False) -> Background | None:
        stored = self.store.load(self.kb_id)
        if stored is not None and stored[0] == self.fingerprint():
            bg = Background.from_dict(stored[1])
            self._cached = (snap, bg)
            return bg
        return self._refresh_locked(yield_cpu)

    def _refresh_locked(self, yield_cpu: bool = False) -> Background | None:
        """Measure now. yield_cpu (the background refresh, never a question measuring for itself): pause()
        between probes."""
        snap = self.snapshot()
        fp = self.fingerprint()
        if fp.split("|")[1] == "0":
            self._cached = (snap, None)
            return None
        t0 = time.perf_counter()
        feats = []
        for q in self.probes:
            feats.append(self.measure_probe(q))
            if yield_cpu:
                self.pause()
        bg = summarize(feats, (time.perf_counter() - t0) * 1000)
        self.store.save(self.kb_id, fp, bg.to_dict())
        self._cached = (snap, bg)
        log.info("gate background of kb %d: %d probes, similarity median %.4f scale %.4f (%.0f ms)", self.kb_id,
                 bg.probes, bg.sim_median, bg.sim_scale, bg.measured_ms)
        return bg

    def current(self) -> Background | None:
        """The background of the knowledge base as it is now. Stale: measured first when nothing else can (no
        schedule); under GateBackgrounds the previous one while a refresh is pending or running (module doc)."""
        snap = self.snapshot()
        cached = self._cached
        if cached is not None and cached[0] is snap:
            return cached[1]
        if not self._lock.acquire(blocking=self.schedule is None):
            # being measured now: never wait for it — the previous background, else a quick one of its own
            return self._previous(cached) or self._quick(snap)
        try:
            cached = self._cached
            if cached is not None and cached[0] is snap:
                return cached[1]
            stored = self.store.load(self.kb_id)
            if stored is not None and stored[0] == self.fingerprint():
                bg = Background.from_dict(stored[1])
                self._cached = (snap, bg)
                return bg
            if self.schedule is not None:
                # measured in the background thread; this question uses the previous one, or a quick one
                self.schedule()
                prev = self._previous(cached, stored)
                if prev is not None:
                    return prev
            else:
                return self._refresh_locked()  # nothing to schedule it (offline tools): measure now
        finally:
            self._lock.release()
        return self._quick(snap)

    def _quick(self, snap) -> Background | None:
        """The never-measured case (module doc): a background from every QUICK_STRIDE-th probe, kept until the
        full measurement replaces it. None for an empty knowledge base."""
        with self._quick_lock:
            cached = self._cached
            if cached is not None and cached[0] is snap:
                return cached[1]  # made by a question that held this lock before, or measured in full meanwhile
            if self.fingerprint().split("|")[1] == "0":
                return None
            t0 = time.perf_counter()
            feats = [self.measure_probe(q) for q in self.probes[::QUICK_STRIDE]]
            bg = dataclasses.replace(summarize(feats, (time.perf_counter() - t0) * 1000), state="quick")
            cached = self._cached
            if cached is None or cached[0] is not snap:  # a full measurement that finished first wins
                self._cached = (snap, bg)
            log.info("gate background of kb %d: quick estimate from %d probes (%.0f ms); the full one is scheduled",
                     self.kb_id, bg.probes, bg.measured_ms)
            return bg

    def _previous(self, cached, stored=None) -> Background | None:
        """The last background known (cached, else the stored row whatever its fingerprint), marked previous."""
        if cached is not None and cached[1] is not None:
            return cached[1].previous()
        if stored is None:
            try:
                stored = self.store.load(self.kb_id)
            except Exception:  # noqa: BLE001 — no previous one then (the floor-only path)
                stored = None
        return Background.from_dict(stored[1]).previous() if stored is not None else None


class _Closing(Exception):
    """Raised between two probes of a background refresh once the engine closes."""


class GateBackgrounds:
    """One GateBackground per knowledge base (made on first use), the combination for a question's scope, and
    the debounced refresh after knowledge-base changes. `make(kb_id)` builds the one of a knowledge base."""

    def __init__(self, store: GateStatsStore, make: Callable[[int], GateBackground],
                 kb_ids: Callable[[], Sequence[int]], busy: Callable[[], bool] = lambda: False):
        self.store = store
        self._make = make
        self._kb_ids = kb_ids
        self._busy = busy  # a question is being answered: the refresh waits between probes
        self._of: dict[int, GateBackground] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        # every timer that may still run: a newer refresh_soon cancels the pending one, but one already measuring
        # goes on (and must be waited for at close — a thread inside the model at interpreter exit aborts it)
        self._timers: list[threading.Timer] = []
        self._closed = False  # set by cancel(): the engine is closing, no refresh may start or go on

    def of(self, kb_id: int) -> GateBackground:
        with self._lock:
            gb = self._of.get(kb_id)
            if gb is None:
                gb = self._of[kb_id] = self._make(kb_id)
                gb.schedule = self.request_refresh
                gb.pause = self._yield_to_questions
            return gb

    def request_refresh(self) -> None:
        """A question found a background stale: have it measured soon, unless a refresh is already pending or
        running (it looks at every knowledge base)."""
        timer = self._timer
        if timer is None or not timer.is_alive():
            self.refresh_soon()

    def _yield_to_questions(self) -> None:
        if self._closed:
            raise _Closing()  # between two probes: a closing engine does not wait for the other probes
        time.sleep(PROBE_PAUSE_S)
        deadline = time.monotonic() + YIELD_MAX_S
        while self._busy() and not self._closed and time.monotonic() < deadline:
            time.sleep(0.02)

    @property
    def probes(self) -> tuple[str, ...]:
        return self.of(DEFAULT_KB_ID).probes

    def current(self, kb_ids: Sequence[int] | None = None) -> Background | None:
        """The background for a question over these knowledge bases (None: the default one, as Engine.ask)."""
        ids = sorted(set(kb_ids)) if kb_ids else [DEFAULT_KB_ID]
        if len(ids) == 1:
            return self.of(ids[0]).current()
        return combine([self.of(k).current() for k in ids])

    def forget(self, kb_id: int) -> None:
        """A knowledge base was deleted: its background goes with it."""
        with self._lock:
            self._of.pop(kb_id, None)
        self.store.delete(kb_id)

    def refresh_soon(self, delay: float = REFRESH_DELAY_S) -> None:
        """Once the knowledge bases have been quiet for `delay` seconds, measure every one whose content changed
        (a bulk upload drains the ingest queue many times; scoring the probes after each would cost ~1 s each
        time; the fingerprint tells the changed knowledge bases from the others)."""
        with self._lock:
            if self._closed:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(delay, self._refresh_quietly)
            self._timer.daemon = True
            self._timers = [t for t in self._timers if t.is_alive()] + [self._timer]
            self._timer.start()

    def cancel(self, wait: float = 30.0) -> None:
        """Stop: a pending refresh never starts, one that runs stops after its current knowledge base and is
        waited for — it embeds probes in onnxruntime, and a daemon thread still inside it when the interpreter
        exits crashes the process (seen as rc 134/139 after a passing test run)."""
        with self._lock:
            self._closed = True
            timers = list(self._timers)
        deadline = time.monotonic() + wait
        for timer in timers:
            timer.cancel()
            if timer.is_alive() and timer is not threading.current_thread():
                timer.join(max(0.0, deadline - time.monotonic()))

    def _refresh_quietly(self) -> None:
        lower_this_thread()  # questions first (pipeline/retrieval/in_flight.py)
        for kb_id in list(self._kb_ids()):
            if self._closed:
                return
            try:
                self.of(kb_id).refresh_if_changed()
            except _Closing:
                return
            except Exception:  # noqa: BLE001 — a failed refresh is retried by the next question (current())
                log.exception("gate background refresh of kb %s failed", kb_id)
