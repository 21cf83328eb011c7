"""全量重建: re-process every document (every version) of all knowledge bases, or of one, re-parsed from its stored
original, with its knowledge base's chunk settings (pipeline/ingestion/kb_chunking.py) and the current embedding
model, in a thread.

Uploads and deletes are refused while it runs — in every app process sharing the database: the rebuild holds
the named lease `kb_rebuild` (store/leases.py) and the others ask `running_elsewhere`. Vectors of another model
are dropped first — two models' vectors are never mixed, so that case needs the rebuild of all knowledge bases.
A document whose chunks a KB admin curated (edited, disabled, added: pipeline/services/chunks.py) is not re-parsed:
`keep_curated` re-derives its tokens and vectors from the stored chunk text, so the edits survive.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.errors import CODE_ENGINE, EngineError
from pipeline.retrieval.in_flight import lower_this_thread

if TYPE_CHECKING:
    from pipeline.components import Components

log = logging.getLogger(__name__)

LEASE = "kb_rebuild"


class Rebuild:
    def __init__(self, components: Components, on_change: Callable[..., None],
                 keep_curated: Callable[[dict], bool] = lambda doc: False):
        self._c = components
        self._on_change = on_change  # the change hook (pipeline.services.changes): caches, counter, BM25
        self._keep_curated = keep_curated  # True: the document's curated chunks were re-indexed as they are
        self._lock = threading.Lock()
        self._status = {"running": False, "done": 0, "total": 0, "current": "", "error": None, "elapsed_ms": None,
                        "eta_s": None}

    @property
    def running(self) -> bool:
        return bool(self._status["running"])

    def status(self) -> dict:
        """running, done / total documents, current (its name and stage), eta_s, error, elapsed_ms."""
        st = dict(self._status)
        if st["running"] and st.get("current_id") is not None:
            snap = self._c.ingest.progress.snapshot(st["current_id"])
            if snap:
                st["current_stage"] = snap["text"]
        st.pop("current_id", None)
        return st

    @property
    def _lease_s(self) -> float:
        return self._c.deployment.ingest_lease_s

    def running_elsewhere(self) -> bool:
        """Another app process on the same database is rebuilding."""
        holder = self._c.leases.holder(LEASE)
        return holder is not None and holder != self._c.ingest.owner

    def _keep_lease(self) -> None:
        while self.running:
            time.sleep(self._lease_s / 3)
            if self.running:
                self._c.leases.renew(LEASE, self._c.ingest.owner, self._lease_s)

    def start(self, require_ready: Callable[[], None] = lambda: None, kb_id: int | None = None) -> dict:
        """Rebuild all knowledge bases (kb_id None) or one."""
        with self._lock:
            if self.running:
                raise EngineError(CODE_ENGINE, "全量重建已在进行中")
            require_ready()
            if kb_id is not None:
                kb_id = self._c.kbs.check(kb_id)
                if self._c.models.model_warning:
                    raise EngineError(CODE_ENGINE, "更换了 Embedding 模型：需要重建全部知识库（不指定 kb_id）")
            if not self._c.leases.acquire(LEASE, self._c.ingest.owner, self._lease_s):
                raise EngineError(CODE_ENGINE, "全量重建已在另一个服务进程中进行")
            docs = self._c.docs.all_docs(kb_id)
            self._status = {"running": True, "done": 0, "total": len(docs), "current": "", "error": None,
                            "elapsed_ms": None, "eta_s": None, "kb_id": kb_id}
        threading.Thread(target=self._run, args=(docs, kb_id), name="kb-rebuild", daemon=True).start()
        return self.status()

    def wait(self, timeout: float | None = None) -> dict:
        t_end = time.time() + (timeout or 1e9)
        while self.running and time.time() < t_end:
            time.sleep(0.1)
        return self.status()

    def _kept(self, doc: dict) -> bool:
        """A curated document re-indexed from its stored chunks. One that fails to re-index is left as it was
        (never re-parsed: that would discard the edits) and logged; the rebuild goes on."""
        try:
            return self._keep_curated(doc)
        except Exception:
            log.exception("rebuild: re-indexing the curated chunks of %s failed; left as it was", doc["file_name"])
            return True

    def _run(self, docs: list[dict], kb_id: int | None) -> None:
        lower_this_thread()  # a full rebuild: questions first (pipeline/retrieval/in_flight.py)
        c, st = self._c, self._status
        t0 = time.perf_counter()
        threading.Thread(target=self._keep_lease, name="kb-rebuild-lease", daemon=True).start()
        try:
            c.ingest.wait_idle()
            if c.models.model_warning:
                with c.write_lock.writing():
                    for kb in c.kbs.all():
                        kb.vectors.reset()  # vectors of another model: start over, never mix
                c.models.model_warning = None
                self._on_change()  # other processes re-open the new collection
            # ETA from the bytes done so far: documents differ in size far more than in count
            total_bytes = sum(int(d.get("file_size") or 0) for d in docs) or 1
            done_bytes = 0
            for doc in docs:  # their places in line, for the list's 排队 n
                c.ingest.progress.queued(doc["doc_id"], doc.get("file_size") or 0, doc.get("file_type") or "")
            t_work = time.perf_counter()
            for i, doc in enumerate(docs):
                st["current"], st["current_id"] = doc["file_name"], doc["doc_id"]
                st["current_kb_id"] = doc.get("kb_id")  # who may see the name (KBAccess.redact_progress)
                fresh = c.docs.get(doc["doc_id"])
                if not doc.get("stored_name") and doc["status"] == "failed":
                    pass  # a failed web fetch: a reason without an original, nothing to re-process
                elif fresh is not None and self._kept(fresh):
                    c.ingest.progress.finish(doc["doc_id"])
                elif fresh is not None:
                    c.docs.set_status(doc["doc_id"], "processing", None, "全量重建中")
                    c.ingest.process(doc["doc_id"])
                done_bytes += int(doc.get("file_size") or 0)
                st["done"] = i + 1
                rate = done_bytes / max(time.perf_counter() - t_work, 1e-6)
                st["eta_s"] = round((total_bytes - done_bytes) / rate, 1) if rate > 0 else None
            self._on_change(wait=True)  # BM25 of every knowledge base from the new tokens, here and elsewhere
        except Exception as exc:
            log.exception("rebuild failed")
            st["error"] = str(exc)
        finally:
            for doc in docs:  # skipped (deleted) or interrupted documents leave the board
                c.ingest.progress.finish(doc["doc_id"])
            st["running"] = False
            st["current"], st["current_id"], st["eta_s"], st["current_kb_id"] = "", None, None, None
            c.leases.release(LEASE, c.ingest.owner)
            st["elapsed_ms"] = round((time.perf_counter() - t0) * 1000)
