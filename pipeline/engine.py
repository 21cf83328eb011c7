"""The engine facade: the one object ui/ and api/ talk to.

app.py builds exactly one Engine and hands it to the UI and the HTTP API; tests build their own on a temp data
dir. The Engine owns no construction logic (pipeline.components builds everything) and no pipeline logic (the
services do); it holds the current settings and the engine state, checks inputs, and runs the answer stream.
Nothing here imports gradio or fastapi.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline import events as ev
from pipeline.calibration import profile_for
from pipeline.components import Components, build_components, build_ops, load_models
from pipeline.conversation.direct import direct_reply
from pipeline.conversation.rewrite import Rewrite
from pipeline.conversation.router import DIRECT, Route
from pipeline.conversation.service import TurnRecorder
from pipeline.deployment import Deployment
from pipeline.errors import CODE_ENGINE, CODE_LLM, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.ingestion.progress import shared_snapshot
from pipeline.ingestion.rebuild import Rebuild
from pipeline.ingestion.service import IngestBusy, UploadResult
from pipeline.kb_access import KBAccess, Reader
from pipeline.models.paths import embedding_model_id, resolve_model_dir
from pipeline.ops import backup as backup_ops
from pipeline.ops.audit import ModelIds
from pipeline.retrieval.result import RetrievalResult
from pipeline.retry_cache import StoredRetrievals
from pipeline.settings import (
    DEFAULT_EMBEDDING_PATH,
    DEFAULT_RERANKER_PATH,
    LABELS,
    SECRET_FIELDS,
    Settings,
    SettingsError,
    effect_of,
    flatten_grouped,
    is_masked,
    merge_update,
    settings_from_stored,
    validate_settings,
)
from pipeline.shared_sync import SharedSync
from store.migrations import DEFAULT_KB_ID
from store.shared_state import CONFIG_VERSION, ENGINE_VERSION, KB_GENERATION

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 2000

__all__ = ["Engine", "EngineError"]


class Engine:
    def __init__(self, data_dir: Path | str = "data", project_root: Path | None = None,
                 models_dir: Path | None = None, load_async: bool = False, deployment: Deployment | None = None,
                 calibration_dir: Path | None = None):
        self.components: Components = build_components(
            data_dir, project_root=project_root, models_dir=models_dir, settings=lambda: self.settings,
            on_ingested=self._after_ingest, busy_reason=self._busy_reason, delete_document=self.delete_document,
            deployment=deployment, calibration_dir=calibration_dir)
        c = self.components
        self.data_dir, self.project_root, self.models_dir = c.data_dir, c.project_root, c.models_dir
        self._settings = self._load_settings()
        self.state = "loading"
        self.load_error: str | None = None
        self.retrieval_calls = 0
        self.last_reload_ms: float | None = None
        self._recent = StoredRetrievals(c.retrievals, c.docs.get_chunks)
        # Other app processes on the same database: their settings saves, reloads and KB changes reach us here.
        self._sync = SharedSync(c.state, on_kb=self._refresh_bm25, on_config=self._reread_settings,
                                on_engine=self._reload_from_elsewhere)
        self._rebuild = Rebuild(c, lambda: self._settings, on_done=self._after_rebuild)
        self._access = KBAccess(c.kbs)  # per-KB readers: every read below takes a `reader` (None = everyone)
        self.auditor, self.repairer = build_ops(c, model_ids=self._model_ids, has_job=self._has_job,
                                                rebuild_bm25=self._after_ingest,
                                                on_model_fixed=self._refresh_model_warning)
        self._lock = threading.RLock()
        if load_async:
            threading.Thread(target=self._load_guarded, name="engine-load", daemon=True).start()
        else:
            self.load()

    # ------------------------------------------------------------------ settings
    def expected_model_id(self, s: Settings | None = None) -> str:
        s = s or self._settings
        return embedding_model_id(s.embedding_model_path, self.project_root)

    def default_settings(self, s: Settings | None = None) -> Settings:
        """SRS defaults, with min_similarity from the calibration profile of the embedding model the settings
        select (the generic profile's when that model has none)."""
        base = Settings()
        probe = s or base
        floor = profile_for(self.expected_model_id(probe), None, self.components.calibration_dir).profile.floor
        return base.model_copy(update={"min_similarity": floor.min_similarity})

    def _load_settings(self) -> Settings:
        stored = self.components.config.load()
        if not stored:
            defaults = self.default_settings().model_dump()
            self.components.config.write_defaults(defaults)
            stored = defaults
        else:
            self.components.config.write_defaults({k: v for k, v in Settings().model_dump().items() if k not in stored})
        settings, dropped = settings_from_stored(stored)  # a hand-edited database must not stop the app
        for key, why in dropped.items():
            log.error("stored setting %s invalid (%s); using its default", key, why)
        return settings

    @property
    def settings(self) -> Settings:
        self._sync_check()
        return self._settings

    def _sync_check(self) -> None:
        """Catch up with changes other app processes made (one read of app_state)."""
        try:
            self._sync.check()
        except Exception:  # best effort: the request itself reports a database outage
            log.exception("checking shared state failed")

    def _reread_settings(self) -> None:
        old, self._settings = self._settings, self._load_settings()
        if (old.bm25_k1, old.bm25_b) != (self._settings.bm25_k1, self._settings.bm25_b) and self.state == "ready":
            self._sync.refresh_kb()

    def _reload_from_elsewhere(self) -> None:
        self._settings = self._load_settings()
        try:
            self.load()
        except EngineError:
            pass  # state/load_error say why

    def update_settings(self, payload: dict[str, Any]) -> dict:
        """Validate, persist and apply a partial settings change (grouped or flat)."""
        flat = flatten_grouped(payload)
        self._sync_check()  # merge onto the newest settings, whichever process saved them
        new, changed = merge_update(self._settings, flat)
        self._check_model_paths(new, changed)
        self.components.config.save({k: new.model_dump()[k] for k in changed})
        if changed:
            self._sync.bump(CONFIG_VERSION)
        old = self._settings
        self._settings = new
        if {"bm25_k1", "bm25_b"} & set(changed) and self.state == "ready":
            for kb in self.components.kbs.all():
                kb.bm25.rebuild(new.bm25_k1, new.bm25_b)
        effect = effect_of(changed)
        warnings = []
        if "embedding_model_path" in changed and self.expected_model_id(new) != self.expected_model_id(old):
            warnings.append("更换 Embedding 模型后需要 重载引擎 并 全量重建 知识库")
        if effect["need_rebuild"]:
            warnings.append("切块参数对新上传的文档立即生效；已有文档需要 全量重建 才会按新参数切块")
        if effect["need_reload"]:
            warnings.append("以下参数需要点击 重载引擎 才生效：" + "、".join(LABELS.get(k, k) for k in effect["need_reload"]))
        return {"changed": changed, **effect, "warnings": warnings, "config": new.grouped(mask=True)}

    def _check_model_paths(self, new: Settings, changed: list[str]) -> None:
        errors = {}
        for key, default in (("embedding_model_path", DEFAULT_EMBEDDING_PATH),
                             ("reranker_model_path", DEFAULT_RERANKER_PATH)):
            if key not in changed:
                continue
            value = getattr(new, key).strip()
            if not value or value == default:
                continue  # empty → packaged default / skipped; the untouched SRS default may be absent
            if resolve_model_dir(value, self.project_root) is None:
                errors[key] = f"{LABELS[key]} 无效：目录 {value} 不存在或不含 config.json"
        if errors:
            raise SettingsError(errors)

    def check_settings(self, payload: dict[str, Any]) -> dict[str, str]:
        """What saving this change would refuse (field → message); {} when it would be accepted. Saves nothing
        (the settings tab asks while the user types, to mark fields red and disable 保存)."""
        try:
            new, changed = merge_update(self._settings, flatten_grouped(payload))
            self._check_model_paths(new, changed)
        except SettingsError as exc:
            return dict(exc.errors)
        return {}

    def test_llm(self, payload: dict[str, Any] | None = None) -> dict:
        """Connectivity test with the given (possibly unsaved) LLM values; masked key → the stored key."""
        from pipeline.generation.llm_client import test_llm_connection

        vals = self._settings.model_dump()
        flat = flatten_grouped(payload or {})
        for k in ("llm_api_url", "llm_model", "llm_api_key", "llm_timeout"):
            v = flat.get(k)
            if v is None or (k in SECRET_FIELDS and is_masked(v)):
                continue
            vals[k] = v
        try:  # the same rules as saving: a bad URL is named before any connection is tried
            vals = validate_settings(vals).model_dump()
        except SettingsError as exc:
            return {"ok": False, "msg": str(exc)}
        if not vals["llm_api_url"] or not vals["llm_model"]:
            return {"ok": False, "msg": "请先填写 API 地址和模型名称"}
        t = min(float(vals.get("llm_timeout") or 10), 30)
        ok, msg = test_llm_connection(vals["llm_api_url"], vals["llm_model"], vals["llm_api_key"], timeout=t)
        return {"ok": ok, "msg": msg}

    # ------------------------------------------------------------------ loading
    def _load_guarded(self) -> None:
        try:
            self.load()
        except EngineError:
            pass  # state/load_error already say why; health() reports it

    def load(self) -> float:
        """(Re)load models and indexes. Questions get 2002 while this runs."""
        t0 = time.perf_counter()
        with self._lock:
            self.state = "loading" if self.components.models is None else "reloading"
            try:
                s = self._settings
                load_models(self.components, s)
                with self.components.gate.writing():
                    self._recover()
                for kb in self.components.kbs.all():
                    kb.bm25.load_or_rebuild(s.bm25_k1, s.bm25_b, self.components.docs.ready_chunk_ids(kb.kb_id))
                self._recent.clear()
                self.state, self.load_error = "ready", None
            except Exception as exc:
                # Never stay "reloading" forever: report the failure (health, 2002 with the reason).
                log.exception("engine load failed")
                self.load_error = f"{type(exc).__name__}: {exc}"
                self.state = "error"
                raise EngineError(CODE_ENGINE, f"引擎加载失败：{self.load_error}") from exc
        self.last_reload_ms = (time.perf_counter() - t0) * 1000
        # a background stored by an older release (or for other settings) is stale: re-measure it now, off the
        # request path, rather than in the first question (each knowledge base whose row matches is skipped)
        self._refresh_gate_background()
        m = self.components.models
        log.info("engine ready in %.0f ms (embedding: %s, rerank: %s, llm: %s)", self.last_reload_ms,
                 m.embedding.label, self.components.retrieval.rerank_label or "无", self._settings.llm_model or "未配置")
        return self.last_reload_ms

    def reload(self) -> float:
        """重载引擎 here and, through the engine version in the database, on every other app process."""
        if self._rebuild_busy():
            raise EngineError(CODE_ENGINE, "全量重建进行中，请完成后再重载引擎")
        self._sync.bump(ENGINE_VERSION)
        return self.load()

    @property
    def model_warning(self) -> str | None:
        m = self.components.models
        return m.model_warning if m else None

    def _recover(self) -> None:
        """Restart safety: documents left 处理中 are queued (the ingest queue resumes them); orphan vectors go."""
        self.components.ingest.recover()

    def _after_ingest(self) -> None:
        self._sync.refresh_kb()

    def _refresh_bm25(self) -> None:
        """Another process changed what is 就绪 (or this one did): every knowledge base's BM25 follows. Knowledge
        bases another process deleted lose their handles and what retrieval built over them."""
        c = self.components
        gone = c.kbs.forget_missing()
        for kb_id in gone:
            if c.retrieval is not None:
                c.retrieval.forget(kb_id)
        if gone:
            self._recent.clear()
        for kb in c.kbs.all():
            kb.vectors.reopen()  # another process may have re-created the collection (model change)
        m = c.models
        if m is not None and m.model_warning:  # another process's 全量重建 may have resolved it
            m.model_warning = c.kbs.model_warning(m.embedding.model_id, m.embedding.dim)
        for kb in c.kbs.all():
            kb.bm25.rebuild(self._settings.bm25_k1, self._settings.bm25_b)
        self._refresh_gate_background()

    def _after_rebuild(self) -> None:
        self._recent.clear()
        self._refresh_gate_background()

    def _refresh_gate_background(self) -> None:
        """A knowledge base changed: score the gate's probe questions against it soon, not at the next question
        (every knowledge base whose ready chunks changed; the others keep their stored background)."""
        if self.state == "ready" and self.components.gate_background is not None:
            self.components.gate_background.refresh_soon()

    def _rebuild_busy(self) -> bool:
        return self._rebuild.running or self._rebuild.running_elsewhere()

    def _busy_reason(self) -> str | None:
        if self._rebuild_busy():
            return "全量重建进行中，暂不能上传或删除文档，请稍后再试"
        if self.state != "ready":
            return "引擎加载中，请稍后" if self.state in ("loading", "reloading") else f"引擎未就绪：{self.load_error}"
        if self.model_warning:
            return self.model_warning
        return None

    def _require_ready(self) -> None:
        if self.state in ("loading", "reloading"):
            raise EngineError(CODE_ENGINE, "引擎重载中，请稍后" if self.state == "reloading" else "引擎加载中，请稍后")
        if self.state != "ready":
            raise EngineError(CODE_ENGINE, f"引擎未就绪：{self.load_error}")

    # ------------------------------------------------------------------ status
    def health(self, kb_id: int | None = None) -> dict:
        """Engine state and counts: of all knowledge bases, or of `kb_id`."""
        self._sync_check()
        c = self.components
        if kb_id is not None:
            kb_id = c.kbs.check(kb_id)
        counts = c.docs.counts(kb_id)
        emb = c.models.embedding if c.models else None
        rerank_label = c.retrieval.rerank_label if c.retrieval else ""
        cal = c.models.calibration if c.models else None
        return {
            "status": "ok", "engine": "ready" if self.state == "ready" else "loading",
            "state": self.state, "chunks": counts["chunks"], "docs": counts["docs"],
            "processing": counts["processing"], "queued": c.ingest.progress.queue_length, "embedding_model": emb.label if emb else None,
            "reranker": rerank_label or "未配置精排模型",
            "llm": self._settings.llm_model or "未配置（原文摘录模式）",
            "warning": self.model_warning, "rebuild": self._rebuild.status(), "kb_id": kb_id,
            "kbs": len(c.kbs.ids()),
            # the fitted numbers the engine runs on: the embedding model's own profile, or the generic one
            "calibrated": cal.calibrated if cal else None, "calibration": cal.info() if cal else None,
        }

    # ------------------------------------------------------------------ knowledge bases
    def list_kbs(self, reader: Reader | None = None) -> list[dict]:
        """The knowledge bases the reader may read, with document and chunk counts and `readers` (None = open to
        every logged-in user), the default one first."""
        return self._access.readable(reader)

    def get_kb(self, kb_id: int, reader: Reader | None = None) -> dict:
        return self.components.kbs.store.get(self._access.check(kb_id, reader))

    def create_kb(self, name: str, description: str = "", readers: list[str] | None = None) -> dict:
        return self.components.kbs.create(name, description, readers)

    def update_kb(self, kb_id: int, name: str | None = None, description: str | None = None,
                  readers: Any = ...) -> dict:
        """`readers`: ... unchanged, None = every logged-in user, a list = only these users (and KB admins)."""
        return self.components.kbs.update(kb_id, name, description, readers)

    def delete_kb(self, kb_id: int) -> dict:
        """Delete a knowledge base and everything in it (documents, versions, chunks, vectors, BM25, files).
        The default knowledge base stays (the SRS §7 paths work on it)."""
        c = self.components
        kb_id = c.kbs.check(kb_id)
        if kb_id == DEFAULT_KB_ID:
            raise EngineError(CODE_VALIDATION, "默认知识库不能删除（可以重命名）", "kb_id")
        self._refuse_while_rebuilding()
        kb = c.kbs.store.get(kb_id)
        docs = c.docs.all_docs(kb_id)
        for d in docs:
            c.ingest.cancel(d["doc_id"])
        for d in docs:
            c.docs.delete(d["doc_id"])
            c.files.delete(d.get("stored_name"))
        c.kbs.drop(kb_id)
        if c.retrieval is not None:
            c.retrieval.forget(kb_id)
        if c.gate_background is not None:
            c.gate_background.forget(kb_id)
        self._recent.clear()
        self._sync.bump(KB_GENERATION)  # other processes drop their handles of it (_refresh_bm25)
        return {"kb_id": kb_id, "name": kb["name"], "docs_removed": len(docs)}

    def resolve_kbs(self, kb_ids: Any = None, reader: Reader | None = None) -> list[int]:
        """The knowledge bases a question searches: the given ids (each checked to exist and be readable), or the
        default one (all readable ones when the reader may not read the default one) — pipeline.kb_access."""
        return self._access.scope(kb_ids, reader)

    # ------------------------------------------------------------------ documents
    def upload(self, items: list[tuple[str, Path]], kb_id: int = DEFAULT_KB_ID) -> list[UploadResult]:
        self.components.kbs.check(kb_id, fresh=True)  # deleted by another process meanwhile: 3002
        try:
            return self.components.ingest.upload(items, kb_id)
        except IngestBusy as exc:
            raise EngineError(CODE_ENGINE, str(exc)) from None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued document is processed (scripts, tests, benchmarks)."""
        return self.components.ingest.wait_idle(timeout)

    def list_documents(self, page: int = 1, size: int = 20, keyword: str = "", kb_id: int = DEFAULT_KB_ID,
                       reader: Reader | None = None) -> dict:
        """Paged documents of a knowledge base; processing ones carry stage / stage_label / done / total /
        position / eta_s; each its version and how many versions it has."""
        kb_id = self._access.check(kb_id, reader)
        items, total = self.components.docs.list(page, size, keyword, kb_id)
        elsewhere: dict | None = None  # what the queue in the database says (one read, only when needed)
        for d in items:
            d.pop("stored_name", None)
            p = self._progress_of(d)
            if d["status"] == "processing" and p["position"] is None and p["stage"] in ("queued", None):
                elsewhere = self.components.jobs.progress() if elsewhere is None else elsewhere
                p = shared_snapshot(elsewhere.get(d["doc_id"])) or p  # another process's document or place
            d.update(p)
        return {"items": items, "total": total, "page": page, "size": size, "kb_id": kb_id}

    def _progress_of(self, doc: dict) -> dict:
        snap = self.components.ingest.progress.snapshot(doc["doc_id"]) if doc["status"] == "processing" else None
        if snap is None:
            empty = {"stage": None, "stage_label": None, "done": None, "total": None, "position": None,
                     "eta_s": None}
            # 处理中 but not (yet) on the board: just enqueued by a restart, or the rebuild's turn is to come
            return empty | ({"stage": "queued", "stage_label": "排队"} if doc["status"] == "processing" else {})
        snap["progress"] = snap.pop("text")  # the text field of the first release, now from the board
        return snap

    def _readable_doc(self, doc_id: int, reader: Reader | None) -> dict:
        """The document row (3002 when missing) if the reader may read its knowledge base (else 4003)."""
        d = self.components.docs.get(doc_id)
        if d is None:
            raise EngineError(CODE_NO_DOC, f"文档不存在：{doc_id}")
        self._access.check(d.get("kb_id") or DEFAULT_KB_ID, reader)
        return d

    def get_document(self, doc_id: int, reader: Reader | None = None) -> dict:
        d = self._readable_doc(doc_id, reader)
        d.pop("stored_name", None)
        return d

    def document_chunks(self, doc_id: int, reader: Reader | None = None) -> list[dict]:
        self.get_document(doc_id, reader)
        return self.components.docs.chunks_of(doc_id)

    def _refuse_while_rebuilding(self) -> None:
        if self._rebuild_busy():
            raise EngineError(CODE_ENGINE, "全量重建进行中，暂不能上传或删除文档，请稍后再试")

    def delete_document(self, doc_id: int) -> dict:
        """Delete a document: its active version deletes the whole document (every version); an old, a failed
        or a still-processing new version deletes only that version."""
        self._refuse_while_rebuilding()
        c = self.components
        doc = c.docs.get(doc_id)
        if doc is None:
            raise EngineError(CODE_NO_DOC, f"文档不存在：{doc_id}")
        whole = doc.get("active", 1) == 1
        targets = c.docs.versions_of(doc["lineage_id"]) if whole and doc.get("lineage_id") else [doc]
        kb = c.kbs.get(doc["kb_id"])
        removed = 0
        for d in targets:
            chunk_ids = [ch["chunk_id"] for ch in c.docs.chunks_of(d["doc_id"])]
            kb.bm25.soft_delete(chunk_ids)  # excluded from BM25 at once, before the rebuild lands
            c.ingest.cancel(d["doc_id"])
            with c.gate.writing():  # all three stores or none, as far as a backup can see
                kb.vectors.delete_doc(d["doc_id"])
                c.docs.delete(d["doc_id"])
                c.files.delete(d.get("stored_name"))
            removed += len(chunk_ids)
        self._recent.clear()  # stored retrievals may hold its chunks
        self._sync.bump(KB_GENERATION)  # other processes rebuild their BM25 (their lookups already skip it)
        threading.Thread(target=self._after_ingest, name="bm25-rebuild", daemon=True).start()
        return {"doc_id": doc_id, "file_name": doc["file_name"], "chunks_removed": removed,
                "versions_removed": len(targets)}

    # ------------------------------------------------------------------ versions
    def document_versions(self, doc_id: int, reader: Reader | None = None) -> list[dict]:
        """Every version of the document `doc_id` belongs to, newest first (active flag, date, status)."""
        doc = self.get_document(doc_id, reader)
        out = self.components.docs.versions_of(doc["lineage_id"] or doc_id)
        for d in out:
            d.pop("stored_name", None)
        return out

    def restore_version(self, doc_id: int) -> dict:
        """Make an old (就绪) version the active one again; the current one becomes inactive."""
        self._refuse_while_rebuilding()
        c = self.components
        doc = self.get_document(doc_id)
        if doc["status"] != "ready":
            raise EngineError(CODE_VALIDATION, "只能恢复已就绪的版本", "doc_id")
        if doc["active"] == 1:
            return {"doc_id": doc_id, "version": doc["version"], "changed": False}
        c.docs.restore(doc_id)
        # Both routes filter on the active flag at once; the BM25 index of the KB must hold the restored chunks.
        c.kbs.get(doc["kb_id"]).bm25.rebuild(self._settings.bm25_k1, self._settings.bm25_b)
        self._recent.clear()
        return {"doc_id": doc_id, "version": doc["version"], "changed": True}

    # ------------------------------------------------------------------ viewer
    def document_text(self, doc_id: int, part: int | None = None, chunk_id: int | None = None,
                      reader: Reader | None = None) -> dict:
        """One part of a document's parsed text with its chunks' spans (pipeline.document_view); with `chunk_id`
        the part holding that chunk, which is the one to highlight."""
        from pipeline.document_view import document_view

        c = self.components
        doc = self._readable_doc(doc_id, reader)
        view = document_view(c.docs, doc, c.kbs.store.names().get(doc.get("kb_id")), part, chunk_id)
        if doc.get("active") != 1 and doc.get("lineage_id"):
            current = c.docs.find_active_in_lineage(doc["lineage_id"])
            view["current_version"] = current["version"] if current else None
            view["current_doc_id"] = current["doc_id"] if current else None
        return view

    def page_image(self, doc_id: int, page: int, chunk_id: int | None = None,
                   reader: Reader | None = None) -> tuple[bytes, bool]:
        """(JPEG of a PDF page, whether the chunk's passage is boxed on it — only where the text layer allows)."""
        from pipeline.page_image import render_page

        path, _ = self.document_file(doc_id, reader)
        doc = self.components.docs.get(doc_id)
        if doc["file_type"] != "pdf":
            raise EngineError(CODE_VALIDATION, "只有 PDF 文档有页面图", "doc_id")
        passage = None
        if chunk_id is not None:
            ch = next((c for c in self.components.docs.chunks_of(doc_id) if c["chunk_id"] == int(chunk_id)), None)
            if ch is None:
                raise EngineError(CODE_NO_DOC, f"块 {chunk_id} 不属于文档 {doc_id}", "chunk_id")
            page = ch["page"] or page
            passage = ch["text"] if ch["source"] != "ocr" else None
        try:
            return render_page(path, int(page), passage)
        except IndexError:
            raise EngineError(CODE_VALIDATION, f"页码 {page} 超出范围", "page") from None

    def chunk_document(self, chunk_id: int) -> int:
        """The document a chunk belongs to (a source card knows its chunk)."""
        row = self.components.docs.get_chunks([chunk_id]).get(int(chunk_id))
        if row is None:
            raise EngineError(CODE_NO_DOC, f"块不存在：{chunk_id}")
        return row["doc_id"]

    def document_file(self, doc_id: int, reader: Reader | None = None) -> tuple[Path, str]:
        """(path of the stored original, its display name) for download."""
        c = self.components
        doc = self._readable_doc(doc_id, reader)
        path = c.files.path_of(doc["stored_name"]) if doc.get("stored_name") else None
        if path is None or not path.exists():
            raise EngineError(CODE_NO_DOC, f"文档 {doc_id} 的原始文件不存在")
        return path, doc["file_name"]

    def source_states(self, doc_ids) -> dict[int, dict]:
        """For cited documents: still there, active or an old version (replays show 「旧版本」)."""
        return self.components.docs.active_states(doc_ids)

    def start_rebuild(self, kb_id: int | None = None) -> dict:
        """Full rebuild of all knowledge bases, or of one."""
        return self._rebuild.start(require_ready=self._require_ready, kb_id=kb_id)

    def rebuild_status(self) -> dict:
        return self._rebuild.status()

    def rebuild(self, timeout: float | None = None, kb_id: int | None = None) -> dict:
        """Blocking full rebuild (scripts/tests)."""
        self.start_rebuild(kb_id)
        return self.wait_rebuild(timeout)

    def wait_rebuild(self, timeout: float | None = None) -> dict:
        return self._rebuild.wait(timeout)

    # ------------------------------------------------------------------ audit, repair, backup (pipeline/ops)
    def _model_ids(self) -> ModelIds:
        c = self.components
        stored, stored_dim = c.kbs.all_vectors.model_info()
        emb = c.models.embedding if c.models else None
        return ModelIds(stored, stored_dim, self.expected_model_id(), emb.model_id if emb else None,
                        emb.dim if emb else None)

    def _has_job(self, doc_id: int) -> bool:
        return self.components.ingest.is_queued(doc_id) or self._rebuild.running

    def _refresh_model_warning(self) -> None:
        m = self.components.models
        m.model_warning = self.components.kbs.model_warning(m.embedding.model_id, m.embedding.dim)

    def audit(self, check_tokens: bool = True) -> dict:
        """Read-only consistency report (pipeline.ops.audit)."""
        self._require_ready()
        return self.auditor.audit(check_tokens).to_dict()

    def repair(self, wait: bool = False, timeout: float | None = None) -> dict:
        """Repair derived state; with `wait`, requeued documents are re-ingested before the closing audit."""
        self._require_ready()
        if self._rebuild.running:
            raise EngineError(CODE_ENGINE, "全量重建进行中，请完成后再修复")
        with self._lock:
            res = self.repairer.repair(wait_requeued=(lambda: self.wait_idle(timeout)) if wait else lambda: None)
        self._recent.clear()  # cached retrievals may hold repaired chunks
        return res.to_dict()

    def backup(self, dest: str | Path) -> dict:
        """Consistent backup of the live data dir into `dest` (absolute, new or empty); returns the manifest."""
        c = self.components
        if c.deployment.database_url or c.deployment.chroma_url:
            raise EngineError(CODE_VALIDATION, "团队模式的数据在 PostgreSQL / Chroma 服务中：请用 pg_dump 备份数据库，"
                              "并备份 Chroma 服务的数据目录和共享的 --files-dir（docs/deploy.md）", "dest")
        try:
            return backup_ops.backup(Path(dest), c.data_dir, c.db, c.kbs.all_vectors, c.files, c.gate)
        except backup_ops.BackupError as exc:
            raise EngineError(CODE_VALIDATION, exc.msg, exc.field) from None

    # ------------------------------------------------------------------ retrieval & answers
    def search(self, query: str, top_k: int = 10, kb_ids: Any = None, reader: Reader | None = None) -> dict:
        """Dual-route debug search in the given knowledge bases (default: the default one)."""
        self._validate_question(query, "query")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 50:
            raise EngineError(CODE_VALIDATION, "top_k 必须是 1–50 的整数", "top_k")
        self._sync_check()
        scope = self.resolve_kbs(kb_ids, reader)
        self._require_ready()
        return self.components.retrieval.debug_search(query.strip(), top_k, self._settings, scope)

    def retrieve(self, question: str, kb_ids: Any = None, reader: Reader | None = None) -> RetrievalResult:
        self._sync_check()
        scope = self.resolve_kbs(kb_ids, reader)
        self._require_ready()
        self.retrieval_calls += 1
        return self.components.retrieval.retrieve(question, self._settings, scope)

    @staticmethod
    def _validate_question(q: Any, field: str = "question") -> None:
        if not isinstance(q, str) or not q.strip():
            raise EngineError(CODE_VALIDATION, f"{field} 不能为空", field)
        if len(q) > MAX_QUESTION_CHARS:
            raise EngineError(CODE_VALIDATION, f"{field} 过长（最多 {MAX_QUESTION_CHARS} 字）", field)

    # ---- the answer stream; conversations, routing and query rewriting (pipeline/conversation/) ----
    def ask(self, question: str, retry: bool = False, conversation_id: str | None = None,
            user: str | None = None, use_kb: bool = True, kb_ids: Any = None,
            reader: Reader | None = None) -> Iterator[ev.Event]:
        """The one answer event stream: stage → trace → stage → delta* → sources → done (or error).
        `kb_ids`: the knowledge bases to search (default: the default one); each must be readable by `reader`
        (4003 otherwise).

        `conversation_id` None starts a conversation (its id comes back in `done`); an unknown id is a 3002
        error, another user's a 4003. The router may answer DIRECT (chit-chat, or `use_kb=False`) without
        retrieval; follow-ups are rewritten before retrieval. The finished turn is stored before `done`.
        """
        t0 = time.perf_counter()
        c = self.components
        try:
            self._validate_question(question)
            self._sync_check()
            scope = self.resolve_kbs(kb_ids, reader)
            self._require_ready()
            conv = c.conversations.resolve(conversation_id, user) if conversation_id is not None else None
        except EngineError as exc:
            yield ev.error(exc.code, exc.msg)
            return
        question = question.strip()
        conv_id = conv["conv_id"] if conv else None
        history = c.conversations.history(conv_id)
        route = c.router.route(question, use_kb=use_kb, has_history=bool(history),
                               rerank_available=c.models.cross_encoder is not None)
        recorder = TurnRecorder(c.conversations, conv_id, user, question)
        qkey = f"{question}\x00{','.join(map(str, scope))}"  # a retry reuses the retrieval of the same scope
        inner = (self._direct_answer(question, route, history, t0) if route.route == DIRECT
                 else self._kb_answer(question, route, history, conv_id, retry, t0, scope, qkey))
        try:
            for e in inner:
                if e.type is ev.EventType.DONE:
                    e = ev.Event(ev.EventType.DONE, recorder.finish(e.data, route.route))
                    if conv_id is None and self._recent.get(("", qkey)):  # 重试 in the conversation just made
                        self._recent.put((e.data["conversation_id"], qkey), self._recent.get(("", qkey)))
                recorder.see(e)
                yield e
        finally:
            inner.close()  # a consumer that hangs up closes the LLM stream now

    def _direct_answer(self, question: str, route: Route, history: list[dict], t0: float) -> Iterator[ev.Event]:
        from pipeline.generation.llm_client import LLMError

        yield ev.route_trace(route.to_dict(), Rewrite(question, question, "none").to_dict())
        yield ev.stage("generate")
        try:
            mode = yield from direct_reply(question, route, history, self.components.models.llm,
                                           self._settings.llm_temperature)
        except LLMError as exc:
            yield ev.error(CODE_LLM, exc.msg)
            return
        yield ev.sources([])
        yield ev.done((time.perf_counter() - t0) * 1000, no_answer=False, mode=mode)

    def _kb_answer(self, question: str, route: Route, history: list[dict], conv_id: str | None, retry: bool,
                   t0: float, scope: list[int], qkey: str) -> Iterator[ev.Event]:
        from pipeline.generation.answer import stream_answer
        from pipeline.generation.llm_client import LLMError

        s, c = self._settings, self.components
        key = (conv_id or "", qkey)
        cached = self._recent.get(key) if retry else None
        if cached is None:
            self.retrieval_calls += 1
            try:
                yield ev.stage("recall")
                rw = c.models.rewriter.rewrite(question, history) if history else Rewrite(question, question, "none")
                res = c.retrieval.recall_stage(rw.query, s, scope)
                yield ev.stage("rerank")
                res = c.retrieval.rerank_stage(res, s)  # LIGHT has no reranker: the stage reports skipped
            except Exception as exc:
                log.exception("retrieval failed")
                yield ev.error(CODE_ENGINE, f"检索失败：{exc}")
                return
        else:
            rw, res = cached
        self._recent.put(key, (rw, res))
        yield ev.trace(res, route=route.to_dict(), query=rw.to_dict())
        rewritten = rw.query if rw.changed else None
        if not res.hit:
            yield ev.delta(ev.NO_ANSWER_TEXT)
            yield ev.sources([])
            yield ev.done((time.perf_counter() - t0) * 1000, no_answer=True, rewritten_query=rewritten)
            return
        yield ev.stage("generate")
        llm = c.models.llm
        try:
            result = yield from stream_answer(question, res.final, llm, s.llm_temperature, tokenizer=c.tokenizer,
                                              history=history, retrieval_query=rw.query, picker=c.picker,
                                              query_embedding=res.query_embedding)
        except LLMError as exc:
            yield ev.error(CODE_LLM, exc.msg)
            return
        # LLM answers: is each [n] backed by source n? (extractive sentences are quotes of their source)
        support = c.support.check(result.text, res.final) if llm is not None and c.support else None
        yield ev.sources(ev.source_list(res, result.cited, support))
        yield ev.done((time.perf_counter() - t0) * 1000, no_answer=False,
                      mode="llm" if llm is not None else "extractive", rewritten_query=rewritten, weak=res.weak,
                      support=support)

    def ask_sync(self, question: str, retry: bool = False, conversation_id: str | None = None,
                 user: str | None = None, use_kb: bool = True, kb_ids: Any = None,
                 reader: Reader | None = None) -> dict:
        """The synchronous form over the same stream: {answer, sources, elapsed_ms, trace, weak, support,
        conversation_id, turn_id, route, rewritten_query, mode, no_answer} or EngineError."""
        parts: list[str] = []
        sources: list = []
        trace = None
        done: dict = {}
        for e in self.ask(question, retry=retry, conversation_id=conversation_id, user=user, use_kb=use_kb,
                          kb_ids=kb_ids, reader=reader):
            if e.type is ev.EventType.DELTA:
                parts.append(e.data["text"])
            elif e.type is ev.EventType.SOURCES:
                sources = e.data["sources"]
            elif e.type is ev.EventType.TRACE:
                trace = e.data
            elif e.type is ev.EventType.DONE:
                done = e.data
            elif e.type is ev.EventType.ERROR:
                raise EngineError(e.data["code"], e.data["msg"])
        trace = ev.trace_with_support(trace, done)  # 检索过程 counts unsupported citations
        return {"answer": "".join(parts), "sources": sources, "elapsed_ms": done.get("elapsed_ms"), "trace": trace,
                "weak": bool(done.get("weak")), "support": done.get("support"),
                **{k: done.get(k) for k in ("conversation_id", "turn_id", "route", "rewritten_query", "mode",
                                            "no_answer")}}

    # ---- conversations (issue 15): thin facade over pipeline.conversation.service ----
    def list_conversations(self, user: str | None, page: int = 1, size: int = 50) -> dict:
        return self.components.conversations.list(user, page, size)

    def get_conversation(self, conv_id: str, user: str | None, reader: Reader | None = None) -> dict:
        """The conversation with its turns; sources from knowledge bases the reader may not read lose their text."""
        return self._access.redact_conversation(self.components.conversations.get(conv_id, user), reader)

    def rename_conversation(self, conv_id: str, user: str | None, title: str) -> dict:
        return self.components.conversations.rename(conv_id, user, title)

    def delete_conversation(self, conv_id: str, user: str | None) -> dict:
        return self.components.conversations.delete(conv_id, user)

    def clear_conversations(self, user: str | None) -> dict:
        return self.components.conversations.clear(user)

    def export_conversation(self, conv_id: str, user: str | None, reader: Reader | None = None) -> str:
        from pipeline.conversation.service import conversation_markdown

        return conversation_markdown(self.get_conversation(conv_id, user, reader))

    # ---- feedback and verified Q&A entries (issue 15) ----
    def give_feedback(self, turn_id: int, user: str | None, rating: str, reason: str | None = None,
                      comment: str | None = None) -> dict:
        return self.components.feedback.give(turn_id, user, rating, reason, comment)

    def list_feedback(self, rating: str | None = None, page: int = 1, size: int = 50) -> dict:
        return self.components.feedback.list(rating, page, size)

    def get_feedback(self, fb_id: int) -> dict:
        return self.components.feedback.get(fb_id)

    def export_feedback(self, rating: str | None = None) -> str:
        return self.components.feedback.export_jsonl(rating)

    def create_verified(self, question: str, answer: str, user: str | None, feedback_id: int | None = None) -> dict:
        """A verified Q&A entry; from a feedback item it keeps that answer's cited chunks and turn."""
        cited, turn_id = [], None
        if feedback_id is not None:
            fb = self.components.feedback.get(feedback_id)
            cited = [s for s in fb["sources"] if s.get("cited")] or fb["sources"]
            turn_id = fb["turn_id"]
        return self.components.verified.create(question, answer, user, cited, turn_id)

    def list_verified(self) -> list[dict]:
        return self.components.verified.list()

    def delete_verified(self, qa_id: int) -> dict:
        return self.components.verified.delete(qa_id)

    def close(self) -> None:
        self.components.close()
