"""Ingestion: accept uploads, then parse → chunk → tokenize → embed → write Chroma → 就绪, in a worker.

Uploads insert a job into the database queue (store/jobs.py); one worker thread per app process (2 cores:
embedding already uses both; none in a `--role web` process, docs/deploy.md#roles) claims jobs under a lease it renews while it works, so with several processes on
one PostgreSQL any of them may ingest a document, and a process that dies mid-document (kill -9) has its job
taken over once the lease runs out: the new owner drops the half-written chunks and vectors and starts the
document again. Every end-of-job write is fenced by the lease (a worker that lost it writes nothing more).
A failing file is marked 失败 with its reason and never stops the batch. A document's chunks become visible to
retrieval only when it turns 就绪 (both routes filter on status), and a failed document leaves no vectors.

Each document belongs to one knowledge base and its vectors go to that knowledge base's collection. A file
whose name matches an active document of the same knowledge base but whose content differs becomes the next
version of that document: it turns active (and the previous version inactive) only once it is 就绪. Pages are
chunked by structure (pipeline.ingestion.structured_chunking) with the chunk settings of the document's knowledge
base (pipeline.ingestion.kb_chunking: its own, else the global ones) and the parsed text is kept for the viewer; each
document's stage, counts and ETA are on the progress board (pipeline.ingestion.progress).
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
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.generation.instructions import FLAG_NOTE, flagged_sentences
from pipeline.ingestion.kb_chunking import Chunking, chunk_document
from pipeline.ingestion.parse_worker import ParseCancelled, ParseCrashed, ParseStopped, ParseWorker
from pipeline.ingestion.parsing import (
    MAX_BATCH_FILES,
    ParseError,
    Progress,
    UploadRefused,
    check_upload,
    sniff_content,
)
from pipeline.ingestion.progress import ProgressBoard
from pipeline.ingestion.structured_chunking import indexed_text
from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.in_flight import lower_this_thread
from pipeline.retrieval.kb_indexes import KnowledgeBases
from pipeline.settings import Settings
from store.documents import ChunkRow, DocumentStore, SectionRow
from store.files import FileStore, display_name, md5_of
from store.jobs import JobStore, LeaseLost
from store.migrations import DEFAULT_KB_ID
from store.vectors import VectorStore
from store.write_lock import WriteLock

log = logging.getLogger(__name__)

QA_FILE_TYPE = "qa"  # pipeline.conversation.verified: one question + answer, never split


EMBED_BATCH = 32
WRITE_BATCH = 128  # vectors per Chroma add
GROUP_DOCS = 16  # documents taken from the queue together (default; Deployment.ingest_group)
SHARED_PROGRESS_S = 1.0  # at most one progress write per document per second (other processes' lists)
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
    kb_id: int | None = None
    version: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


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
    def __init__(self, docs: DocumentStore, kbs: KnowledgeBases, files: FileStore, tokenizer: ChineseTokenizer,
                 get_settings: Callable[[], Settings], get_embedding: Callable[[], object],
                 model_ident: Callable[[], tuple[str, int]], on_change: Callable[[], None],
                 busy_reason: Callable[[], str | None] = lambda: None, *, write_lock: WriteLock, jobs: JobStore,
                 ready: Callable[[], bool] = lambda: True, lease_s: float = 60.0, poll_s: float = 1.0,
                 chunking_of: Callable[[int, Settings], Chunking] = lambda kb_id, s: Chunking.of(s),
                 claim_jobs: bool = True, group_docs: int = GROUP_DOCS,
                 yield_cpu: Callable[[], object] = lambda: None,
                 on_generation: Callable[[int], None] = lambda generation: None):
        self.docs = docs
        self.kbs = kbs  # kb_id → its collection and BM25 index
        self.files = files
        self.tokenizer = tokenizer
        self.get_settings = get_settings
        self.get_embedding = get_embedding
        self.model_ident = model_ident
        self.on_change = on_change  # the queue drained: what is searchable follows (SearchableChanges.ingested)
        self.on_generation = on_generation  # a document's 就绪 moved the KB generation to this value
        self.write_lock = write_lock  # writes spanning Chroma + SQL hold it (a backup freezes it)
        self.busy_reason = busy_reason
        self.jobs = jobs
        self.ready = ready  # models loaded: jobs are claimed only then
        self.lease_s = float(lease_s)
        self.chunking_of = chunking_of  # kb_id, settings → that KB's chunking (pipeline/ingestion/kb_chunking.py)
        self.poll_s = poll_s  # how often an idle worker looks for jobs other processes queued
        # before each embedding batch: questions computing in this process go first (a bounded wait,
        # pipeline/retrieval/in_flight.py)
        self.yield_cpu = yield_cpu
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.timer = StageTimer()
        self.progress = ProgressBoard()  # stage / counts / ETA per document (the list API and the UI read it)
        # Each document parses in a child process under parse_timeout_s / parse_memory_mb (parse_worker.py):
        # a file that would take the process down fails with its reason and the queue behind it goes on.
        self.parser = ParseWorker()
        self._cancelled: set[int] = set()
        self._current: int | None = None
        self._held: set[int] = set()   # doc_ids whose job this worker holds (the heartbeat renews them)
        # Ending a job (its row deleted) and leaving _held happen under it, and so does a renewal: a renewal
        # that ran between the two would take a finished document for a lease another worker took.
        self._lease_lock = threading.Lock()
        self._lost: set[int] = set()   # leases that ran out under us: another worker owns those now
        self._attempts: dict[int, int] = {}
        self._shared_at: dict[int, float] = {}  # doc_id → when its progress was last written to the job row
        self._busy = False             # claimed work not yet finished (including the post-ingest refresh)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, name="ingest-worker", daemon=True)
        self._heart = threading.Thread(target=self._heartbeat, name="ingest-lease", daemon=True)
        # claim_jobs=False (app.py --role web): uploads only queue their jobs and worker processes claim them;
        # a full rebuild still processes documents here, in its own thread, under the same leases
        self.claim_jobs = claim_jobs
        # documents per claim: small documents share an embedding batch and a Chroma write; with several
        # workers a smaller group spreads the queue's tail over them (docs/deploy.md#roles)
        self.group_docs = int(group_docs)
        if claim_jobs:
            self._worker.start()
        self._heart.start()

    # --- accepting -----------------------------------------------------------------------------
    def upload(self, items: list[tuple[str, Path]], kb_id: int = DEFAULT_KB_ID) -> list[UploadResult]:
        """items: (original file name, path of the received temp file) into knowledge base `kb_id`. Returns one
        result per file: 处理中 (new document or new version), 已存在 (same content in this KB), or refused."""
        busy = self.busy_reason()
        if busy:
            raise IngestBusy(busy)
        kb_id = self.kbs.check(kb_id)
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
            existing = self.docs.find_by_md5(md5, kb_id)
            if existing:
                results.append(_existed(name, existing))
                continue
            stored = self.files.save(Path(path), md5, file_type, kb_id)
            current = self.docs.find_active_by_name(kb_id, name)
            lineage = current["lineage_id"] if current else None
            version = self.docs.next_version(lineage) if lineage else 1
            try:
                doc = self.docs.create(name, file_type, size, md5, stored, kb_id, lineage, version)
            except Exception:  # a concurrent duplicate upload won the UNIQUE(kb_id, md5) race
                existing = self.docs.find_by_md5(md5, kb_id)
                if existing:
                    results.append(_existed(name, existing))
                    continue
                raise
            self.enqueue(doc["doc_id"], doc)
            msg = f"处理中（新版本 v{version}，就绪后替换 v{current['version']}）" if current else "处理中"
            results.append(UploadResult(name, True, doc["doc_id"], "processing", msg, kb_id=kb_id, version=version))
        return results

    def enqueue(self, doc_id: int, doc: dict | None = None) -> None:
        doc = doc or self.docs.get(doc_id) or {}
        if self.claim_jobs:  # else a worker process claims it: the list shows the queue row's place and stage
            self.progress.queued(doc_id, doc.get("file_size") or 0, doc.get("file_type") or "")
        self.jobs.add(doc_id)
        self._wake.set()

    def cancel(self, doc_id: int) -> None:
        """Deleted or cancelled: the next check drops its work; a parse running for it is killed now."""
        self._cancelled.add(doc_id)
        self.parser.kill(doc_id)

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
        for kb in self.kbs.all():
            orphans = kb.vectors.all_ids() - self.docs.all_chunk_ids(kb.kb_id)
            if orphans:
                log.warning("removing %d orphan vectors from knowledge base %d", len(orphans), kb.kb_id)
                kb.vectors.delete_ids(sorted(orphans))

    # --- worker --------------------------------------------------------------------------------
    def _run(self) -> None:
        lower_this_thread()  # questions first (pipeline/retrieval/in_flight.py)
        while not self._stop.is_set():
            if not self.ready():
                self._stop.wait(0.2)
                continue
            self._wake.clear()
            try:
                claimed = self.jobs.claim(self.owner, self.lease_s, self.group_docs)
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
            self._shared_at.pop(d, None)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            if self._held:
                self._renew()

    def _renew(self) -> None:
        """Extend our leases; a doc we think we hold but no longer do is marked lost (never written again)."""
        with self._lease_lock:
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
            if not self.progress.holds(doc_id):  # claimed from the shared queue or processed by a rebuild
                self.progress.queued(doc_id, doc.get("file_size") or 0, doc.get("file_type") or "")
            try:
                prepared.append(self._prepare(doc, s))
            except ParseError as exc:
                self._fail(doc_id, exc.reason)
            except (_Cancelled, ParseCancelled):
                self._cleanup(doc_id)
            except ParseStopped:  # stop(): nothing of it is touched; its job is released and taken up again
                log.info("doc %s: parse stopped (engine stopping)", doc_id)
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
        self._stage(doc_id, "parse")

        def parse_progress(msg: str) -> None:
            if isinstance(msg, Progress):
                self._stage(doc_id, msg.stage, msg.done, msg.total)
            else:
                self.docs.set_progress(doc_id, msg)

        qa = doc["file_type"] == QA_FILE_TYPE  # a verified Q&A entry: its text file, kept as one chunk
        parsed = self.parse(path, "txt" if qa else doc["file_type"], s, key=doc_id, progress=parse_progress,
                            cancelled=lambda: self._is_cancelled(doc_id))
        t1 = time.perf_counter()
        self.timer.add("parse", t1 - t0)
        self._check_cancel(doc_id)
        self._stage(doc_id, "chunk")

        parsed.pages, pieces = chunk_document(parsed.pages, self.chunking_of(doc.get("kb_id") or DEFAULT_KB_ID, s),
                                              qa)
        if not pieces or not pieces[0][2].text:
            raise ParseError("未解析到文本")
        t2 = time.perf_counter()
        self.timer.add("chunk", t2 - t1)
        self.progress.chunked(doc_id, len(pieces))

        rows = [ChunkRow(doc_id=doc_id, chunk_index=i, text=pc.text, page=page.page, char_start=pc.start,
                         char_end=pc.end, source=page.source or "text",
                         tokens=self.tokenizer(indexed_text(pc.text, pc.context)), context=pc.context, section=k)
                for i, (k, page, pc) in enumerate(pieces)]
        sections = [SectionRow(k, page.page, page.source or "text", page.context, page.text)
                    for k, page in enumerate(parsed.pages)]
        t3 = time.perf_counter()
        self.timer.add("tokenize", t3 - t2)

        # Old vectors of this document (a rebuild, or the half-written work of a worker that died) go before the
        # new ones come. A first ingest has none: chunks are written before vectors, so skip Chroma's
        # delete-by-metadata scan (tens of ms per document) when there are no old chunks.
        self._check_cancel(doc_id)
        with self.write_lock.writing():
            if self.docs.chunk_count_of(doc_id):
                self._vectors(doc).delete_doc(doc_id)
            # The chunk rows are replaced only while our lease holds (checked and locked in one transaction).
            chunk_ids = self.docs.replace_chunks(
                doc_id, rows, sections, note="；".join([*parsed.warnings, *flag_note(rows)]) or None,
                guard=lambda conn: self.jobs.fence(conn, doc_id, self.owner, self.lease_s))
        self.timer.add("write", time.perf_counter() - t3)
        return _Prepared(doc, rows, chunk_ids)

    def parse(self, path: Path, file_type: str, s: Settings, *, key, progress=None, cancelled=None):
        """The file parsed in the parse worker's child under the budgets of `s` (ingest and the upload preview)."""
        try:
            return self.parser.parse(path, file_type, ocr_enabled=s.ocr_enabled, ocr_max_pages=s.ocr_max_pages,
                                     progress=progress, timeout_s=s.parse_timeout_s, memory_mb=s.parse_memory_mb,
                                     key=key, cancelled=cancelled)
        except ParseCrashed as exc:
            raise ParseError(f"处理失败：{exc}") from exc

    def _embed_and_write(self, group: list["_Prepared"]) -> None:
        """Embed the chunks of the group in batches that may span documents; write vectors in big batches;
        mark each document 就绪 only once all its vectors are written."""
        embed_model = self.get_embedding()
        model_id, dim = self.model_ident()
        for p in group:
            p.vectors = self._vectors(p.doc)
        for vs in {id(p.vectors): p.vectors for p in group}.values():
            vs.claim_model(model_id, dim)
        items = [(p, i) for p in group for i in range(len(p.rows))]
        pending: list[tuple["_Prepared", int, list[float]]] = []
        written: dict[int, int] = {p.doc_id: 0 for p in group}

        def flush() -> None:
            self._renew()  # fencing: never write vectors for a document whose lease another worker took
            pending[:] = [x for x in pending if x[0].doc_id not in self._lost]
            if not pending:
                return
            tw = time.perf_counter()
            for vs in {id(p.vectors): p.vectors for p, _, _ in pending}.values():  # one add per collection
                part = [x for x in pending if x[0].vectors is vs]
                vs.add_many([p.chunk_ids[i] for p, i, _ in part], [e for _, _, e in part],
                            [p.rows[i].text for p, i, _ in part], [p.doc_id for p, _, _ in part],
                            [p.doc["file_name"] for p, _, _ in part])
            for p, _, _ in pending:
                written[p.doc_id] += 1
            pending.clear()
            self.timer.add("write", time.perf_counter() - tw)
            for p in group:
                if not p.done and written[p.doc_id] == len(p.rows):
                    self._finish(p)

        cancelled: set[int] = set()
        for start in range(0, len(items), EMBED_BATCH):
            self.yield_cpu()
            batch = [(p, i) for p, i in items[start:start + EMBED_BATCH] if p.doc_id not in cancelled]
            for p in {p.doc_id: p for p, _ in batch}.values():
                if p.doc_id in self._lost:
                    p.done = True  # its new owner starts it again; nothing of ours to clean
                    cancelled.add(p.doc_id)
                elif self._is_cancelled(p.doc_id):
                    cancelled.add(p.doc_id)
                else:
                    first = min(i for q, i in batch if q is p)  # chunks of p embedded before this batch
                    self._stage(p.doc_id, "embed", first, len(p.rows))
            batch = [(p, i) for p, i in batch if p.doc_id not in cancelled]
            if not batch:
                continue
            te = time.perf_counter()
            embs = embed_model.get_text_embedding_batch([indexed_text(p.rows[i].text, p.rows[i].context)
                                                         for p, i in batch])
            secs = time.perf_counter() - te
            self.timer.add("embed", secs)
            self.progress.embedded(len(batch), secs)
            for p in {p.doc_id: p for p, _ in batch}.values():
                last = max(i for q, i in batch if q is p) + 1
                self._stage(p.doc_id, "write" if last == len(p.rows) else "embed", last, len(p.rows))
            pending.extend((p, i, e) for (p, i), e in zip(batch, embs))
            if len(pending) >= WRITE_BATCH:
                flush()
        flush()
        for p in group:
            if p.doc_id in cancelled and not p.done:
                p.done = True
                self._cleanup(p.doc_id)

    def _stage(self, doc_id: int, stage: str, done: int = 0, total: int = 0) -> None:
        """Structured progress on the board (this process's list reads it there), and on the job row for the
        other processes — at most every SHARED_PROGRESS_S per document (a small document passes all its stages
        in less: the others see its first one, then 就绪)."""
        self.progress.stage(doc_id, stage, done, total)
        now = time.monotonic()
        last = self._shared_at.get(doc_id)
        if last is not None and now - last < SHARED_PROGRESS_S:
            return
        self._shared_at[doc_id] = now
        snap = self.progress.snapshot(doc_id)
        try:
            self.jobs.set_stage(doc_id, self.owner, stage, done, total, snap["eta_s"] if snap else None)
        except Exception:  # progress is best effort: never fail a document over it
            log.exception("writing ingest progress failed")

    def _finish(self, p: "_Prepared") -> None:
        p.done = True
        self.progress.finish(p.doc_id)
        if p.doc_id in self._lost:
            return
        if self._is_cancelled(p.doc_id):
            self._cleanup(p.doc_id)
            return
        if self._attempts.get(p.doc_id, 1) > 1:
            # Taken over: a write the dead worker had in flight may have landed after our delete.
            stray = p.vectors.ids_of_doc(p.doc_id) - set(p.chunk_ids)
            if stray:
                p.vectors.delete_ids(sorted(stray))
        # Vectors are written (Chroma finds them); BM25 must find the chunks too before the status says 就绪:
        # they go into a new segment of the document's knowledge base (BM25Index.add_ready), which every other
        # process opens when the KB generation moves (pipeline/services/shared_sync.py).
        self.kbs.get(p.doc.get("kb_id") or DEFAULT_KB_ID).bm25.add_ready(
            [(cid, row.tokens) for cid, row in zip(p.chunk_ids, p.rows)])
        with self._lease_lock:
            generation = self.jobs.complete(p.doc_id, self.owner, len(p.rows))
            self._held.discard(p.doc_id)
        if generation is None:
            log.warning("doc %s: lease lost before 就绪; its new owner finishes it", p.doc_id)
            return
        self.on_generation(generation)
        self.timer.chunks += len(p.rows)
        log.info("doc %s ready: %d chunks", p.doc["file_name"], len(p.rows))

    def _fail(self, doc_id: int, reason: str) -> None:
        self.progress.finish(doc_id)
        if doc_id in self._lost or not self.jobs.holds(doc_id, self.owner):
            return  # another worker owns the document now: its chunks and vectors are not ours to drop
        self._cleanup(doc_id, keep_doc=True)
        with self._lease_lock:
            self.jobs.fail(doc_id, self.owner, reason)
            self._held.discard(doc_id)

    def _cleanup(self, doc_id: int, keep_doc: bool = False) -> None:
        """A failed or cancelled document leaves no vectors and no chunks."""
        self.progress.finish(doc_id)
        with self.write_lock.writing():
            doc = self.docs.get(doc_id)
            # a document deleted meanwhile (its KB too, maybe): Engine.delete_document removed its vectors
            if doc is not None:
                self._vectors(doc).delete_doc(doc_id)
            self.docs.delete_chunks(doc_id)
            if not keep_doc and doc is not None and doc_id in self._cancelled:
                self.docs.delete(doc_id)
                self.files.delete(doc.get("stored_name"))

    def _vectors(self, doc: dict) -> VectorStore:
        return self.kbs.get(doc.get("kb_id") or DEFAULT_KB_ID).vectors

    def stop(self, timeout: float = 5.0) -> None:
        """Stop claiming; a job still running past `timeout` keeps its lease until it expires (then another
        process, or this data dir's next start on SQLite, takes it over)."""
        self._stop.set()
        self._wake.set()
        self.parser.close()  # a parse in flight ends now (its job is released and taken up again later)
        if self._worker.is_alive():
            self._worker.join(timeout)


def _existed(name: str, existing: dict) -> UploadResult:
    """「已存在」: the same content is already in this knowledge base (maybe as an old version)."""
    msg = "已存在"
    if existing.get("active") == 0 and existing.get("status") == "ready":
        msg = f"已存在（与旧版本 v{existing['version']} 内容相同，可在「版本」中恢复）"
    return UploadResult(name, True, existing["doc_id"], existing["status"], msg, True, existing.get("kb_id"),
                        existing.get("version"))


class _Cancelled(Exception):
    pass


@dataclass
class _Prepared:
    doc: dict
    rows: list[ChunkRow]
    chunk_ids: list[int]
    done: bool = False
    vectors: VectorStore | None = None  # the collection of the document's knowledge base

    @property
    def doc_id(self) -> int:
        return self.doc["doc_id"]



def flag_note(rows: list) -> list[str]:
    """The document's note about instruction-like sentences (pipeline.generation.instructions), [] when none."""
    n = sum(len(flagged_sentences(r.text)) for r in rows)
    return [FLAG_NOTE.format(n=n)] if n else []
