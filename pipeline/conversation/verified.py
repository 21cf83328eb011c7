"""Verified Q&A entries: an admin turns a good answer (question + edited answer + its cited chunks) into
knowledge that joins retrieval.

An entry is a small document of its own — file_type 'qa', one chunk 「问：…\n答：…」 — that goes through the
normal ingest path (tokens for BM25, an embedding in Chroma), so both routes find it; its sources carry
`verified: true` and show as 「已核实问答」. Deleting the entry deletes that document, which removes it from
both routes (and deleting the document from the 知识库 tab deletes the entry).
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import CODE_ENGINE, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.ingestion.service import QA_FILE_TYPE  # one constant for the ingest path and the entries
from store.documents import DocumentStore
from store.files import FileStore, md5_of
from store.verified import VerifiedQAStore

QA_PREFIX_Q, QA_PREFIX_A = "问：", "答："
MAX_QUESTION_CHARS, MAX_ANSWER_CHARS = 500, 4000
NAME_CHARS = 30


def qa_text(question: str, answer: str) -> str:
    return f"{QA_PREFIX_Q}{question}\n{QA_PREFIX_A}{answer}"


def answer_of(text: str) -> str:
    """The answer part of a verified chunk's text (what an extractive reply quotes)."""
    _, sep, rest = (text or "").partition("\n" + QA_PREFIX_A)
    return rest.strip() if sep else (text or "").strip()


class VerifiedQAService:
    def __init__(self, store: VerifiedQAStore, docs: DocumentStore, files: FileStore,
                 enqueue: Callable[[int], None], delete_document: Callable[[int], Any],
                 busy_reason: Callable[[], str | None] = lambda: None):
        self.store, self.docs, self.files = store, docs, files
        self.enqueue, self.delete_document, self.busy_reason = enqueue, delete_document, busy_reason

    def create(self, question: Any, answer: Any, user: str | None, cited: list | None = None,
               turn_id: int | None = None, kb_id: int | None = None) -> dict:
        q = " ".join(question.split()) if isinstance(question, str) else ""
        a = answer.strip() if isinstance(answer, str) else ""
        if not q or len(q) > MAX_QUESTION_CHARS:
            raise EngineError(CODE_VALIDATION, f"问题不能为空，且不超过 {MAX_QUESTION_CHARS} 字", "question")
        if not a or len(a) > MAX_ANSWER_CHARS:
            raise EngineError(CODE_VALIDATION, f"答案不能为空，且不超过 {MAX_ANSWER_CHARS} 字", "answer")
        busy = self.busy_reason()
        if busy:
            raise EngineError(CODE_ENGINE, busy)
        text = qa_text(q, a)
        with tempfile.TemporaryDirectory(prefix="kbqa-qa-") as tmp:
            src = Path(tmp) / "qa.txt"
            src.write_text(text, encoding="utf-8")
            md5 = md5_of(src)
            if self.docs.find_by_md5(md5, *([kb_id] if kb_id is not None else [])):
                raise EngineError(CODE_VALIDATION, "同样的已核实问答已经存在", "question")
            stored = self.files.save(src, md5, "txt")
        name = f"已核实问答：{q[:NAME_CHARS]}{'…' if len(q) > NAME_CHARS else ''}"
        doc = self.docs.create(name, QA_FILE_TYPE, len(text.encode("utf-8")), md5, stored,
                               **({"kb_id": kb_id} if kb_id is not None else {}))
        entry = self.store.add(doc["doc_id"], q, a, _cited(cited), turn_id, user or "")
        self.enqueue(doc["doc_id"])
        return entry

    def list(self) -> list[dict]:
        return self.store.list()

    def delete(self, qa_id: Any) -> dict:
        entry = self.store.get(qa_id) if isinstance(qa_id, int) else None
        if entry is None:
            raise EngineError(CODE_NO_DOC, f"已核实问答不存在：{qa_id}", "qa_id")
        self.delete_document(entry["doc_id"])  # vectors, chunks, BM25 entries, file; the row goes by cascade
        self.store.delete(entry["qa_id"])
        return {"qa_id": entry["qa_id"], "doc_id": entry["doc_id"]}


def _cited(cited: list | None) -> list[dict]:
    """The chunks the answer was based on, kept with the entry (provenance for the admin)."""
    out = []
    for s in cited or []:
        if isinstance(s, dict):
            out.append({k: s.get(k) for k in ("no", "chunk_id", "doc_id", "doc_name", "page", "text")})
    return out
