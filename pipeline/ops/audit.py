"""Read-only consistency audit of a data dir: do SQLite, the stored BM25 tokens, Chroma and uploads/ agree?

The source of truth is the user's data: the original files and the document/chunk rows in SQLite. Everything
else is derived (vectors from chunk text, BM25 tokens from chunk text, the BM25 index from the tokens) and can
be rebuilt — that is what pipeline.ops.repair does with these findings.

The stores are read at one frozen moment (the data dir's write gate, as a backup does: writes in flight finish,
new writes wait, questions go on), so a document caught between two stores by a concurrent delete is not
reported; the slow part (re-tokenizing every chunk) runs afterwards on the captured rows.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from pipeline.generation.instructions import flagged_sentences
from pipeline.ingestion.structured_chunking import indexed_text
from pipeline.models.tokenize_zh import ChineseTokenizer
from store.documents import DocumentStore, decode_tokens
from store.files import FileStore
from store.vectors import VectorStore
from store.write_lock import WriteLock

# A file younger than this may belong to an upload in flight (saved, its row not yet written).
UPLOAD_GRACE_S = 120
SHOWN_ITEMS = 50

# check → (what it means, what repair does — or None when repair cannot fix it)
CHECKS: dict[str, tuple[str, str | None]] = {
    "model_mismatch": ("向量库的 Embedding 模型与当前加载的模型不一致", "用当前模型按块文本重新向量化全部块"),
    "model_not_loaded": ("配置中的 Embedding 模型与当前加载的模型不一致（配置已改、引擎未重载）", None),
    "missing_files": ("文档的原始文件在磁盘上丢失", None),
    "unreferenced_files": ("uploads/ 中有不属于任何文档的文件", "删除这些文件（先在报告中列出）"),
    "orphan_vectors": ("向量库中有不属于任何块的向量", "删除这些向量"),
    "disabled_vectors": ("已停用的块仍在向量库中（向量检索可能找到它）", "删除这些向量"),
    "missing_vectors": ("就绪文档的块在向量库中没有向量", "按块文本重新向量化"),
    "vector_text_mismatch": ("向量库中保存的文本或文档号与 SQLite 中的块不一致", "按块文本重新向量化"),
    "token_mismatch": ("存储的 BM25 分词与块文本重新分词的结果不一致", "按块文本重新分词并重建 BM25 索引"),
    "bm25_missing": ("就绪的块不在 BM25 索引中（关键词检索找不到）", "重建 BM25 索引"),
    "stuck_processing": ("文档停在「处理中」但没有处理任务", "重新排队处理（原始文件丢失则标记失败）"),
    "ready_without_chunks": ("就绪文档没有任何块", "从原始文件重新处理"),
    "chunk_count_mismatch": ("文档记录的块数与实际块数不一致", "按实际块数更正"),
    "failed_with_data": ("失败的文档仍留有块或向量", "删除这些块和向量"),
}

# What to run for what repair cannot fix (the admin's next step).
UNFIXABLE_HINTS = {
    "model_not_loaded": "重载引擎：配置页「重载引擎」或 POST /api/config/reload，然后再修复",
    "missing_files": ("从备份恢复：python -m tools.ops.restore 备份目录 --data-dir 新目录；或删除这些文档后重新上传："
                      "DELETE /api/kb/documents/{doc_id}"),
}


@dataclass
class ModelIds:
    stored: str | None  # the collection's embedding_model metadata
    stored_dim: int | None
    expected: str  # what the settings select
    loaded: str | None = None  # the model the running engine embeds with (None: offline audit)
    loaded_dim: int | None = None


@dataclass
class Finding:
    check: str
    items: list[dict]

    @property
    def fixable(self) -> bool:
        return CHECKS[self.check][1] is not None

    def to_dict(self) -> dict:
        label, fix = CHECKS[self.check]
        return {"check": self.check, "label": label, "count": len(self.items), "fixable": self.fixable,
                "fix": fix or UNFIXABLE_HINTS[self.check], "items": self.items[:SHOWN_ITEMS]}


@dataclass
class AuditReport:
    findings: list[Finding] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    elapsed_ms: float = 0.0
    tokens_checked: bool = True
    # documents with instruction-like sentences (pipeline.generation.instructions): information, not a problem —
    # they are marked in prompts and never quoted, but an admin may want to look at who planted them
    instruction_flags: list[dict] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return sum(len(f.items) for f in self.findings)

    def items(self, check: str) -> list[dict]:
        return next((f.items for f in self.findings if f.check == check), [])

    def to_dict(self) -> dict:
        return {"problems": self.problems, "ok": self.problems == 0, "counts": self.counts,
                "findings": [f.to_dict() for f in self.findings], "elapsed_ms": round(self.elapsed_ms),
                "tokens_checked": self.tokens_checked, "instruction_flags": self.instruction_flags[:SHOWN_ITEMS]}


class KBAuditor:
    """Receives the stores and a few views of the running engine (all optional for an offline audit)."""

    def __init__(self, docs: DocumentStore, vectors: VectorStore, files: FileStore, tokenizer: ChineseTokenizer,
                 model_ids: Callable[[], ModelIds], bm25_ids: Callable[[], set[int] | None] = lambda: None,
                 has_job: Callable[[int], bool] = lambda doc_id: False, write_lock: WriteLock | None = None):
        self.docs = docs
        self.vectors = vectors
        self.files = files
        self.tokenizer = tokenizer
        self.model_ids = model_ids
        self.bm25_ids = bm25_ids  # chunk ids BM25 finds now (live index) or holds on disk; None: unknown
        self.has_job = has_job
        self.write_lock = write_lock

    def audit(self, check_tokens: bool = True) -> AuditReport:
        t0 = time.perf_counter()
        freeze = self.write_lock.frozen() if self.write_lock is not None else nullcontext()
        with freeze, self.vectors.write_lock:
            docs = {d["doc_id"]: d for d in self.docs.all_docs()}
            chunks = self.docs.audit_rows()
            # switched off by a KB admin: out of both indexes on purpose, neither missing nor to be re-added
            disabled = self.docs.disabled_chunk_ids()
            contexts = self.docs.chunk_contexts()
            vectors = self.vectors.entries()
            files = self.files.listing()
            models = self.model_ids()
            jobs = {d for d in docs if docs[d]["status"] == "processing" and self.has_job(d)}
            bm25 = self.bm25_ids()
        findings: list[Finding] = []

        def add(check: str, items: list[dict]) -> None:
            if items:
                findings.append(Finding(check, items))

        add("model_mismatch", _model_mismatch(models, bool(vectors)))
        if models.loaded is not None and models.loaded != models.expected:
            add("model_not_loaded", [{"expected": models.expected, "loaded": models.loaded}])

        by_doc: dict[int, list[tuple[int, str, str]]] = {}
        for chunk_id, doc_id, text, tokens in chunks:
            by_doc.setdefault(doc_id, []).append((chunk_id, text, tokens))
        ready = {d for d, doc in docs.items() if doc["status"] == "ready"}
        chunk_text = {c: (d, t) for c, d, t, _ in chunks}

        referenced = {d["stored_name"] for d in docs.values() if d.get("stored_name")}
        add("missing_files", [{"doc_id": d, "file_name": doc["file_name"], "stored_name": doc.get("stored_name")}
                              for d, doc in docs.items()
                              if (doc.get("stored_name") or doc["status"] != "failed")  # (a failed web fetch has none)
                              and (not doc.get("stored_name") or doc["stored_name"] not in files)])
        now = time.time()
        add("unreferenced_files", [{"name": n} for n, mtime in sorted(files.items())
                                   if n not in referenced and now - mtime > UPLOAD_GRACE_S])

        add("orphan_vectors", [{"chunk_id": c, "doc_id": d} for c, (d, _) in sorted(vectors.items())
                               if c not in chunk_text])
        if not findings or findings[0].check != "model_mismatch":  # re-embedding everything covers these
            add("missing_vectors", [{"chunk_id": c, "doc_id": d} for c, (d, _) in sorted(chunk_text.items())
                                    if d in ready and c not in vectors and c not in disabled])
            add("vector_text_mismatch", [{"chunk_id": c, "doc_id": d} for c, (d, t) in sorted(chunk_text.items())
                                         if c in vectors and vectors[c] != (d, t)])
        add("disabled_vectors", [{"chunk_id": c, "doc_id": vectors[c][0]} for c in sorted(disabled & vectors.keys())])
        if check_tokens:
            add("token_mismatch", [{"chunk_id": c, "doc_id": d} for c, d, t, tok in sorted(chunks)
                                   if decode_tokens(tok) != self.tokenizer(indexed_text(t, contexts.get(c)))])
        if bm25 is not None:  # an old (inactive) version is meant to be out of BM25
            searchable = {d for d in ready if docs[d].get("active", 1) == 1}
            add("bm25_missing", [{"chunk_id": c} for c in sorted(c for c, (d, _) in chunk_text.items()
                                                                if d in searchable and c not in bm25
                                                                and c not in disabled)])
        add("stuck_processing", [{"doc_id": d, "file_name": doc["file_name"]} for d, doc in docs.items()
                                 if doc["status"] == "processing" and d not in jobs])
        add("ready_without_chunks", [{"doc_id": d, "file_name": docs[d]["file_name"]} for d in sorted(ready)
                                     if not by_doc.get(d)])
        add("chunk_count_mismatch", [{"doc_id": d, "file_name": docs[d]["file_name"],
                                      "recorded": docs[d]["chunk_count"], "actual": len(by_doc[d])}
                                     for d in sorted(ready) if by_doc.get(d) and docs[d]["chunk_count"] != len(by_doc[d])])
        failed = {d for d, doc in docs.items() if doc["status"] == "failed"}
        failed_vec = {d for d, _ in vectors.values() if d in failed}
        add("failed_with_data", [{"doc_id": d, "file_name": docs[d]["file_name"], "chunks": len(by_doc.get(d, ()))}
                                 for d in sorted(failed) if by_doc.get(d) or d in failed_vec])

        counts = {"docs": len(docs), "ready_docs": len(ready), "chunks": len(chunks), "disabled_chunks": len(disabled),
                  "vectors": len(vectors),
                  "files": len(files), "bm25_chunks": None if bm25 is None else len(bm25),
                  "embedding_model": models.stored}
        flags = []
        for d in sorted(by_doc):
            found = [f for _, text, _ in by_doc[d] for f in flagged_sentences(text)]
            if found and d in docs:
                flags.append({"doc_id": d, "file_name": docs[d]["file_name"], "kb_id": docs[d].get("kb_id"),
                              "count": len(found), "sentences": found[:3]})
        counts["instruction_flag_docs"] = len(flags)
        return AuditReport(findings, counts, (time.perf_counter() - t0) * 1000, check_tokens, flags)


def _model_mismatch(m: ModelIds, has_vectors: bool) -> list[dict]:
    """Vectors made by another model than the one that embeds queries (or, offline, that the settings pick)."""
    if not has_vectors or m.stored is None:
        return []
    current = m.loaded if m.loaded is not None else m.expected
    dim_differs = m.loaded_dim is not None and m.stored_dim is not None and int(m.stored_dim) != int(m.loaded_dim)
    if m.stored != current or dim_differs:
        return [{"stored": m.stored, "stored_dim": m.stored_dim, "current": current, "current_dim": m.loaded_dim}]
    return []
