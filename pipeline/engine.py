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
from pipeline.components import Components, build_components, load_models
from pipeline.errors import CODE_ENGINE, CODE_LLM, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.ingestion.rebuild import Rebuild
from pipeline.ingestion.service import IngestBusy, UploadResult
from pipeline.models.paths import embedding_model_id, resolve_model_dir
from pipeline.retrieval.result import RetrievalResult
from pipeline.retrieval.service import default_min_similarity
from pipeline.retry_cache import RecentRetrievals
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
)

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 2000

__all__ = ["Engine", "EngineError"]


class Engine:
    def __init__(self, data_dir: Path | str = "data", project_root: Path | None = None,
                 models_dir: Path | None = None, load_async: bool = False):
        self.components: Components = build_components(
            data_dir, project_root=project_root, models_dir=models_dir, settings=lambda: self._settings,
            on_ingested=self._after_ingest, busy_reason=self._busy_reason)
        c = self.components
        self.data_dir, self.project_root, self.models_dir = c.data_dir, c.project_root, c.models_dir
        self._settings = self._load_settings()
        self.state = "loading"
        self.load_error: str | None = None
        self.retrieval_calls = 0
        self.last_reload_ms: float | None = None
        self._recent = RecentRetrievals()
        self._rebuild = Rebuild(c, lambda: self._settings, on_done=self._after_rebuild)
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
        """SRS defaults, with min_similarity calibrated for the embedding model the settings select."""
        base = Settings()
        probe = s or base
        return base.model_copy(update={"min_similarity": default_min_similarity(self.expected_model_id(probe))})

    def _load_settings(self) -> Settings:
        stored = self.components.config.load()
        if not stored:
            defaults = self.default_settings().model_dump()
            self.components.config.write_defaults(defaults)
            stored = defaults
        else:
            self.components.config.write_defaults({k: v for k, v in Settings().model_dump().items() if k not in stored})
        known = {k: v for k, v in stored.items() if k in Settings.model_fields}
        try:
            return Settings(**{**Settings().model_dump(), **known})
        except Exception as exc:  # a hand-edited database must not stop the app
            log.error("stored settings invalid (%s); using defaults", exc)
            return Settings()

    @property
    def settings(self) -> Settings:
        return self._settings

    def update_settings(self, payload: dict[str, Any]) -> dict:
        """Validate, persist and apply a partial settings change (grouped or flat)."""
        flat = flatten_grouped(payload)
        new, changed = merge_update(self._settings, flat)
        self._check_model_paths(new, changed)
        self.components.config.save({k: new.model_dump()[k] for k in changed})
        old = self._settings
        self._settings = new
        if {"bm25_k1", "bm25_b"} & set(changed) and self.state == "ready":
            self.components.bm25.rebuild(new.bm25_k1, new.bm25_b)
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
        for key, default in (("embedding_model_path", DEFAULT_EMBEDDING_PATH),
                             ("reranker_model_path", DEFAULT_RERANKER_PATH)):
            if key not in changed:
                continue
            value = getattr(new, key).strip()
            if not value or value == default:
                continue  # empty → packaged default / skipped; the untouched SRS default may be absent
            if resolve_model_dir(value, self.project_root) is None:
                raise SettingsError({key: f"{LABELS[key]} 无效：目录 {value} 不存在或不含 config.json"})

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
                self._recover()
                self.components.bm25.load_or_rebuild(s.bm25_k1, s.bm25_b, self.components.docs.ready_chunk_ids())
                self._recent.clear()
                self.state, self.load_error = "ready", None
            except Exception as exc:
                # Never stay "reloading" forever: report the failure (health, 2002 with the reason).
                log.exception("engine load failed")
                self.load_error = f"{type(exc).__name__}: {exc}"
                self.state = "error"
                raise EngineError(CODE_ENGINE, f"引擎加载失败：{self.load_error}") from exc
        self.last_reload_ms = (time.perf_counter() - t0) * 1000
        m = self.components.models
        log.info("engine ready in %.0f ms (embedding: %s, rerank: %s, llm: %s)", self.last_reload_ms,
                 m.embedding.label, self.components.retrieval.rerank_label or "无", self._settings.llm_model or "未配置")
        return self.last_reload_ms

    def reload(self) -> float:
        if self._rebuild.running:
            raise EngineError(CODE_ENGINE, "全量重建进行中，请完成后再重载引擎")
        return self.load()

    @property
    def model_warning(self) -> str | None:
        m = self.components.models
        return m.model_warning if m else None

    def _recover(self) -> None:
        """Restart safety: resume documents left 处理中 by a crash; drop orphan vectors and chunks."""
        c = self.components
        for doc_id in c.docs.ids_with_status("processing"):
            if c.ingest.is_queued(doc_id):
                continue
            doc = c.docs.get(doc_id)
            if doc and doc.get("stored_name") and c.files.path_of(doc["stored_name"]).exists():
                c.vectors.delete_doc(doc_id)
                c.docs.delete_chunks(doc_id)
                c.ingest.enqueue(doc_id)
            else:
                c.docs.set_status(doc_id, "failed", "处理中断")
        for doc_id in c.docs.ids_with_status("failed"):
            c.docs.delete_chunks(doc_id)
        orphans = c.vectors.all_ids() - c.docs.all_chunk_ids()
        if orphans:
            log.warning("removing %d orphan vectors", len(orphans))
            c.vectors.delete_ids(sorted(orphans))

    def _after_ingest(self) -> None:
        self.components.bm25.rebuild(self._settings.bm25_k1, self._settings.bm25_b)
        self._refresh_gate_background()

    def _after_rebuild(self) -> None:
        self._recent.clear()
        self._refresh_gate_background()

    def _refresh_gate_background(self) -> None:
        """The knowledge base changed: score the gate's probe questions against it now, not at the next question."""
        if self.state == "ready" and self.components.gate_background is not None:
            self.components.gate_background.refresh_soon()

    def _busy_reason(self) -> str | None:
        if self._rebuild.running:
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
    def health(self) -> dict:
        c = self.components
        counts = c.docs.counts()
        emb = c.models.embedding if c.models else None
        rerank_label = c.retrieval.rerank_label if c.retrieval else ""
        return {
            "status": "ok", "engine": "ready" if self.state == "ready" else "loading",
            "state": self.state, "chunks": counts["chunks"], "docs": counts["docs"],
            "processing": counts["processing"], "embedding_model": emb.label if emb else None,
            "reranker": rerank_label or "未配置精排模型",
            "llm": self._settings.llm_model or "未配置（原文摘录模式）",
            "warning": self.model_warning, "rebuild": self._rebuild.status(),
        }

    # ------------------------------------------------------------------ knowledge base
    def upload(self, items: list[tuple[str, Path]]) -> list[UploadResult]:
        try:
            return self.components.ingest.upload(items)
        except IngestBusy as exc:
            raise EngineError(CODE_ENGINE, str(exc)) from None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued document is processed (scripts, tests, benchmarks)."""
        return self.components.ingest.wait_idle(timeout)

    def list_documents(self, page: int = 1, size: int = 20, keyword: str = "") -> dict:
        items, total = self.components.docs.list(page, size, keyword)
        for d in items:
            d.pop("stored_name", None)
        return {"items": items, "total": total, "page": page, "size": size}

    def get_document(self, doc_id: int) -> dict:
        d = self.components.docs.get(doc_id)
        if d is None:
            raise EngineError(CODE_NO_DOC, f"文档不存在：{doc_id}")
        d.pop("stored_name", None)
        return d

    def document_chunks(self, doc_id: int) -> list[dict]:
        self.get_document(doc_id)
        return self.components.docs.chunks_of(doc_id)

    def delete_document(self, doc_id: int) -> dict:
        if self._rebuild.running:
            raise EngineError(CODE_ENGINE, "全量重建进行中，暂不能上传或删除文档，请稍后再试")
        c = self.components
        doc = c.docs.get(doc_id)
        if doc is None:
            raise EngineError(CODE_NO_DOC, f"文档不存在：{doc_id}")
        chunk_ids = [ch["chunk_id"] for ch in c.docs.chunks_of(doc_id)]
        c.bm25.soft_delete(chunk_ids)  # excluded from BM25 at once, before the rebuild lands
        c.ingest.cancel(doc_id)
        c.vectors.delete_doc(doc_id)
        c.docs.delete(doc_id)
        c.files.delete(doc.get("stored_name"))
        self._recent.clear()  # cached retrievals may hold its chunks
        threading.Thread(target=self._after_ingest, name="bm25-rebuild", daemon=True).start()
        return {"doc_id": doc_id, "file_name": doc["file_name"], "chunks_removed": len(chunk_ids)}

    def start_rebuild(self) -> dict:
        return self._rebuild.start(require_ready=self._require_ready)

    def rebuild_status(self) -> dict:
        return self._rebuild.status()

    def rebuild(self, timeout: float | None = None) -> dict:
        """Blocking full rebuild (scripts/tests)."""
        self.start_rebuild()
        return self.wait_rebuild(timeout)

    def wait_rebuild(self, timeout: float | None = None) -> dict:
        return self._rebuild.wait(timeout)

    # ------------------------------------------------------------------ retrieval & answers
    def search(self, query: str, top_k: int = 10) -> dict:
        self._validate_question(query, "query")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 50:
            raise EngineError(CODE_VALIDATION, "top_k 必须是 1–50 的整数", "top_k")
        self._require_ready()
        return self.components.retrieval.debug_search(query.strip(), top_k, self._settings)

    def retrieve(self, question: str) -> RetrievalResult:
        self._require_ready()
        self.retrieval_calls += 1
        return self.components.retrieval.retrieve(question, self._settings)

    @staticmethod
    def _validate_question(q: Any, field: str = "question") -> None:
        if not isinstance(q, str) or not q.strip():
            raise EngineError(CODE_VALIDATION, f"{field} 不能为空", field)
        if len(q) > MAX_QUESTION_CHARS:
            raise EngineError(CODE_VALIDATION, f"{field} 过长（最多 {MAX_QUESTION_CHARS} 字）", field)

    def ask(self, question: str, retry: bool = False) -> Iterator[ev.Event]:
        """The one answer event stream: stage → trace → stage → delta* → sources → done (or error)."""
        from pipeline.generation.answer import stream_answer
        from pipeline.generation.llm_client import LLMError

        t0 = time.perf_counter()
        try:
            self._validate_question(question)
            self._require_ready()
        except EngineError as exc:
            yield ev.error(exc.code, exc.msg)
            return
        question = question.strip()
        s = self._settings
        c = self.components
        res = self._recent.get(question) if retry else None
        if res is None:
            self.retrieval_calls += 1
            try:
                yield ev.stage("recall")
                res = c.retrieval.recall_stage(question, s)
                yield ev.stage("rerank")
                res = c.retrieval.rerank_stage(res, s)
            except Exception as exc:
                log.exception("retrieval failed")
                yield ev.error(CODE_ENGINE, f"检索失败：{exc}")
                return
        self._recent.put(question, res)
        yield ev.trace(res)
        if not res.hit:
            yield ev.delta(ev.NO_ANSWER_TEXT)
            yield ev.sources([])
            yield ev.done((time.perf_counter() - t0) * 1000, no_answer=True)
            return
        yield ev.stage("generate")
        llm = c.models.llm
        try:
            result = yield from stream_answer(question, res.final, llm, s.llm_temperature, tokenizer=c.tokenizer,
                                              picker=c.picker, query_embedding=res.query_embedding)
        except LLMError as exc:
            yield ev.error(CODE_LLM, exc.msg)
            return
        # LLM answers: is each [n] backed by source n? (extractive sentences are quotes of their source)
        support = c.support.check(result.text, res.final) if llm is not None and c.support else None
        yield ev.sources(ev.source_list(res, result.cited, support))
        yield ev.done((time.perf_counter() - t0) * 1000, no_answer=False,
                      mode="llm" if llm is not None else "extractive", weak=res.weak, support=support)

    def ask_sync(self, question: str, retry: bool = False) -> dict:
        """The synchronous form over the same stream: {answer, sources, elapsed_ms} or EngineError."""
        parts: list[str] = []
        sources: list = []
        elapsed = None
        trace = None
        weak = False
        support = None
        for e in self.ask(question, retry=retry):
            if e.type is ev.EventType.DELTA:
                parts.append(e.data["text"])
            elif e.type is ev.EventType.SOURCES:
                sources = e.data["sources"]
            elif e.type is ev.EventType.TRACE:
                trace = e.data
            elif e.type is ev.EventType.DONE:
                elapsed = e.data["elapsed_ms"]
                weak = bool(e.data.get("weak"))
                support = e.data.get("support")
                if trace is not None and "support_summary" in e.data:  # 检索过程 counts unsupported citations
                    trace = {**trace, "support": e.data["support_summary"]}
            elif e.type is ev.EventType.ERROR:
                raise EngineError(e.data["code"], e.data["msg"])
        return {"answer": "".join(parts), "sources": sources, "elapsed_ms": elapsed, "trace": trace, "weak": weak,
                "support": support}

    def close(self) -> None:
        self.components.close()
