"""Ingestion: accept uploads, then parse → chunk → tokenize → embed → write Chroma → 就绪, in a worker.

Uploads insert a job into the database queue (store/jobs.py); one worker thread per app process (2 cores:
embedding already uses both) claims jobs under a lease it renews while it works, so with several processes on
one PostgreSQL any of them may ingest a document, and a process that dies mid-document (kill -9) has its job
taken over once the lease runs out: the new owner drops the half-written chunks and vectors and starts the
document again. Every end-of-job write is fenced by the lease (a worker that lost it writes nothing more).
A failing file is marked 失败 with its reason and never stops the batch. A document's chunks become visible to
retrieval only when it turns 就绪 (both routes filter on status), and a failed document leaves no vectors.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llama_index.core import Document

from pipeline.ingestion.chunking import ChineseChunker
from pipeline.ingestion.parsing import (
    MAX_BATCH_FILES,
    ParseError,
    UploadRefused,
    check_upload,
    parse_file,
    sniff_content,
)
from pipeline.settings import Settings
from pipeline.tokenize_zh import ChineseTokenizer
from store.documents import ChunkRow, DocumentStore
from store.files import FileStore, display_name, md5_of
from store.gate import WriteGate
from store.jobs import JobStore, LeaseLost
from store.vectors import VectorStore

log = logging.getLogger(__name__)

QA_FILE_TYPE = "qa"  # pipeline.conversation.verified: one question + answer, never split


def single_chunk(pages: list[Document]) -> list:
    """The whole text as one node, with the offsets the chunker would give."""
    from llama_index.core.schema import TextNode

    text = "\n".join(p.text for p in pages).strip()
    return [TextNode(text=text, metadata={"page": None, "source": "text", "char_start": 0,
                                          "char_end": len(text)})] if text else []

EMBED_BATCH = 32
WRITE_BATCH = 128  # vectors per Chroma add
GROUP_DOCS = 16  # documents taken from the queue together
MAX_ATTEMPTS = 3  # a job whose worker died this many times (e.g. a file that kills the process) is 失败


class IngestBusy(RuntimeError):
    """Uploads/deletes refused (full rebuild running, or vectors of another model need a rebuild)."""


@dataclass
class UploadResult:
    file_name: str
    ok: bool
    doc_id: int | None = None
    status: str = ""
    msg: str = ""
    existed: bool = False

    def to_dict(self) -> dict:
        return {"file_name": self.file_name, "ok": self.ok, "doc_id": self.doc_id, "status": self.status,
                "msg": self.msg, "existed": self.existed}


class StageTimer:
    """Accumulates seconds per ingest stage (for the benchmark's time shares)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.chunks = 0
        self._lock = threading.Lock()

    def add(self, stage: str, secs: float) -> None:
        with self._lock:
            self.seconds[stage] += secs

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()
            self.chunks = 0


class IngestService:
    def __init__(self, docs: DocumentStore, vectors: VectorStore, files: FileStore, tokenizer: ChineseTokenizer,
                 get_settings: Callable[[], Settings], get_embedding: Callable[[], object],
                 model_ident: Callable[[], tuple[str, int]], on_change: Callable[[], None],
                 busy_reason: Callable[[], str | None] = lambda: None,
                 on_ready: Callable[[list[tuple[int, list[str]]]], None] = lambda items: None,
                 gate: WriteGate | None = None, *, jobs: JobStore,
                 ready: Callable[[], bool] = lambda: True, lease_s: float = 60.0, poll_s: float = 1.0):
        self.docs = docs
        self.vectors = vectors
        self.files = files
        self.tokenizer = tokenizer
        self.get_settings = get_settings
        self.get_embedding = get_embedding
        self.model_ident = model_ident
        self.on_change = on_change  # refresh BM25 / ready-set after a document changes state
        # (chunk_id, tokens) of a document about to turn 就绪: BM25Index.add_ready, so 就绪 means searchable
        self.on_ready = on_ready
        self.gate = gate or WriteGate()  # writes spanning Chroma + SQL hold it (a backup freezes it)
        self.busy_reason = busy_reason
        self.jobs = jobs
        self.ready = ready  # models loaded: jobs are claimed only then
        self.lease_s = float(lease_s)
        self.poll_s = poll_s  # how often an idle worker looks for jobs other processes queued
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.timer = StageTimer()
        self._cancelled: set[int] = set()
        self._current: int | None = None
        self._held: set[int] = set()   # doc_ids whose job this worker holds (the heartbeat renews them)
        self._lost: set[int] = set()   # leases that ran out under us: another worker owns those now
        self._attempts: dict[int, int] = {}
        self._busy = False             # claimed work not yet finished (including the post-ingest refresh)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, name="ingest-worker", daemon=True)
        self._heart = threading.Thread(target=self._heartbeat, name="ingest-lease", daemon=True)
        self._worker.start()
        self._heart.start()

    # --- accepting -----------------------------------------------------------------------------
    def upload(self, items: list[tuple[str, Path]]) -> list[UploadResult]:
        """items: (original file name, path of the received temp file). Returns one result per file."""
        busy = self.busy_reason()
        if busy:
            raise IngestBusy(busy)
        results: list[UploadResult] = []
        for i, (raw_name, path) in enumerate(items):
            name = display_name(raw_name)
            if i >= MAX_BATCH_FILES:
                results.append(UploadResult(name, False, status="refused",
                                            msg=f"单次最多上传 {MAX_BATCH_FILES} 个文件，本文件未处理"))
                continue
            try:
                size = Path(path).stat().st_size
                file_type = check_upload(name, size)
                sniff_content(Path(path), file_type)
            except (UploadRefused, ParseError) as exc:
                results.append(UploadResult(name, False, status="refused", msg=exc.reason))
                continue
            md5 = md5_of(Path(path))
            existing = self.docs.find_by_md5(md5)
            if existing:
                results.append(UploadResult(name, True, existing["doc_id"], existing["status"], "已存在", True))
                continue
            stored = self.files.save(Path(path), md5, file_type)
            try:
                doc = self.docs.create(name, file_type, size, md5, stored)
            except Exception:  # a concurrent duplicate upload won the UNIQUE(md5) race
                existing = self.docs.find_by_md5(md5)
                if existing:
                    results.append(UploadResult(name, True, existing["doc_id"], existing["status"], "已存在", True))
                    continue
                raise
            self.enqueue(doc["doc_id"])
            results.append(UploadResult(name, True, doc["doc_id"], "processing", "处理中"))
        return results

    def enqueue(self, doc_id: int) -> None:
        self.jobs.add(doc_id)
        self._wake.set()

    def cancel(self, doc_id: int) -> None:
        self._cancelled.add(doc_id)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the queue is drained — by any process — and this worker's refresh is done."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while True:
            # busy is read before and after the count: a group claimed and finished between the two reads is
            # still refreshing (busy) when the count says 0.
            if not self._busy and self.jobs.count() == 0 and not self._busy:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    @property
    def current(self) -> int | None:
        return self._current

    def is_queued(self, doc_id: int) -> bool:
        """Waiting in the queue or being processed (by any process)."""
        return self.jobs.exists(doc_id)

    def recover(self) -> None:
        """Start/reload safety: a document 处理中 without a job (crash between upload and queueing, or a data dir
        from before the queue) is queued; failed documents keep no chunks; vectors without a chunk row go.

        Safe while other processes ingest: chunk rows are committed before their vectors are written, so a
        vector listed before the chunk ids were read has its row unless that row was deleted (an orphan)."""
        for doc_id in self.docs.ids_with_status("processing"):
            if self.jobs.add(doc_id):
                log.warning("doc %s was 处理中 without a job: queued again", doc_id)
                self._wake.set()
        for doc_id in self.docs.ids_with_status("failed"):
            self.docs.delete_chunks(doc_id)
        orphans = self.vectors.all_ids() - self.docs.all_chunk_ids()
        if orphans:
            log.warning("removing %d orphan vectors", len(orphans))
            self.vectors.delete_ids(sorted(orphans))

    # --- worker --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.ready():
                self._stop.wait(0.2)
                continue
            self._wake.clear()
            try:
                claimed = self.jobs.claim(self.owner, self.lease_s, GROUP_DOCS)
            except Exception:
                log.exception("claiming ingest jobs failed")
                self._stop.wait(self.poll_s)
                continue
            if not claimed:
                self._wake.wait(self.poll_s)
                continue
            self._busy = True
            try:
                self._work(claimed)
            finally:
                self._busy = False

    def _work(self, claimed) -> None:
        group = []
        for job in claimed:
            self._attempts[job.doc_id] = job.attempts
            if job.attempts > MAX_ATTEMPTS:
                self._cleanup(job.doc_id, keep_doc=True)
                self.jobs.fail(job.doc_id, self.owner, "处理多次中断（处理进程退出），已放弃")
            else:
                group.append(job.doc_id)
        self._held.update(group)
        # Small documents are ingested in groups: one embedding batch and one Chroma write can span
        # several documents (a Chroma add costs ~30 ms however few vectors it carries).
        try:
            self.process_group(group)
        except Exception:  # never let one document kill the worker
            log.exception("ingest of docs %s crashed", group)
        finally:
            self._end(group)
        try:
            if self.jobs.claimable() == 0:
                self.on_change()
        except Exception:
            log.exception("post-ingest refresh failed")

    def _end(self, doc_ids: list[int]) -> None:
        """Jobs still ours after processing (an unexpected error) go back to the queue for another try."""
        try:
            self.jobs.release([d for d in doc_ids if d not in self._lost], self.owner)
        except Exception:
            log.exception("releasing ingest jobs failed")
        self._current = None
        for d in doc_ids:
            self._cancelled.discard(d)
            self._held.discard(d)
            self._lost.discard(d)
            self._attempts.pop(d, None)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            if self._held:
                self._renew()

    def _renew(self) -> None:
        """Extend our leases; a doc we think we hold but no longer do is marked lost (never written again)."""
        held = set(self._held)
        try:
            still = self.jobs.renew(self.owner, self.lease_s)
        except Exception:
            log.exception("renewing ingest leases failed")
            return
        lost = held - still
        if lost:
            log.warning("ingest leases lost for docs %s: another worker took them over", sorted(lost))
            self._lost |= lost

    def process(self, doc_id: int) -> None:
        """Process one document now, in the calling thread (a full rebuild), under a job lease like the worker."""
        if not self.jobs.claim_doc(doc_id, self.owner, self.lease_s):
            log.info("doc %s is being processed by another worker; skipped", doc_id)
            return
        self._held.add(doc_id)
        try:
            self.process_group([doc_id])
        finally:
            self._end([doc_id])

    def process_group(self, doc_ids: list[int]) -> None:
        s = self.get_settings()
        prepared: list[_Prepared] = []
        for doc_id in doc_ids:
            doc = self.docs.get(doc_id)
            if doc is None:
                continue
            self._current = doc_id
            try:
                prepared.append(self._prepare(doc, s))
            except ParseError as exc:
                self._fail(doc_id, exc.reason)
            except _Cancelled:
                self._cleanup(doc_id)
            except LeaseLost:
                log.warning("doc %s: lease lost while preparing; left to its new owner", doc_id)
            except Exception as exc:
                log.exception("ingest failed for %s", doc["file_name"])
                self._fail(doc_id, f"处理失败：{type(exc).__name__}: {exc}")
        if not prepared:
            return
        try:
            self._embed_and_write(prepared)
        except Exception as exc:
            log.exception("embedding/writing failed for %s", [p.doc["file_name"] for p in prepared])
            for p in prepared:
                if not p.done:
                    self._fail(p.doc_id, f"处理失败：{type(exc).__name__}: {exc}")

    def _check_cancel(self, doc_id: int) -> None:
        if doc_id in self._lost:
            raise LeaseLost(doc_id)
        if self._is_cancelled(doc_id):
            raise _Cancelled()

    def _is_cancelled(self, doc_id: int) -> bool:
        return doc_id in self._cancelled or self.docs.get(doc_id) is None

    def _prepare(self, doc: dict, s: Settings) -> "_Prepared":
        """parse → chunk → tokenize → SQLite rows (status stays 处理中)."""
        doc_id = doc["doc_id"]
        path = self.files.path_of(doc["stored_name"])
        if not path.exists():
            raise ParseError("原始文件丢失，无法处理")
        t0 = time.perf_counter()
        qa = doc["file_type"] == QA_FILE_TYPE  # a verified Q&A entry: its text file, kept as one chunk
        parsed = parse_file(path, "txt" if qa else doc["file_type"], ocr_enabled=s.ocr_enabled,
                            ocr_max_pages=s.ocr_max_pages, progress=lambda msg: self.docs.set_progress(doc_id, msg))
        t1 = time.perf_counter()
        self.timer.add("parse", t1 - t0)
        self._check_cancel(doc_id)

        chunker = ChineseChunker(chunk_size=s.chunk_size, chunk_overlap=s.chunk_overlap)
        pages = [Document(text=p.text, metadata={"page": p.page, "source": p.source}) for p in parsed.pages
                 if p.text and p.text.strip()]
        nodes = single_chunk(pages) if qa else chunker.get_nodes_from_documents(pages)
        if not nodes:
            raise ParseError("未解析到文本")
        t2 = time.perf_counter()
        self.timer.add("chunk", t2 - t1)

        rows = [ChunkRow(doc_id=doc_id, chunk_index=i, text=n.get_content(), page=n.metadata.get("page"),
                         char_start=n.metadata["char_start"], char_end=n.metadata["char_end"],
                         source=n.metadata.get("source") or "text",
                         tokens=self.tokenizer(n.get_content()))
                for i, n in enumerate(nodes)]
        t3 = time.perf_counter()
        self.timer.add("tokenize", t3 - t2)

        # Old vectors of this document (a rebuild, or the half-written work of a worker that died) go before the
        # new ones come. A first ingest has none: chunks are written before vectors, so skip Chroma's
        # delete-by-metadata scan (tens of ms per document) when there are no old chunks.
        self._check_cancel(doc_id)
        with self.gate.writing():
            if self.docs.chunk_count_of(doc_id):
                self.vectors.delete_doc(doc_id)
            # The chunk rows are replaced only while our lease holds (checked and locked in one transaction).
            chunk_ids = self.docs.replace_chunks(
                doc_id, rows, guard=lambda conn: self.jobs.fence(conn, doc_id, self.owner, self.lease_s))
        self.timer.add("write", time.perf_counter() - t3)
        return _Prepared(doc, rows, chunk_ids)

    def _embed_and_write(self, group: list["_Prepared"]) -> None:
        """Embed the chunks of the group in batches that may span documents; write vectors in big batches;
        mark each document 就绪 only once all its vectors are written."""
        embed_model = self.get_embedding()
        model_id, dim = self.model_ident()
        self.vectors.claim_model(model_id, dim)
        items = [(p, i) for p in group for i in range(len(p.rows))]
        pending: list[tuple["_Prepared", int, list[float]]] = []
        written: dict[int, int] = {p.doc_id: 0 for p in group}

        def flush() -> None:
            self._renew()  # fencing: never write vectors for a document whose lease another worker took
            pending[:] = [x for x in pending if x[0].doc_id not in self._lost]
            if not pending:
                return
            tw = time.perf_counter()
            self.vectors.add_many([p.chunk_ids[i] for p, i, _ in pending], [e for _, _, e in pending],
                                  [p.rows[i].text for p, i, _ in pending], [p.doc_id for p, _, _ in pending],
                                  [p.doc["file_name"] for p, _, _ in pending])
            for p, _, _ in pending:
                written[p.doc_id] += 1
            pending.clear()
            self.timer.add("write", time.perf_counter() - tw)
            for p in group:
                if not p.done and written[p.doc_id] == len(p.rows):
                    self._finish(p)

        cancelled: set[int] = set()
        for start in range(0, len(items), EMBED_BATCH):
            batch = [(p, i) for p, i in items[start:start + EMBED_BATCH] if p.doc_id not in cancelled]
            for p in {p.doc_id: p for p, _ in batch}.values():
                if p.doc_id in self._lost:
                    p.done = True  # its new owner starts it again; nothing of ours to clean
                    cancelled.add(p.doc_id)
                elif self._is_cancelled(p.doc_id):
                    cancelled.add(p.doc_id)
                else:
                    last = max(i for q, i in batch if q is p) + 1  # chunks of p embedded after this batch
                    self.docs.set_progress(p.doc_id, f"向量化 {last}/{len(p.rows)} 块")
            batch = [(p, i) for p, i in batch if p.doc_id not in cancelled]
            if not batch:
                continue
            te = time.perf_counter()
            embs = embed_model.get_text_embedding_batch([p.rows[i].text for p, i in batch])
            self.timer.add("embed", time.perf_counter() - te)
            pending.extend((p, i, e) for (p, i), e in zip(batch, embs))
            if len(pending) >= WRITE_BATCH:
                flush()
        flush()
        for p in group:
            if p.doc_id in cancelled and not p.done:
                p.done = True
                self._cleanup(p.doc_id)

    def _finish(self, p: "_Prepared") -> None:
        p.done = True
        if p.doc_id in self._lost:
            return
        if self._is_cancelled(p.doc_id):
            self._cleanup(p.doc_id)
            return
        if self._attempts.get(p.doc_id, 1) > 1:
            # Taken over: a write the dead worker had in flight may have landed after our delete.
            stray = self.vectors.ids_of_doc(p.doc_id) - set(p.chunk_ids)
            if stray:
                self.vectors.delete_ids(sorted(stray))
        # Vectors are written (Chroma finds them); BM25 must find the chunks too before the status says 就绪.
        # Other processes rebuild theirs when the KB generation moves (pipeline/shared_sync.py).
        self.on_ready([(cid, row.tokens) for cid, row in zip(p.chunk_ids, p.rows)])
        if not self.jobs.complete(p.doc_id, self.owner, len(p.rows)):
            log.warning("doc %s: lease lost before 就绪; its new owner finishes it", p.doc_id)
            return
        self.timer.chunks += len(p.rows)
        log.info("doc %s ready: %d chunks", p.doc["file_name"], len(p.rows))

    def _fail(self, doc_id: int, reason: str) -> None:
        if doc_id in self._lost or not self.jobs.holds(doc_id, self.owner):
            return  # another worker owns the document now: its chunks and vectors are not ours to drop
        self._cleanup(doc_id, keep_doc=True)
        self.jobs.fail(doc_id, self.owner, reason)

    def _cleanup(self, doc_id: int, keep_doc: bool = False) -> None:
        """A failed or cancelled document leaves no vectors and no chunks."""
        with self.gate.writing():
            self.vectors.delete_doc(doc_id)
            self.docs.delete_chunks(doc_id)
            if not keep_doc:
                doc = self.docs.get(doc_id)
                if doc is not None and doc_id in self._cancelled:
                    self.docs.delete(doc_id)
                    self.files.delete(doc.get("stored_name"))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop claiming; a job still running past `timeout` keeps its lease until it expires (then another
        process, or this data dir's next start on SQLite, takes it over)."""
        self._stop.set()
        self._wake.set()
        self._worker.join(timeout)


class _Cancelled(Exception):
    pass


@dataclass
class _Prepared:
    doc: dict
    rows: list[ChunkRow]
    chunk_ids: list[int]
    done: bool = False

    @property
    def doc_id(self) -> int:
        return self.doc["doc_id"]

