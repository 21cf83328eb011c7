"""The engine's state (loading → ready, or error) and what changes it: loading models and indexes, 重载引擎
(here and in every other process), and the refresh of every index after what is searchable changed."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.errors import CODE_ENGINE, EngineError
from pipeline.ingestion.rebuild import Rebuild
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.services.settings import SettingsService
from pipeline.services.shared_sync import SharedSync
from pipeline.settings import Settings
from store.shared_state import ENGINE_VERSION

if TYPE_CHECKING:
    from pipeline.components import Components

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, c: Components, settings: SettingsService, rebuild: Rebuild, *,
                 load_models: Callable[[Settings], object], sync: Callable[[], SharedSync],
                 clear_caches: Callable[[], None], audit: AuditLog):
        self.c = c
        self.audit = audit
        self._load_models = load_models  # pipeline.components.load_models over these components
        self.settings = settings
        self.rebuild = rebuild
        self._sync = sync
        self._clear_caches = clear_caches
        self.state = "loading"
        self.load_error: str | None = None
        self.last_reload_ms: float | None = None
        self.lock = threading.RLock()  # a load and a repair never run at once

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def serves(self) -> bool:
        """False in a `--role worker` process: it ingests only, so it keeps no BM25 index or gate background
        (the processes that answer rebuild theirs when the KB generation moves)."""
        return self.c.deployment.serves

    def load_guarded(self) -> None:
        try:
            self.load()
        except EngineError:
            pass  # state/load_error already say why; health() reports it

    def load(self) -> float:
        """(Re)load models and indexes. Questions get 2002 while this runs."""
        t0 = time.perf_counter()
        c = self.c
        with self.lock:
            self.state = "loading" if c.models is None else "reloading"
            try:
                s = self.settings.current
                self._load_models(s)
                if self.serves:  # one-off costs of the first question, paid before questions are accepted
                    c.tokenizer.warm_tags()  # extractive answers tag words
                    c.retrieval.warm()  # the embedding session and each collection's HNSW index
                with c.write_lock.writing():
                    c.ingest.recover()  # documents left 处理中 are queued again; orphan vectors go
                for kb in c.kbs.all() if self.serves else ():  # a worker answers nothing: no BM25 to hold
                    kb.bm25.open(s.bm25_k1, s.bm25_b, c.docs.ready_chunk_ids(kb.kb_id))
                if self.serves:
                    c.retrieval.warm_question(s)
                self._clear_caches()
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
        self.refresh_gate_background()
        m = c.models
        log.info("engine ready in %.0f ms (embedding: %s, rerank: %s, llm: %s)", self.last_reload_ms,
                 m.embedding.label, c.retrieval.rerank_label or "无", self.settings.current.llm_model or "未配置")
        return self.last_reload_ms

    def reload(self, actor: Actor | None = None) -> float:
        """重载引擎 here and, through the engine version in the database, on every other app process."""
        if self.rebuild_busy():
            raise EngineError(CODE_ENGINE, "全量重建进行中，请完成后再重载引擎")
        self.audit.admin(actor, "engine.reload")
        self._sync().bump(ENGINE_VERSION)
        return self.load()

    def reload_from_elsewhere(self) -> None:
        self.settings.current = self.settings.load()
        self.load_guarded()

    def refresh_indexes(self) -> None:
        """What is 就绪 changed (here or in another process): every knowledge base's BM25 follows, knowledge bases
        another process deleted lose their handles and what retrieval built over them, gate backgrounds are
        re-measured soon."""
        c = self.c
        gone = c.kbs.forget_missing()
        for kb_id in gone:
            if c.retrieval is not None:
                c.retrieval.forget(kb_id)
        if gone:
            self._clear_caches()
        for kb in c.kbs.all():
            kb.vectors.reopen()  # another process may have re-created the collection (model change)
        m = c.models
        if m is not None and m.model_warning:  # another process's 全量重建 may have resolved it
            m.model_warning = c.kbs.model_warning(m.embedding.model_id, m.embedding.dim)
        kbs = c.kbs.all() if self.serves else []
        for kb in kbs:
            kb.bm25.open_listed()  # what others wrote is searchable now …
        for kb in kbs:
            kb.bm25.sync(c.docs.ready_chunk_ids(kb.kb_id))  # … and exactly the 就绪 chunks once the set is read
        self.refresh_gate_background()

    def follow_ingest(self) -> None:
        """This process's ingest queue drained: every knowledge base's BM25 follows (its documents are in
        segments already: BM25Index.follow_ingest), gate backgrounds are re-measured soon. A worker follows too:
        it merges the segments it writes, so the processes that answer only open them."""
        if not self.ready:
            return  # loading: the load reads the ready set itself
        c = self.c
        for kb in c.kbs.all():
            kb.bm25.follow_ingest(c.docs.ready_chunk_ids(kb.kb_id))
        self.refresh_gate_background()

    def refresh_gate_background(self) -> None:
        """Score the gate's probe questions against each changed knowledge base soon, not at the next question."""
        if self.ready and self.serves and self.c.gate_background is not None:
            self.c.gate_background.refresh_soon()

    def bm25_params(self, s: Settings) -> None:
        """BM25 parameters changed: they act at question time, every knowledge base's index takes them."""
        for kb in self.c.kbs.opened():
            kb.bm25.set_params(s.bm25_k1, s.bm25_b)

    def rebuild_bm25(self) -> None:
        """Stored tokens were rewritten in place (a repair): every knowledge base's segments are written anew."""
        if self.serves:
            for kb in self.c.kbs.all():
                kb.bm25.rebuild()

    def rebuild_busy(self) -> bool:
        return self.rebuild.running or self.rebuild.running_elsewhere()

    def refuse_while_rebuilding(self) -> None:
        if self.rebuild_busy():
            raise EngineError(CODE_ENGINE, "全量重建进行中，暂不能上传或删除文档，请稍后再试")

    @property
    def model_warning(self) -> str | None:
        m = self.c.models
        return m.model_warning if m else None

    def busy_reason(self) -> str | None:
        if self.rebuild_busy():
            return "全量重建进行中，暂不能上传或删除文档，请稍后再试"
        if self.state != "ready":
            return "引擎加载中，请稍后" if self.state in ("loading", "reloading") else f"引擎未就绪：{self.load_error}"
        if self.model_warning:
            return self.model_warning
        return None

    def require_ready(self) -> None:
        if self.state in ("loading", "reloading"):
            raise EngineError(CODE_ENGINE, "引擎重载中，请稍后" if self.state == "reloading" else "引擎加载中，请稍后")
        if self.state != "ready":
            raise EngineError(CODE_ENGINE, f"引擎未就绪：{self.load_error}")

    def health(self, kb_id: int | None = None) -> dict:
        """Engine state and counts: of all knowledge bases, or of `kb_id`."""
        self._sync().catch_up()
        c = self.c
        if kb_id is not None:
            kb_id = c.kbs.check(kb_id)
        counts = c.docs.counts(kb_id)
        emb = c.models.embedding if c.models else None
        rerank_label = c.retrieval.rerank_label if c.retrieval else ""
        cal = c.models.calibration if c.models else None
        return {
            "status": "ok", "engine": "ready" if self.state == "ready" else "loading",
            "state": self.state, "chunks": counts["chunks"], "docs": counts["docs"],
            "processing": counts["processing"],
            # a web-only process queues for the workers: the database queue's waiting jobs, not its own board
            "queued": c.ingest.progress.queue_length if c.ingest.claim_jobs else c.jobs.claimable(),
            "embedding_model": emb.label if emb else None,
            "reranker": rerank_label or "未配置精排模型",
            "llm": self.settings.current.llm_model or "未配置（原文摘录模式）",
            "warning": self.model_warning, "rebuild": self.rebuild.status(), "kb_id": kb_id,
            "kbs": len(c.kbs.ids()),
            # the fitted numbers the engine runs on: the embedding model's own profile, or the generic one
            "calibrated": cal.calibrated if cal else None, "calibration": cal.info() if cal else None,
            # secrets stored under another key (restored without secret.key): to be entered again in 配置
            "secrets_to_reenter": sorted(c.config.unreadable),
        }
