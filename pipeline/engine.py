"""The engine facade: one object that owns the stores, the models and the pipeline.

app.py builds exactly one Engine and hands it to the UI and the HTTP API; tests build their own on a temp data
dir. Nothing here imports gradio or fastapi.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from llama_index.core import Settings as LISettings  # noqa: E402

from store.config_store import ConfigStore  # noqa: E402
from store.db import Database  # noqa: E402
from store.documents import DocumentStore  # noqa: E402
from store.files import FileStore  # noqa: E402
from store.vectors import VectorStore  # noqa: E402

from pipeline import events as ev  # noqa: E402
from pipeline.errors import EngineError  # noqa: E402,F401  (re-exported: api/ui import it from here)
from pipeline.retrieval.bm25 import BM25Index  # noqa: E402
from pipeline.ingestion.service import IngestBusy, IngestService, UploadResult  # noqa: E402
from pipeline.models.paths import embedding_model_id, resolve_model_dir  # noqa: E402
from pipeline.retrieval.rerank import SafeRerank, load_cross_encoder  # noqa: E402
from pipeline.retrieval.service import RetrievalResult, RetrievalService, default_min_similarity  # noqa: E402
from pipeline.settings import (  # noqa: E402
    DEFAULT_EMBEDDING_PATH, DEFAULT_RERANKER_PATH, LABELS, SECRET_FIELDS, Settings, SettingsError, effect_of,
    flatten_grouped, is_masked, merge_update,
)
from pipeline.tokenize_zh import ChineseTokenizer  # noqa: E402
from pipeline.conversation.direct import direct_reply  # noqa: E402
from pipeline.conversation.rewrite import DeterministicRewriter, LLMRewriter, Rewrite  # noqa: E402
from pipeline.conversation.router import DIRECT, Router  # noqa: E402
from pipeline.conversation.feedback import FeedbackService  # noqa: E402
from pipeline.conversation.service import ConversationService, TurnRecorder  # noqa: E402
from pipeline.conversation.verified import VerifiedQAService  # noqa: E402
from store.conversations import ConversationStore  # noqa: E402
from store.feedback import FeedbackStore  # noqa: E402
from store.verified import VerifiedQAStore  # noqa: E402

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MAX_QUESTION_CHARS = 2000
REWRITE_TIMEOUT_S = 8.0  # a follow-up's LLM rewrite must not hold the answer longer; then the rule rewrite runs


class Engine:
    def __init__(self, data_dir: Path | str = "data", project_root: Path | None = None,
                 models_dir: Path | None = None, load_async: bool = False):
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.project_root = Path(project_root or PROJECT_ROOT)
        self.models_dir = Path(models_dir or self.project_root / "models")
        self.db = Database(self.data_dir / "app.db")
        self.config = ConfigStore(self.db)
        self.docs = DocumentStore(self.db)
        self.files = FileStore(self.data_dir / "uploads")
        self.vectors = VectorStore(self.data_dir / "chroma")
        self.tokenizer = ChineseTokenizer(user_dict=self.data_dir / "userdict.txt")
        self.bm25_index = BM25Index(self.data_dir / "bm25", self.docs.iter_ready_tokens)
        # conversations (issue 15): history on the server, router, follow-up rewriting
        self.conversations = ConversationService(ConversationStore(self.db))
        self.router = Router()
        self.rule_rewriter = DeterministicRewriter()
        self.rewriter = self.rule_rewriter  # LLMRewriter over it once an LLM is loaded
        self._settings = self._load_settings()
        self.state = "loading"
        self.load_error: str | None = None
        self.model_warning: str | None = None
        self.embedding = None  # pipeline.models.embeddings.LoadedEmbedding
        self.reranker = SafeRerank()
        self.llm = None
        self.retrieval: RetrievalService | None = None
        self.retrieval_calls = 0
        self._answers: "OrderedDict[tuple, tuple]" = OrderedDict()  # (conversation, question) → (rewrite, retrieval)
        self._rebuild = {"running": False, "done": 0, "total": 0, "current": "", "error": None,
                         "elapsed_ms": None}
        self._lock = threading.RLock()
        self.ingest = IngestService(
            self.docs, self.vectors, self.files, self.tokenizer, lambda: self._settings,
            lambda: self.embedding.embed_model, lambda: (self.embedding.model_id, self.embedding.dim),
            on_change=self._after_ingest, busy_reason=self._busy_reason)
        self.feedback = FeedbackService(FeedbackStore(self.db), self.conversations)
        self.verified = VerifiedQAService(VerifiedQAStore(self.db), self.docs, self.files, self.ingest.enqueue,
                                          self.delete_document, busy_reason=self._busy_reason)
        self.last_reload_ms: float | None = None
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
        stored = self.config.load()
        if not stored:
            defaults = self.default_settings().model_dump()
            self.config.write_defaults(defaults)
            stored = defaults
        else:
            self.config.write_defaults({k: v for k, v in Settings().model_dump().items() if k not in stored})
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
        self.config.save({k: new.model_dump()[k] for k in changed})
        old = self._settings
        self._settings = new
        if {"bm25_k1", "bm25_b"} & set(changed) and self.state == "ready":
            self.bm25_index.rebuild(new.bm25_k1, new.bm25_b)
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
        from pipeline.generation.answer import test_llm_connection

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
            self.state = "loading" if self.embedding is None else "reloading"
            try:
                self._load_models()
            except Exception as exc:
                # Never stay "reloading" forever: report the failure (health, 2002 with the reason).
                log.exception("engine load failed")
                self.load_error = f"{type(exc).__name__}: {exc}"
                self.state = "error"
                raise EngineError(ev.CODE_ENGINE, f"引擎加载失败：{self.load_error}") from exc
        self.last_reload_ms = (time.perf_counter() - t0) * 1000
        log.info("engine ready in %.0f ms (embedding: %s, rerank: %s, llm: %s)", self.last_reload_ms,
                 self.embedding.label, self.reranker.model_label or "无", self._settings.llm_model or "未配置")
        return self.last_reload_ms

    def _load_models(self) -> None:
        s = self._settings
        from pipeline.models.embeddings import load_embedding
        from pipeline.generation.answer import build_llm

        emb = load_embedding(s.embedding_model_path, self.project_root, self.models_dir)
        LISettings.embed_model = emb.embed_model  # never let LlamaIndex fall back to OpenAI
        LISettings.llm = None
        self.embedding = emb
        self.model_warning = self.vectors.check_model(emb.model_id, emb.dim)
        self.reranker = self._load_reranker(s)
        self.llm = build_llm(s)
        self.rewriter = (LLMRewriter(self.llm, self.rule_rewriter, timeout_s=min(REWRITE_TIMEOUT_S, s.llm_timeout))
                         if self.llm is not None else self.rule_rewriter)
        self.retrieval = RetrievalService(
            self.docs, self.vectors, self.bm25_index, self.tokenizer, emb.embed_model, self.reranker,
            pending_vectors=self.docs.pending_chunk_count, vector_enabled=lambda: self.model_warning is None)
        self._recover()
        self.bm25_index.load_or_rebuild(s.bm25_k1, s.bm25_b, self.docs.ready_chunk_ids())
        self._answers.clear()
        self.state = "ready"
        self.load_error = None

    def reload(self) -> float:
        if self._rebuild["running"]:
            raise EngineError(ev.CODE_ENGINE, "全量重建进行中，请完成后再重载引擎")
        return self.load()

    def _load_reranker(self, s: Settings) -> SafeRerank:
        d = resolve_model_dir(s.reranker_model_path, self.project_root)
        if d is None:
            return SafeRerank(None, "", top_n=s.final_top_k, candidates=s.rerank_candidates)
        try:
            inner = load_cross_encoder(d, s.final_top_k)
            return SafeRerank(inner, f"本地精排模型 {d.name}", top_n=s.final_top_k, candidates=s.rerank_candidates)
        except Exception as exc:
            log.error("reranker %s failed to load: %s", d, exc)
            r = SafeRerank(None, "", top_n=s.final_top_k, candidates=s.rerank_candidates)
            return r

    def _recover(self) -> None:
        """Restart safety: resume documents left 处理中 by a crash; drop orphan vectors and chunks."""
        for doc_id in self.docs.ids_with_status("processing"):
            if self.ingest.is_queued(doc_id):
                continue
            doc = self.docs.get(doc_id)
            if doc and doc.get("stored_name") and self.files.path_of(doc["stored_name"]).exists():
                self.vectors.delete_doc(doc_id)
                self.docs.delete_chunks(doc_id)
                self.ingest.enqueue(doc_id)
            else:
                self.docs.set_status(doc_id, "failed", "处理中断")
        for doc_id in self.docs.ids_with_status("failed"):
            self.docs.delete_chunks(doc_id)
        orphans = self.vectors.all_ids() - self.docs.all_chunk_ids()
        if orphans:
            log.warning("removing %d orphan vectors", len(orphans))
            self.vectors.delete_ids(sorted(orphans))

    def _after_ingest(self) -> None:
        self.bm25_index.rebuild(self._settings.bm25_k1, self._settings.bm25_b)

    def _busy_reason(self) -> str | None:
        if self._rebuild["running"]:
            return "全量重建进行中，暂不能上传或删除文档，请稍后再试"
        if self.state != "ready":
            return "引擎加载中，请稍后" if self.state in ("loading", "reloading") else f"引擎未就绪：{self.load_error}"
        if self.model_warning:
            return self.model_warning
        return None

    def _require_ready(self) -> None:
        if self.state in ("loading", "reloading"):
            raise EngineError(ev.CODE_ENGINE, "引擎重载中，请稍后" if self.state == "reloading" else "引擎加载中，请稍后")
        if self.state != "ready":
            raise EngineError(ev.CODE_ENGINE, f"引擎未就绪：{self.load_error}")

    # ------------------------------------------------------------------ status
    def health(self) -> dict:
        c = self.docs.counts()
        emb = self.embedding
        return {
            "status": "ok", "engine": "ready" if self.state == "ready" else "loading",
            "state": self.state, "chunks": c["chunks"], "docs": c["docs"], "processing": c["processing"],
            "embedding_model": emb.label if emb else None,
            "reranker": self.reranker.model_label or "未配置精排模型",
            "llm": self._settings.llm_model or "未配置（原文摘录模式）",
            "warning": self.model_warning, "rebuild": dict(self._rebuild),
        }

    # ------------------------------------------------------------------ knowledge base
    def upload(self, items: list[tuple[str, Path]]) -> list[UploadResult]:
        try:
            return self.ingest.upload(items)
        except IngestBusy as exc:
            raise EngineError(ev.CODE_ENGINE, str(exc)) from None

    def list_documents(self, page: int = 1, size: int = 20, keyword: str = "") -> dict:
        items, total = self.docs.list(page, size, keyword)
        for d in items:
            d.pop("stored_name", None)
        return {"items": items, "total": total, "page": page, "size": size}

    def get_document(self, doc_id: int) -> dict:
        d = self.docs.get(doc_id)
        if d is None:
            raise EngineError(ev.CODE_NO_DOC, f"文档不存在：{doc_id}")
        d.pop("stored_name", None)
        return d

    def document_chunks(self, doc_id: int) -> list[dict]:
        self.get_document(doc_id)
        return self.docs.chunks_of(doc_id)

    def delete_document(self, doc_id: int) -> dict:
        if self._rebuild["running"]:
            raise EngineError(ev.CODE_ENGINE, "全量重建进行中，暂不能上传或删除文档，请稍后再试")
        doc = self.docs.get(doc_id)
        if doc is None:
            raise EngineError(ev.CODE_NO_DOC, f"文档不存在：{doc_id}")
        chunk_ids = [c["chunk_id"] for c in self.docs.chunks_of(doc_id)]
        self.bm25_index.soft_delete(chunk_ids)  # excluded from BM25 at once, before the rebuild lands
        self.ingest.cancel(doc_id)
        self.vectors.delete_doc(doc_id)
        self.docs.delete(doc_id)
        self.files.delete(doc.get("stored_name"))
        self._answers.clear()  # cached retrievals may hold its chunks
        threading.Thread(target=self._after_ingest, name="bm25-rebuild", daemon=True).start()
        return {"doc_id": doc_id, "file_name": doc["file_name"], "chunks_removed": len(chunk_ids)}

    def start_rebuild(self) -> dict:
        with self._lock:
            if self._rebuild["running"]:
                raise EngineError(ev.CODE_ENGINE, "全量重建已在进行中")
            self._require_ready()
            docs = self.docs.all_docs()
            self._rebuild = {"running": True, "done": 0, "total": len(docs), "current": "", "error": None,
                             "elapsed_ms": None}
        threading.Thread(target=self._run_rebuild, args=(docs,), name="kb-rebuild", daemon=True).start()
        return dict(self._rebuild)

    def rebuild_status(self) -> dict:
        return dict(self._rebuild)

    def rebuild(self, timeout: float | None = None) -> dict:
        """Blocking full rebuild (scripts/tests)."""
        self.start_rebuild()
        return self.wait_rebuild(timeout)

    def wait_rebuild(self, timeout: float | None = None) -> dict:
        t_end = time.time() + (timeout or 1e9)
        while self._rebuild["running"] and time.time() < t_end:
            time.sleep(0.1)
        return self.rebuild_status()

    def _run_rebuild(self, docs: list[dict]) -> None:
        t0 = time.perf_counter()
        try:
            self.ingest.wait_idle()
            if self.model_warning:
                self.vectors.reset()  # vectors of another model: start over, never mix
                self.model_warning = None
            for i, doc in enumerate(docs):
                self._rebuild["current"] = doc["file_name"]
                if self.docs.get(doc["doc_id"]) is None:
                    continue
                self.docs.set_status(doc["doc_id"], "processing", None, "全量重建中")
                self.ingest.process(doc["doc_id"])
                self._rebuild["done"] = i + 1
            self.bm25_index.rebuild(self._settings.bm25_k1, self._settings.bm25_b)
            self._answers.clear()
        except Exception as exc:
            log.exception("rebuild failed")
            self._rebuild["error"] = str(exc)
        finally:
            self._rebuild["running"] = False
            self._rebuild["current"] = ""
            self._rebuild["elapsed_ms"] = round((time.perf_counter() - t0) * 1000)

    # ------------------------------------------------------------------ retrieval & answers
    def search(self, query: str, top_k: int = 10) -> dict:
        self._validate_question(query, "query")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 50:
            raise EngineError(ev.CODE_VALIDATION, "top_k 必须是 1–50 的整数", "top_k")
        self._require_ready()
        return self.retrieval.debug_search(query.strip(), top_k, self._settings)

    def retrieve(self, question: str) -> RetrievalResult:
        self._require_ready()
        self.retrieval_calls += 1
        return self.retrieval.retrieve(question, self._settings)

    @staticmethod
    def _validate_question(q: Any, field: str = "question") -> None:
        if not isinstance(q, str) or not q.strip():
            raise EngineError(ev.CODE_VALIDATION, f"{field} 不能为空", field)
        if len(q) > MAX_QUESTION_CHARS:
            raise EngineError(ev.CODE_VALIDATION, f"{field} 过长（最多 {MAX_QUESTION_CHARS} 字）", field)

    # ---- the answer stream; conversations, routing and query rewriting (pipeline/conversation/) ----
    def ask(self, question: str, retry: bool = False, conversation_id: str | None = None,
            user: str | None = None, use_kb: bool = True) -> Iterator[ev.Event]:
        """The one answer event stream: stage → trace → stage → delta* → sources → done (or error).

        `conversation_id` None starts a conversation (its id comes back in `done`); an unknown id is a 3002
        error, another user's a 4003. The router may answer DIRECT (chit-chat, or `use_kb=False`) without
        retrieval; follow-ups are rewritten before retrieval. The finished turn is stored before `done`.
        """
        t0 = time.perf_counter()
        try:
            self._validate_question(question)
            self._require_ready()
            conv = self.conversations.resolve(conversation_id, user) if conversation_id is not None else None
        except EngineError as exc:
            yield ev.error(exc.code, exc.msg)
            return
        question = question.strip()
        conv_id = conv["conv_id"] if conv else None
        history = self.conversations.history(conv_id)
        route = self.router.route(question, use_kb=use_kb, has_history=bool(history),
                                  rerank_available=self.reranker.available)
        recorder = TurnRecorder(self.conversations, conv_id, user, question)
        inner = (self._direct_answer(question, route, history, t0) if route.route == DIRECT
                 else self._kb_answer(question, route, history, conv_id, retry, t0))
        try:
            for e in inner:
                if e.type == "done":
                    e = ev.Event("done", recorder.finish(e.data, e.data.get("rewritten_query"), route.route))
                    if conv_id is None and ("", question) in self._answers:  # 重试 in the conversation just made
                        self._remember((e.data["conversation_id"], question), self._answers[("", question)])
                recorder.see(e)
                yield e
        finally:
            inner.close()  # a consumer that hangs up closes the LLM stream now

    def _direct_answer(self, question, route, history, t0) -> Iterator[ev.Event]:
        from pipeline.generation.answer import LLMError

        yield ev.Event("trace", {"route": route.to_dict(), "query": Rewrite(question, question, "none").to_dict()})
        yield ev.stage("generate")
        try:
            mode = yield from direct_reply(question, route, history, self.llm, self._settings.llm_temperature)
        except LLMError as exc:
            yield ev.error(ev.CODE_LLM, exc.msg)
            return
        yield ev.Event("sources", {"sources": []})
        yield ev.Event("done", {"elapsed_ms": round((time.perf_counter() - t0) * 1000), "no_answer": False,
                                "mode": mode, "rewritten_query": None})

    def _kb_answer(self, question, route, history, conv_id, retry, t0) -> Iterator[ev.Event]:
        from pipeline.generation.answer import LLMError, stream_answer

        s = self._settings
        key = (conv_id or "", question)
        cached = self._answers.get(key) if retry else None
        if cached is None:
            self.retrieval_calls += 1
            try:
                yield ev.stage("recall")
                rw = self.rewriter.rewrite(question, history) if history else Rewrite(question, question, "none")
                res = self.retrieval.recall_stage(rw.query, s)
                yield ev.stage("rerank")
                res = self.retrieval.rerank_stage(res, s)  # LIGHT has no reranker: the stage reports skipped
            except Exception as exc:
                log.exception("retrieval failed")
                yield ev.error(ev.CODE_ENGINE, f"检索失败：{exc}")
                return
        else:
            rw, res = cached
        self._remember(key, (rw, res))
        trace = {**res.trace(), "route": route.to_dict(), "query": rw.to_dict()}
        yield ev.Event("trace", trace)
        rewritten = rw.query if rw.changed else None
        if not res.hit:
            yield ev.delta(ev.NO_ANSWER_TEXT)
            yield ev.Event("sources", {"sources": []})
            yield ev.Event("done", {"elapsed_ms": round((time.perf_counter() - t0) * 1000), "no_answer": True,
                                    "rewritten_query": rewritten})
            return
        yield ev.stage("generate")
        try:
            result = yield from stream_answer(question, res.final, self.llm, s.llm_temperature,
                                              tokenizer=self.tokenizer, history=history, retrieval_query=rw.query)
        except LLMError as exc:
            yield ev.error(ev.CODE_LLM, exc.msg)
            return
        sources = res.sources()
        for src in sources:
            src["cited"] = src["no"] in result.cited
        yield ev.Event("sources", {"sources": sources})
        yield ev.Event("done", {"elapsed_ms": round((time.perf_counter() - t0) * 1000), "no_answer": False,
                                "mode": "llm" if self.llm is not None else "extractive",
                                "rewritten_query": rewritten})

    def _remember(self, key: tuple, value: tuple) -> None:
        self._answers[key] = value
        self._answers.move_to_end(key)
        while len(self._answers) > 64:
            self._answers.popitem(last=False)

    def ask_sync(self, question: str, retry: bool = False, conversation_id: str | None = None,
                 user: str | None = None, use_kb: bool = True) -> dict:
        """The synchronous form over the same stream: {answer, sources, elapsed_ms, trace, conversation_id,
        turn_id, route, rewritten_query} or EngineError."""
        parts: list[str] = []
        sources: list = []
        elapsed = None
        trace = None
        done: dict = {}
        for e in self.ask(question, retry=retry, conversation_id=conversation_id, user=user, use_kb=use_kb):
            if e.type == "delta":
                parts.append(e.data["text"])
            elif e.type == "sources":
                sources = e.data["sources"]
            elif e.type == "trace":
                trace = e.data
            elif e.type == "done":
                elapsed = e.data["elapsed_ms"]
                done = e.data
            elif e.type == "error":
                raise EngineError(e.data["code"], e.data["msg"])
        return {"answer": "".join(parts), "sources": sources, "elapsed_ms": elapsed, "trace": trace,
                **{k: done.get(k) for k in ("conversation_id", "turn_id", "route", "rewritten_query", "mode",
                                            "no_answer")}}

    # ---- conversations (issue 15): thin facade over pipeline.conversation.service ----
    def list_conversations(self, user: str | None, page: int = 1, size: int = 50) -> dict:
        return self.conversations.list(user, page, size)

    def get_conversation(self, conv_id: str, user: str | None) -> dict:
        return self.conversations.get(conv_id, user)

    def rename_conversation(self, conv_id: str, user: str | None, title: str) -> dict:
        return self.conversations.rename(conv_id, user, title)

    def delete_conversation(self, conv_id: str, user: str | None) -> dict:
        return self.conversations.delete(conv_id, user)

    def clear_conversations(self, user: str | None) -> dict:
        return self.conversations.clear(user)

    def export_conversation(self, conv_id: str, user: str | None) -> str:
        return self.conversations.export_markdown(conv_id, user)

    # ---- feedback and verified Q&A entries (issue 15) ----
    def give_feedback(self, turn_id: int, user: str | None, rating: str, reason: str | None = None,
                      comment: str | None = None) -> dict:
        return self.feedback.give(turn_id, user, rating, reason, comment)

    def list_feedback(self, rating: str | None = None, page: int = 1, size: int = 50) -> dict:
        return self.feedback.list(rating, page, size)

    def get_feedback(self, fb_id: int) -> dict:
        return self.feedback.get(fb_id)

    def export_feedback(self, rating: str | None = None) -> str:
        return self.feedback.export_jsonl(rating)

    def create_verified(self, question: str, answer: str, user: str | None, feedback_id: int | None = None) -> dict:
        """A verified Q&A entry; from a feedback item it keeps that answer's cited chunks and turn."""
        cited, turn_id = [], None
        if feedback_id is not None:
            fb = self.feedback.get(feedback_id)
            cited = [s for s in fb["sources"] if s.get("cited")] or fb["sources"]
            turn_id = fb["turn_id"]
        return self.verified.create(question, answer, user, cited, turn_id)

    def list_verified(self) -> list[dict]:
        return self.verified.list()

    def delete_verified(self, qa_id: int) -> dict:
        return self.verified.delete(qa_id)

    def close(self) -> None:
        self.ingest.stop()
        self.db.close()
