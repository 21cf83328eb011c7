"""Structured ingest progress: each document's stage (排队 n / 解析 / OCR n/m 页 / 切块 / 向量化 n/m / 写入), its
counts, and an ETA from the measured rates.

In memory, owned by the IngestService (the worker's own bookkeeping; nothing to persist: after a restart the
documents are re-queued). Rates are learnt while working: embedding chunks/s (per batch, smoothed), seconds per
OCR page, and bytes per chunk per file type (to guess how many chunks a queued document will make). Until a rate
has been measured the ETA is None (「估算中」).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STAGES = ("queued", "parse", "ocr", "chunk", "embed", "write")
STAGE_LABELS = {"queued": "排队", "parse": "解析", "ocr": "OCR", "chunk": "切块", "embed": "向量化", "write": "写入"}
UNITS = {"ocr": "页", "embed": "块"}
SMOOTH = 0.3  # weight of the newest measurement in the moving averages
DEFAULT_BYTES_PER_CHUNK = 750.0  # ~250 new characters per 300-character chunk, 3 bytes each in UTF-8


@dataclass
class _Doc:
    size: int
    file_type: str
    stage: str = "queued"
    done: int = 0
    total: int = 0
    stage_started: float = 0.0
    chunks: int | None = None  # known once chunked


@dataclass
class _Rates:
    chunks_per_s: float | None = None
    ocr_s_per_page: float | None = None
    bytes_per_chunk: dict[str, float] = field(default_factory=dict)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTH) * old + SMOOTH * new


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "估算中"
    s = max(0, round(seconds))
    if s < 60:
        return f"约 {max(s, 1)} 秒"
    if s < 3600:
        return f"约 {round(s / 60)} 分钟"
    return f"约 {s / 3600:.1f} 小时"


def stage_text(stage: str, done: int = 0, total: int = 0, position: int | None = None) -> str:
    label = STAGE_LABELS.get(stage, stage)
    if stage == "queued":
        return f"{label} 第 {position} 位" if position else label
    if stage in UNITS and total:
        return f"{label} {done}/{total} {UNITS[stage]}"
    return label


def shared_snapshot(row: dict | None) -> dict | None:
    """The board's snapshot shape from a job's progress in the database (store.jobs.JobStore.progress): how a
    document another process works on, or waits for, shows here."""
    if row is None:
        return None
    stage, done, total, position = row["stage"], row["done"], row["total"], row["position"]
    eta = row.get("eta_s")
    return {"stage": stage, "stage_label": STAGE_LABELS.get(stage, stage), "done": done, "total": total,
            "position": position, "eta_s": None if eta is None else round(float(eta), 1),
            "progress": stage_text(stage, done, total, position)}


class ProgressBoard:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._docs: dict[int, _Doc] = {}
        self._waiting: list[int] = []  # queue order
        self.rates = _Rates()

    # --- the worker reports ---------------------------------------------------------------------------------
    def queued(self, doc_id: int, size: int, file_type: str) -> None:
        with self._lock:
            self._docs[doc_id] = _Doc(int(size or 0), file_type or "", stage_started=self._clock())
            if doc_id not in self._waiting:
                self._waiting.append(doc_id)

    def stage(self, doc_id: int, stage: str, done: int = 0, total: int = 0) -> None:
        """Enter `stage` (or update its counts when already in it)."""
        with self._lock:
            d = self._docs.get(doc_id)
            if d is None:
                d = self._docs[doc_id] = _Doc(0, "")
            if doc_id in self._waiting:
                self._waiting.remove(doc_id)
            now = self._clock()
            if d.stage != stage:
                if d.stage == "ocr" and d.done:  # learn seconds per OCR page from the finished OCR stage
                    self.rates.ocr_s_per_page = _ema(self.rates.ocr_s_per_page, (now - d.stage_started) / d.done)
                d.stage, d.stage_started = stage, now
            d.done, d.total = int(done), int(total)

    def chunked(self, doc_id: int, n_chunks: int) -> None:
        with self._lock:
            d = self._docs.get(doc_id)
            if d is None or n_chunks <= 0:
                return
            d.chunks = n_chunks
            if d.size:
                old = self.rates.bytes_per_chunk.get(d.file_type)
                self.rates.bytes_per_chunk[d.file_type] = _ema(old, d.size / n_chunks)

    def embedded(self, n_chunks: int, seconds: float) -> None:
        """One embedding batch of `n_chunks` took `seconds` (the rate every ETA uses)."""
        if n_chunks > 0 and seconds > 0:
            with self._lock:
                self.rates.chunks_per_s = _ema(self.rates.chunks_per_s, n_chunks / seconds)

    def finish(self, doc_id: int) -> None:
        with self._lock:
            self._docs.pop(doc_id, None)
            if doc_id in self._waiting:
                self._waiting.remove(doc_id)

    # --- readers -------------------------------------------------------------------------------------------
    def holds(self, doc_id: int) -> bool:
        return doc_id in self._docs

    @property
    def queue_length(self) -> int:
        return len(self._waiting)


    def snapshot(self, doc_id: int) -> dict | None:
        """{stage, stage_label, done, total, position, eta_s, text} of a document the worker holds, else None."""
        with self._lock:
            d = self._docs.get(doc_id)
            if d is None:
                return None
            position = self._waiting.index(doc_id) + 1 if doc_id in self._waiting else None
            eta = self._eta_locked(doc_id)
        eta_s = None if eta is None else round(eta, 1)
        return {"stage": d.stage, "stage_label": STAGE_LABELS.get(d.stage, d.stage), "done": d.done,
                "total": d.total, "position": position, "eta_s": eta_s,
                "text": stage_text(d.stage, d.done, d.total, position)}

    def _remaining_locked(self, d: _Doc) -> float | None:
        """Seconds this document still needs on its own (None when no rate is known yet)."""
        r = self.rates
        if d.stage == "embed" and d.total:
            rate = r.chunks_per_s
            elapsed = self._clock() - d.stage_started
            if d.done and elapsed > 0:  # this document's own pace, once it has one
                rate = d.done / elapsed if rate is None else (rate + d.done / elapsed) / 2
            return None if not rate else (d.total - d.done) / rate + 0.1
        chunks = d.chunks
        if chunks is None:
            per = r.bytes_per_chunk.get(d.file_type) or (DEFAULT_BYTES_PER_CHUNK if d.file_type in ("txt", "md")
                                                        else None)
            chunks = d.size / per if per and d.size else None
        embed = chunks / r.chunks_per_s if chunks and r.chunks_per_s else None
        if d.stage == "ocr" and d.total:
            if r.ocr_s_per_page is None and not d.done:
                return None
            per_page = r.ocr_s_per_page or (self._clock() - d.stage_started) / max(d.done, 1)
            return (d.total - d.done) * per_page + (embed or 0.0)
        if d.stage == "write":
            return 0.5
        return embed

    def _eta_locked(self, doc_id: int) -> float | None:
        d = self._docs[doc_id]
        own = self._remaining_locked(d)
        if d.stage != "queued" or own is None:
            return own
        # a queued document waits for everything in progress and everything before it in the queue
        total = own
        ahead = [x for x in self._docs if self._docs[x].stage != "queued"]
        ahead += self._waiting[: self._waiting.index(doc_id)] if doc_id in self._waiting else []
        for other in ahead:
            t = self._remaining_locked(self._docs[other])
            if t is None:
                return None
            total += t
        return total
