"""Safe repair of derived state from an audit (pipeline.ops.audit): never a user's original file or text.

What it does, per finding: re-embed chunks from their SQLite text (missing / altered vectors, or all of them
after a model change), drop orphan vectors, re-tokenize chunks, rebuild the BM25 index, requeue documents stuck
in 处理中 (or mark them failed when their original is gone), re-ingest 就绪 documents without chunks from their
original, correct chunk counts, drop chunks/vectors left by failed documents, and delete files in uploads/ that
no document references (listed in the report first). What it cannot fix (a lost original, settings that need a
reload) stays in the report with the command to run.

Each change is applied inside a short freeze of the data dir (store.write_lock) after re-checking, at that moment,
that the finding still holds — the audit's view may be seconds old and ingest keeps running. Embedding happens
outside the freeze.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.ingestion.structured_chunking import indexed_text
from pipeline.ops.audit import UPLOAD_GRACE_S, AuditReport, KBAuditor

log = logging.getLogger(__name__)

EMBED_BATCH = 32


@dataclass
class RepairHooks:
    """What repair needs from the running engine (ingest queue, BM25, the loaded embedding model)."""

    embed: Callable[[list[str]], list[list[float]]]
    model: Callable[[], tuple[str, int]]  # (model id, dimension) of `embed`
    requeue: Callable[[int], None]  # put a document on the ingest queue
    rebuild_bm25: Callable[[], None]
    on_model_fixed: Callable[[], None] = lambda: None  # the engine clears its 需要全量重建 warning


@dataclass
class RepairResult:
    before: AuditReport
    after: AuditReport | None = None
    actions: list[dict] = field(default_factory=list)
    elapsed_ms: float = 0.0

    def did(self, check: str, n: int, what: str, items: list | None = None) -> None:
        if n:
            self.actions.append({"check": check, "count": n, "what": what, **({"items": items} if items else {})})

    def to_dict(self) -> dict:
        after = self.after.to_dict() if self.after else None
        return {"before": self.before.problems, "after": after["problems"] if after else None,
                "actions": self.actions, "unfixed": [f for f in (after or {}).get("findings", [])],
                "report": after, "elapsed_ms": round(self.elapsed_ms)}


class KBRepairer:
    """Repairs what its auditor finds, over the auditor's own stores and write lock (it must have one)."""

    def __init__(self, auditor: KBAuditor, hooks: RepairHooks):
        self.auditor = auditor
        self.docs = auditor.docs
        self.vectors = auditor.vectors
        self.files = auditor.files
        self.tokenizer = auditor.tokenizer
        self.write_lock = auditor.write_lock
        self.hooks = hooks

    def repair(self, wait_requeued: Callable[[], None] = lambda: None) -> RepairResult:
        t0 = time.perf_counter()
        report = self.auditor.audit()
        res = RepairResult(report)
        ids = {f.check: f.items for f in report.findings}
        if "model_mismatch" in ids and "model_not_loaded" not in ids:
            self._reembed_all(res)
        self._drop_orphans([i["chunk_id"] for i in ids.get("orphan_vectors", [])], res)
        self._drop_disabled([i["chunk_id"] for i in ids.get("disabled_vectors", [])], res)
        self._drop_failed_data([i["doc_id"] for i in ids.get("failed_with_data", [])], res)
        self._reembed([i["chunk_id"] for i in ids.get("missing_vectors", []) + ids.get("vector_text_mismatch", [])],
                      res)
        retokenized = self._retokenize([i["chunk_id"] for i in ids.get("token_mismatch", [])], res)
        self._requeue_stuck([i["doc_id"] for i in ids.get("stuck_processing", [])], res)
        self._reingest([i["doc_id"] for i in ids.get("ready_without_chunks", [])], res)
        self._fix_counts(ids.get("chunk_count_mismatch", []), res)
        self._drop_unreferenced([i["name"] for i in ids.get("unreferenced_files", [])], res)
        if retokenized or "bm25_missing" in ids:
            self.hooks.rebuild_bm25()
            res.did("bm25_missing", 1, "重建 BM25 索引")
        wait_requeued()  # requeued documents are re-ingested before the closing audit
        res.after = self.auditor.audit()
        res.elapsed_ms = (time.perf_counter() - t0) * 1000
        log.info("repair: %d problems before, %d after; %s", report.problems, res.after.problems,
                 [(a["check"], a["count"]) for a in res.actions])
        return res

    # --- vectors ---------------------------------------------------------------------------------------
    def _write_vectors(self, chunk_ids: list[int]) -> int:
        """Embed the chunks' current SQLite text and replace their vectors; returns how many were written."""
        done = 0
        for start in range(0, len(chunk_ids), EMBED_BATCH):
            rows = self.docs.get_chunks(chunk_ids[start:start + EMBED_BATCH])
            # a chunk a KB admin switched off stays out of the vector route (pipeline/services/chunks.py)
            batch = [rows[c] for c in chunk_ids[start:start + EMBED_BATCH] if c in rows and rows[c].get("enabled", 1)]
            if not batch:
                continue
            embs = self.hooks.embed([indexed_text(r["text"], r.get("context")) for r in batch])  # as ingest does
            with self.write_lock.frozen():
                now = self.docs.get_chunks([r["chunk_id"] for r in batch])
                keep = [(r, e) for r, e in zip(batch, embs)  # still there, enabled, with the text we embedded
                        if r["chunk_id"] in now and now[r["chunk_id"]]["text"] == r["text"]
                        and now[r["chunk_id"]].get("enabled", 1)]
                if not keep:
                    continue
                ids = [r["chunk_id"] for r, _ in keep]
                self.vectors.delete_ids(ids)
                self.vectors.add_many(ids, [e for _, e in keep], [r["text"] for r, _ in keep],
                                      [r["doc_id"] for r, _ in keep], [r["file_name"] for r, _ in keep])
            done += len(keep)
        return done

    def _reembed(self, chunk_ids: list[int], res: RepairResult) -> None:
        if chunk_ids:
            self.vectors.claim_model(*self.hooks.model())
            res.did("missing_vectors", self._write_vectors(sorted(set(chunk_ids))), "按块文本重新向量化")

    def _reembed_all(self, res: RepairResult) -> None:
        """Vectors of another model: start the collection over and embed every chunk with the loaded model."""
        with self.write_lock.frozen():
            self.vectors.reset()
            self.vectors.claim_model(*self.hooks.model())
        n = self._write_vectors(sorted(c for c, *_ in self.docs.audit_rows()))
        self.hooks.on_model_fixed()
        res.did("model_mismatch", n, "清空向量库并用当前模型重新向量化全部块")

    def _drop_orphans(self, chunk_ids: list[int], res: RepairResult) -> None:
        if not chunk_ids:
            return
        with self.write_lock.frozen():
            alive = self.docs.get_chunks(chunk_ids)
            gone = [c for c in chunk_ids if c not in alive]
            self.vectors.delete_ids(gone)
        res.did("orphan_vectors", len(gone), "删除孤立向量")

    def _drop_disabled(self, chunk_ids: list[int], res: RepairResult) -> None:
        if not chunk_ids:
            return
        with self.write_lock.frozen():
            off = self.docs.disabled_chunk_ids() & set(chunk_ids)  # still switched off now
            self.vectors.delete_ids(sorted(off))
        res.did("disabled_vectors", len(off), "删除已停用块的向量")

    def _drop_failed_data(self, doc_ids: list[int], res: RepairResult) -> None:
        n = 0
        for doc_id in doc_ids:
            with self.write_lock.frozen():
                doc = self.docs.get(doc_id)
                if doc is None or doc["status"] != "failed":
                    continue
                self.vectors.delete_doc(doc_id)
                self.docs.delete_chunks(doc_id)
                n += 1
        res.did("failed_with_data", n, "删除失败文档残留的块和向量")

    # --- tokens, documents, files ----------------------------------------------------------------------
    def _retokenize(self, chunk_ids: list[int], res: RepairResult) -> int:
        if not chunk_ids:
            return 0
        rows = self.docs.get_chunks(chunk_ids)
        fresh = {c: self.tokenizer(indexed_text(r["text"], r.get("context"))) for c, r in rows.items()}
        with self.write_lock.frozen():
            now = self.docs.get_chunks(list(fresh))
            fresh = {c: t for c, t in fresh.items() if c in now and now[c]["text"] == rows[c]["text"]}
            self.docs.set_tokens(fresh)
        res.did("token_mismatch", len(fresh), "按块文本重新分词")
        return len(fresh)

    def _requeue(self, doc_id: int, expect_status: str) -> str | None:
        """Clean a document's derived data and queue it again; returns the outcome, or None if it moved on."""
        with self.write_lock.frozen():
            doc = self.docs.get(doc_id)
            if doc is None or doc["status"] != expect_status or self.auditor.has_job(doc_id):
                return None
            self.vectors.delete_doc(doc_id)
            self.docs.delete_chunks(doc_id)
            if not doc.get("stored_name") or not self.files.path_of(doc["stored_name"]).exists():
                self.docs.set_status(doc_id, "failed", "原始文件丢失，无法重新处理")
                return "failed"
            self.docs.set_status(doc_id, "processing", None, "修复：重新处理")
            self.hooks.requeue(doc_id)
            return "requeued"

    def _requeue_stuck(self, doc_ids: list[int], res: RepairResult) -> None:
        outcome = [self._requeue(d, "processing") for d in doc_ids]
        res.did("stuck_processing", outcome.count("requeued"), "重新排队处理")
        res.did("stuck_processing", outcome.count("failed"), "原始文件丢失，标记为失败")

    def _reingest(self, doc_ids: list[int], res: RepairResult) -> None:
        outcome = [self._requeue(d, "ready") for d in doc_ids]
        res.did("ready_without_chunks", outcome.count("requeued"), "从原始文件重新处理")
        res.did("ready_without_chunks", outcome.count("failed"), "原始文件丢失，标记为失败")

    def _fix_counts(self, items: list[dict], res: RepairResult) -> None:
        n = 0
        for it in items:
            with self.write_lock.frozen():
                doc = self.docs.get(it["doc_id"])
                if doc is None or doc["status"] != "ready":
                    continue
                actual = self.docs.chunk_count_of(it["doc_id"])
                if actual:
                    self.docs.set_chunk_count(it["doc_id"], actual)
                    n += 1
        res.did("chunk_count_mismatch", n, "按实际块数更正")

    def _drop_unreferenced(self, names: list[str], res: RepairResult) -> None:
        removed = []
        with self.write_lock.frozen():
            referenced = {d.get("stored_name") for d in self.docs.all_docs()}
            listing = self.files.listing()
            for name in names:
                if name in referenced or name not in listing or time.time() - listing[name] <= UPLOAD_GRACE_S:
                    continue
                self.files.delete(name)
                removed.append(name)
        res.did("unreferenced_files", len(removed), "删除不属于任何文档的文件", removed)
