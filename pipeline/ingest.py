"""Ingestion: accept uploads, then parse → chunk → tokenize → embed → write Chroma → 就绪, in a worker.

One worker thread (2 cores: embedding already uses both). A failing file is marked 失败 with its reason and
never stops the batch. A document's chunks become visible to retrieval only when it turns 就绪 (both routes
filter on status), and a failed document leaves no vectors.
"""
from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from llama_index.core import Document

from store.documents import ChunkRow, DocumentStore
from store.files import FileStore, display_name, md5_of
from store.vectors import VectorStore

from .chunking import ChineseChunker
from .parsing import MAX_BATCH_FILES, ParseError, UploadRefused, check_upload, parse_file, sniff_content
from .settings import Settings
from .tokenize_zh import ChineseTokenizer

log = logging.getLogger(__name__)

EMBED_BATCH = 32


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
                 busy_reason: Callable[[], str | None] = lambda: None):
        self.docs = docs
        self.vectors = vectors
        self.files = files
        self.tokenizer = tokenizer
        self.get_settings = get_settings
        self.get_embedding = get_embedding
        self.model_ident = model_ident
        self.on_change = on_change  # refresh BM25 / ready-set after a document changes state
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

    def upload_bytes(self, name: str, data: bytes) -> UploadResult:
        """Convenience for tests/scripts: write bytes to a temp file and upload it."""
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "upload.bin"
            p.write_bytes(data)
            return self.upload([(name, p)])[0]

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

    # --- worker --------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            doc_id = self._queue.get()
            if doc_id is None:
                return
            self._current = doc_id
            try:
                self.process(doc_id)
            except Exception:  # never let one document kill the worker
                log.exception("ingest of doc %s crashed", doc_id)
            finally:
                self._current = None
                self._cancelled.discard(doc_id)
                if self._queue.empty():
                    try:
                        self.on_change()
                    except Exception:
                        log.exception("post-ingest refresh failed")
                with self._pending_lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def process(self, doc_id: int) -> None:
        doc = self.docs.get(doc_id)
        if doc is None:
            return
        s = self.get_settings()
        try:
            self._process(doc, s)
        except ParseError as exc:
            self._fail(doc_id, exc.reason)
        except _Cancelled:
            self._cleanup(doc_id)
        except Exception as exc:
            log.exception("ingest failed for %s", doc["file_name"])
            self._fail(doc_id, f"处理失败：{type(exc).__name__}: {exc}")

    def _check_cancel(self, doc_id: int) -> None:
        if doc_id in self._cancelled or self.docs.get(doc_id) is None:
            raise _Cancelled()

    def _process(self, doc: dict, s: Settings) -> None:
        doc_id = doc["doc_id"]
        path = self.files.path_of(doc["stored_name"])
        if not path.exists():
            raise ParseError("原始文件丢失，无法处理")
        t0 = time.perf_counter()
        parsed = parse_file(path, doc["file_type"], ocr_enabled=s.ocr_enabled, ocr_max_pages=s.ocr_max_pages,
                            progress=lambda msg: self.docs.set_progress(doc_id, msg))
        t1 = time.perf_counter()
        self.timer.add("parse", t1 - t0)
        self._check_cancel(doc_id)

        chunker = ChineseChunker(chunk_size=s.chunk_size, chunk_overlap=s.chunk_overlap)
        pages = [Document(text=p.text, metadata={"page": p.page, "source": p.source}) for p in parsed.pages
                 if p.text and p.text.strip()]
        nodes = chunker.get_nodes_from_documents(pages)
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
        if self.docs.chunk_count_of(doc_id):
            self.vectors.delete_doc(doc_id)
        chunk_ids = self.docs.replace_chunks(doc_id, rows)
        t4 = time.perf_counter()
        self.timer.add("write", t4 - t3)

        embed_model = self.get_embedding()
        model_id, dim = self.model_ident()
        self.vectors.claim_model(model_id, dim)
        texts = [r.text for r in rows]
        total = len(texts)
        for i in range(0, total, EMBED_BATCH):
            self._check_cancel(doc_id)
            self.docs.set_progress(doc_id, f"向量化 {min(i + EMBED_BATCH, total)}/{total} 块")
            te = time.perf_counter()
            embs = embed_model.get_text_embedding_batch(texts[i:i + EMBED_BATCH])
            tw = time.perf_counter()
            self.timer.add("embed", tw - te)
            self.vectors.add(chunk_ids[i:i + EMBED_BATCH], embs, texts[i:i + EMBED_BATCH], doc_id, doc["file_name"])
            self.timer.add("write", time.perf_counter() - tw)
        self._check_cancel(doc_id)
        self.docs.mark_ready(doc_id, len(rows))
        self.timer.chunks += len(rows)
        log.info("doc %s ready: %d chunks", doc["file_name"], len(rows))

    def _fail(self, doc_id: int, reason: str) -> None:
        self._cleanup(doc_id, keep_doc=True)
        if self.docs.get(doc_id) is not None:
            self.docs.set_status(doc_id, "failed", reason)

    def _cleanup(self, doc_id: int, keep_doc: bool = False) -> None:
        """A failed or cancelled document leaves no vectors and no chunks."""
        self.vectors.delete_doc(doc_id)
        self.docs.delete_chunks(doc_id)
        if not keep_doc:
            doc = self.docs.get(doc_id)
            if doc is not None and doc_id in self._cancelled:
                self.files.delete(doc.get("stored_name"))
                self.docs.delete(doc_id)

    def stop(self) -> None:
        self._queue.put(None)


class _Cancelled(Exception):
    pass

