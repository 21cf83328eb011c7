"""Ingestion: accept uploads, then parse → chunk → tokenize → embed → write Chroma → 就绪, in a worker.

One worker thread (2 cores: embedding already uses both). A failing file is marked 失败 with its reason and
never stops the batch. A document's chunks become visible to retrieval only when it turns 就绪 (both routes
filter on status), and a failed document leaves no vectors.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
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
                 gate: WriteGate | None = None):
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
        self.gate = gate or WriteGate()  # writes spanning Chroma + SQLite hold it (a backup freezes it)
        self.busy_reason = busy_reason
        self.timer = StageTimer()
        self._queue: "queue.Queue[int | None]" = queue.Queue()
        self._cancelled: set[int] = set()
        self._current: int | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0  # queued + in progress; idle only when it drops to 0
        self._pending_lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="ingest-worker", daemon=True)
        self._worker.start()

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
        with self._pending_lock:
            self._pending += 1
            self._idle.clear()
        self._queue.put(doc_id)

    def cancel(self, doc_id: int) -> None:
        self._cancelled.add(doc_id)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the queue is drained (tests, benchmark, rebuild)."""
        return self._idle.wait(timeout)

    @property
    def current(self) -> int | None:
        return self._current

    def is_queued(self, doc_id: int) -> bool:
        """Being processed now or waiting in the queue (restart recovery must not enqueue it twice)."""
        return doc_id == self._current or doc_id in list(self._queue.queue)

    # --- worker --------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            doc_id = self._queue.get()
            if doc_id is None:
                return
            # Small documents are ingested in groups: one embedding batch and one Chroma write can span
            # several documents (a Chroma add costs ~30 ms however few vectors it carries).
            group = [doc_id]
            while len(group) < GROUP_DOCS:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                group.append(nxt)
            self._current = doc_id
            try:
                self.process_group(group)
            except Exception:  # never let one document kill the worker
                log.exception("ingest of docs %s crashed", group)
            finally:
                self._current = None
                for d in group:
                    self._cancelled.discard(d)
                if self._queue.empty():
                    try:
                        self.on_change()
                    except Exception:
                        log.exception("post-ingest refresh failed")
                with self._pending_lock:
                    self._pending -= len(group)
                    if self._pending == 0:
                        self._idle.set()

    def process(self, doc_id: int) -> None:
        self.process_group([doc_id])

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

        # Old vectors of this document (a rebuild) go before the new ones come. A first ingest has none:
        # chunks are written before vectors, and a crashed document is cleaned on restart (Engine._recover),
        # so skip Chroma's delete-by-metadata scan (tens of ms per document) when there are no old chunks.
        with self.gate.writing():
            if self.docs.chunk_count_of(doc_id):
                self.vectors.delete_doc(doc_id)
            chunk_ids = self.docs.replace_chunks(doc_id, rows)
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
                if self._is_cancelled(p.doc_id):
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
        if self._is_cancelled(p.doc_id):
            self._cleanup(p.doc_id)
            return
        # Vectors are written (Chroma finds them); BM25 must find the chunks too before the status says 就绪.
        self.on_ready([(cid, row.tokens) for cid, row in zip(p.chunk_ids, p.rows)])
        self.docs.mark_ready(p.doc_id, len(p.rows))
        self.timer.chunks += len(p.rows)
        log.info("doc %s ready: %d chunks", p.doc["file_name"], len(p.rows))

    def _fail(self, doc_id: int, reason: str) -> None:
        self._cleanup(doc_id, keep_doc=True)
        if self.docs.get(doc_id) is not None:
            self.docs.set_status(doc_id, "failed", reason)

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

    def stop(self) -> None:
        self._queue.put(None)


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

