"""The one place that constructs the app's components and services (PrivateGPT's `di.py` idea).

    services = build_services(data_dir, deployment=...)   # stores, indexes, the ingest worker, the services
    load_models(components, settings)   # embedding, cross-encoder, LLM, retrieval service; again on 重载引擎

`Engine` is a facade over a `Services`; tools and tests use `engine.components.<store>` (or the services).
Nothing else builds stores, indexes, models or services.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_index.core import Settings as LISettings

from pipeline.access.kb_readers import KBAccess
from pipeline.calibration import ActiveProfile, profile_for
from pipeline.conversation.feedback import FeedbackService
from pipeline.conversation.multi_query import LLMQueryExpander
from pipeline.conversation.rewrite import DeterministicRewriter, LLMRewriter
from pipeline.conversation.router import Router
from pipeline.conversation.service import ConversationService
from pipeline.conversation.verified import VerifiedQAService
from pipeline.generation.extractive import EARLIER_CHUNKS, ExtractivePicker, PickerParams
from pipeline.generation.support import SupportChecker, SupportParams
from pipeline.ingestion.kb_chunking import KBChunking
from pipeline.ingestion.rebuild import Rebuild
from pipeline.ingestion.service import IngestService
from pipeline.models.paths import resolve_model_dir
from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.models.vectors import TextVectors
from pipeline.ops.audit import KBAuditor, ModelIds
from pipeline.ops.deployment import Deployment
from pipeline.ops.repair import KBRepairer, RepairHooks
from pipeline.retrieval.bm25 import BM25Index
from pipeline.retrieval.gate_background import GateBackground, GateBackgrounds
from pipeline.retrieval.in_flight import QuestionsInFlight
from pipeline.retrieval.kb_indexes import KnowledgeBases, bm25_dir, collection_name
from pipeline.retrieval.nodes import kb_id_of, kb_ids_of
from pipeline.retrieval.rerank import CrossEncoder, load_cross_encoder
from pipeline.retrieval.sentence_evidence import SentenceEvidence
from pipeline.retrieval.service import RetrievalService
from pipeline.services.answering import AnswerService
from pipeline.services.api_keys import ApiKeyService
from pipeline.services.audit_log import AuditLog
from pipeline.services.changes import SearchableChanges
from pipeline.services.chunks import ChunkService
from pipeline.services.conversations import ConversationDesk
from pipeline.services.doc_tags import DocTagService
from pipeline.services.documents import DocumentService
from pipeline.services.folder_sync import FolderSync
from pipeline.services.kb_chunking import ChunkingService
from pipeline.services.knowledge_bases import KnowledgeBaseService
from pipeline.services.lifecycle import Lifecycle
from pipeline.services.login_throttle import LoginThrottle
from pipeline.services.operations import OperationsService
from pipeline.services.rate_limits import RateLimiter
from pipeline.services.retry_cache import StoredRetrievals
from pipeline.services.settings import SettingsService
from pipeline.services.shared_sync import SharedSync
from pipeline.services.source_schedule import SourceSchedule
from pipeline.services.web_sources import WebSources
from pipeline.settings import SECRET_FIELDS, Settings
from store.api_keys import ApiKeyStore, RateWindowStore
from store.audit_log import AuditLogStore
from store.config_store import ConfigStore
from store.conversations import ConversationStore
from store.db import Database
from store.dirlock import DataDirLock
from store.doc_tags import DocTagStore
from store.documents import DocumentStore
from store.feedback import FeedbackStore
from store.files import FileStore
from store.gate_stats import GateStatsStore
from store.jobs import JobStore
from store.knowledge_bases import KBStore
from store.leases import LeaseStore
from store.migrations import DEFAULT_KB_ID
from store.retrievals import RetrievalStore
from store.secrets import SecretBox
from store.shared_state import KB_GENERATION, SharedState
from store.vectors import VectorStore
from store.verified import VerifiedQAStore
from store.write_lock import WriteLock

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The longest the ingest waits, per embedding batch, for the questions computing in this process (a cap that keeps
# it moving under a steady stream of questions, not a fitted value)
INGEST_YIELD_MAX_S = 2.0
REWRITE_TIMEOUT_S = 8.0  # a follow-up's LLM rewrite must not hold the answer longer; then the rule rewrite runs


class DataDirBusy(RuntimeError):
    """Another process (the running app) holds the data dir: go through its HTTP API instead."""


@dataclass
class Models:
    """What (re)loading builds from the settings."""

    embedding: Any                       # pipeline.models.embeddings.LoadedEmbedding
    cross_encoder: CrossEncoder | None   # None → rerank stage skipped
    llm: Any                             # OpenAILike, or None → extractive answers
    model_warning: str | None = None     # the collection holds vectors of another model (需要全量重建)
    rewriter: Any = None                 # follow-up rewrite: LLMRewriter with an LLM, else the rule rewrite
    expander: LLMQueryExpander | None = None  # multi-query after the gate (with an LLM; setting llm_multi_query)
    calibration: ActiveProfile | None = None  # the embedding model's fitted numbers (pipeline/calibration)


@dataclass
class Components:
    data_dir: Path
    project_root: Path
    models_dir: Path
    calibration_dir: Path | None  # searched for calibration profiles before $KBQA_CALIBRATION_DIR and the package
    db: Database
    config: ConfigStore
    docs: DocumentStore
    files: FileStore
    vectors: VectorStore     # the default knowledge base's collection (= kbs.default.vectors)
    tokenizer: ChineseTokenizer
    bm25: BM25Index          # the default knowledge base's BM25 index (= kbs.default.bm25)
    ingest: IngestService
    write_lock: WriteLock  # multi-store writes hold it shared; backup / audit / repair freeze it (store/write_lock.py)
    dir_lock: DataDirLock
    conversations: ConversationService   # conversations, turns, ownership (pipeline.conversation)
    feedback: FeedbackService
    verified: VerifiedQAService
    router: Router
    rule_rewriter: DeterministicRewriter
    jobs: JobStore                 # the ingest queue in the database
    state: SharedState             # counters other app processes watch (KB generation, settings, reloads)
    retrievals: RetrievalStore     # the retrieval behind each recent answer (重试 on any process)
    leases: LeaseStore             # work one process at a time may do (全量重建)
    deployment: Deployment
    kbs: KnowledgeBases            # every knowledge base: kb_id → its collection and BM25 index
    gate_stats: GateStatsStore | None = None  # the no-answer gate's background (SQLite / PostgreSQL)
    models: Models | None = None
    retrieval: RetrievalService | None = None
    # built with the embedding model by load_models: the gate's background, extractive picker, support check
    gate_background: GateBackgrounds | None = None  # one per knowledge base
    picker: ExtractivePicker | None = None
    support: SupportChecker | None = None
    chunking: KBChunking | None = None  # each knowledge base's chunk settings over the global ones
    doc_tags: DocTagStore | None = None  # document tags / metadata; resolves question filters (store/doc_tags.py)
    # questions computing now; the ingest and the gate background's refresh yield to them (retrieval/in_flight.py)
    questions: QuestionsInFlight = field(default_factory=QuestionsInFlight)

    def close(self) -> None:
        if self.gate_background is not None:
            self.gate_background.cancel()
        self.ingest.stop()
        for kb in self.kbs.opened():
            kb.bm25.wait_idle()
        self.db.close()
        self.dir_lock.release()


def build_components(data_dir: Path | str, *, project_root: Path | None = None, models_dir: Path | None = None,
                     settings: Callable[[], Settings], on_ingested: Callable[[], None] = lambda: None,
                     on_generation: Callable[[int], None] = lambda generation: None,
                     busy_reason: Callable[[], str | None] = lambda: None, exclusive: bool = False,
                     delete_document: Callable[[int], Any] = lambda doc_id: None,
                     deployment: Deployment | None = None, calibration_dir: Path | None = None) -> Components:
    """Stores, indexes and the ingest worker over one data dir. Models come later (`load_models`).

    `settings` returns the current settings (they change at run time); `on_ingested` runs after the ingest
    queue drains, `on_generation(g)` after each document's 就绪 moved the KB generation to g; `busy_reason` says
    why uploads are refused right now (or None); `delete_document` removes a document from every index (a deleted
    verified Q&A entry uses it). The data dir's lock (store/dirlock.py) is taken; with `exclusive` (offline tools) a dir another process holds is refused. `deployment` says where
    metadata, vectors and originals live (default: all embedded in the data dir; docs/deploy.md).
    `calibration_dir` holds calibration profiles searched first (pipeline.calibration.store).
    """
    dep = deployment or Deployment()
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    project_root = Path(project_root or PROJECT_ROOT)
    dir_lock = DataDirLock(data_dir)
    if not dir_lock.acquire("both" if exclusive else dep.role):
        msg = f"数据目录 {data_dir} 正被运行中的应用（pid {dir_lock.holder()}）使用"
        if exclusive:
            raise DataDirBusy(msg + "：请用 --url 让应用自己执行，或先停止应用")
        if dep.role != "both":  # a split role asked for a dir that is not safe to share (store/dirlock.py)
            raise DataDirBusy(msg + f"：--role {dep.role} 只能与 worker 进程（以及至多一个 web 进程）共用数据目录，"
                              "不能与 --role both 的进程共用")
        log.error("%s：两个进程同时写入会损坏数据", msg)
    db = Database(dep.database_url or data_dir / "app.db")
    docs = DocumentStore(db)
    files = FileStore(dep.files_dir or data_dir / "uploads")
    # The default knowledge base's collection opens the Chroma client (a ConnectionError names an unreachable
    # server); the other collections share it.
    first = VectorStore(url=dep.chroma_url) if dep.chroma_url else VectorStore(data_dir / "chroma")

    def open_vectors(kb_id: int) -> VectorStore:
        if kb_id == DEFAULT_KB_ID:
            return first
        return VectorStore(None if dep.chroma_url else data_dir / "chroma", url=dep.chroma_url,
                           name=collection_name(kb_id), client=first.client)

    def open_bm25(kb_id: int) -> BM25Index:
        # in the shared files dir of a team deployment: every process opens the segments one of them wrote
        return BM25Index(bm25_dir(dep.files_dir or data_dir, kb_id),
                         lambda ids: docs.iter_ready_tokens(kb_id) if ids is None else docs.tokens_of(ids),
                         merges=dep.ingests)

    kbs = KnowledgeBases(data_dir, KBStore(db), docs, open_vectors, open_bm25)
    tokenizer = ChineseTokenizer(user_dict=data_dir / "userdict.txt")
    jobs = JobStore(db)
    if db.single_process and dep.role == "both":
        jobs.release_all()  # SQLite: leases left in the queue belong to a previous run of this one process
    comps: Components | None = None  # the ingest worker reads the models that load_models puts here later

    def embed_model():
        return comps.models.embedding.embed_model

    def model_ident() -> tuple[str, int]:
        return comps.models.embedding.model_id, comps.models.embedding.dim

    write_lock = WriteLock()
    config = ConfigStore(db, SecretBox.for_data_dir(data_dir, dep.shared), frozenset(SECRET_FIELDS))
    chunking = KBChunking(config, settings)
    questions = QuestionsInFlight()
    ingest = IngestService(docs, kbs, files, tokenizer, settings, embed_model, model_ident,
                           on_change=on_ingested, busy_reason=busy_reason, write_lock=write_lock,
                           jobs=jobs, ready=lambda: comps is not None and comps.models is not None,
                           lease_s=dep.ingest_lease_s, chunking_of=chunking.effective, claim_jobs=dep.ingests,
                           group_docs=dep.ingest_group,
                           yield_cpu=lambda: questions.wait_idle(INGEST_YIELD_MAX_S), on_generation=on_generation)
    conversations = ConversationService(ConversationStore(db))
    verified = VerifiedQAService(VerifiedQAStore(db), docs, files, ingest.enqueue, delete_document,
                                 busy_reason=busy_reason)
    default = kbs.default
    comps = Components(data_dir, project_root, Path(models_dir or project_root / "models"),
                       Path(calibration_dir) if calibration_dir else None, db, config, docs, files,
                       default.vectors, tokenizer, default.bm25, ingest, write_lock, dir_lock,
                       conversations, FeedbackService(FeedbackStore(db), conversations), verified, Router(),
                       DeterministicRewriter(), jobs, SharedState(db), RetrievalStore(db), LeaseStore(db), dep, kbs,
                       GateStatsStore(db), chunking=chunking, doc_tags=DocTagStore(db), questions=questions)
    return comps


def build_ops(c: Components, *, model_ids: Callable[[], Any], has_job: Callable[[int], bool],
              rebuild_bm25: Callable[[], None], on_model_fixed: Callable[[], None]) -> tuple[KBAuditor, KBRepairer]:
    """The knowledge-base audit and its repairer over every knowledge base of the data dir. The engine hands in
    what only it knows (the expected model ids, whether a document has a live job, its post-change hooks)."""
    vectors = c.kbs.all_vectors  # audit / repair / backup look at every knowledge base
    auditor = KBAuditor(c.docs, vectors, c.files, c.tokenizer, model_ids,
                        bm25_ids=vectors.bm25_indexed_ids, has_job=has_job, write_lock=c.write_lock)
    repairer = KBRepairer(auditor, RepairHooks(
        embed=lambda texts: c.models.embedding.embed_model.get_text_embedding_batch(texts),
        model=lambda: (c.models.embedding.model_id, c.models.embedding.dim),
        requeue=c.ingest.enqueue, rebuild_bm25=rebuild_bm25, on_model_fixed=on_model_fixed))
    return auditor, repairer


@dataclass
class Sources:
    web: WebSources
    folders: FolderSync
    schedule: SourceSchedule  # the per-URL / per-folder intervals


@dataclass
class Services:
    """What the doors (ui/, api/, app.py) talk to, each built once over one `Components`."""

    components: Components
    settings: SettingsService
    lifecycle: Lifecycle
    changes: SearchableChanges     # the one change hook for everything that changes what is searchable
    sync: SharedSync               # in step with other app processes (the counters in app_state)
    kbs: KnowledgeBaseService
    documents: DocumentService
    answers: AnswerService
    conversations: ConversationDesk
    ops: OperationsService
    api_keys: ApiKeyService        # API keys of /api and /v1 (the caller resolution: pipeline/access/callers.py)
    rate_limits: RateLimiter       # requests per minute per key / login, counted in the database
    audit: AuditLog                # who asked what through which door, and the admin actions
    login_throttle: LoginThrottle  # failed logins slow down, then lock (per user and per address)
    chunks: ChunkService           # a KB admin edits, restores, disables / enables and adds chunks
    chunking: ChunkingService      # per-KB chunking and the upload preview (预览分块)
    doc_tags: DocTagService        # tags / metadata of documents (the filters: pipeline/retrieval/doc_filter.py)
    sources: Sources | None = None  # web pages and the folder a knowledge base follows (built over documents)

    def close(self) -> None:
        """Background work that writes into the data dir ends (or is waited for) before the stores close."""
        if self.sources is not None:
            self.sources.schedule.close()
        self.sync.close()
        self.components.close()


def build_services(data_dir: Path | str, *, project_root: Path | None = None, models_dir: Path | None = None,
                   deployment: Deployment | None = None, calibration_dir: Path | None = None) -> Services:
    """Components and the services over them, wired to each other. The components' callbacks (ingest done, why
    uploads are refused, a verified entry's delete) reach services built after them, hence the late binding."""
    svc: Services | None = None
    c = build_components(
        data_dir, project_root=project_root, models_dir=models_dir, settings=lambda: svc.settings.current,
        on_ingested=lambda: svc.changes.ingested(),
        on_generation=lambda g: svc.sync.bumped(KB_GENERATION, g),  # jobs.complete moved it: not news here
        busy_reason=lambda: svc.lifecycle.busy_reason(), delete_document=lambda doc_id: svc.documents.delete(doc_id),
        deployment=deployment, calibration_dir=calibration_dir)
    recent = StoredRetrievals(c.retrievals, c.docs.get_chunks)
    audit = AuditLog(AuditLogStore(c.db), retention_days=lambda: svc.settings.current.audit_retention_days)
    settings = SettingsService(c.config, c.project_root, c.calibration_dir, bump=lambda name: svc.sync.bump(name),
                               on_bm25_params=lambda s: svc.lifecycle.bm25_params(s),
                               catch_up=lambda: svc.sync.catch_up(), audit=audit)
    rebuild = Rebuild(c, on_change=lambda **kw: svc.changes.changed(**kw),
                      keep_curated=lambda doc: svc.chunks.reindex_if_curated(doc))
    lifecycle = Lifecycle(c, settings, rebuild, load_models=lambda s: load_models(c, s), sync=lambda: svc.sync,
                          clear_caches=recent.clear, audit=audit)
    sync = SharedSync(c.state, on_kb=lifecycle.refresh_indexes, on_config=settings.reread,
                      on_engine=lifecycle.reload_from_elsewhere)
    changes = SearchableChanges(sync, clear_caches=recent.clear, follow_ingest=lifecycle.follow_ingest)
    access = KBAccess(c.kbs)  # per-KB readers: every read takes a `reader` (None = everyone)
    kbs = KnowledgeBaseService(c, access, lifecycle, changes, audit)
    doc_tags = DocTagService(c, access, audit)

    def model_ids() -> ModelIds:
        stored, stored_dim = c.kbs.all_vectors.model_info()
        emb = c.models.embedding if c.models else None
        return ModelIds(stored, stored_dim, settings.expected_model_id(), emb.model_id if emb else None,
                        emb.dim if emb else None)

    def model_fixed() -> None:
        c.models.model_warning = c.kbs.model_warning(c.models.embedding.model_id, c.models.embedding.dim)

    auditor, repairer = build_ops(c, model_ids=model_ids,
                                  has_job=lambda doc_id: c.ingest.is_queued(doc_id) or rebuild.running,
                                  rebuild_bm25=lambda: (lifecycle.rebuild_bm25(), changes.changed(wait=True)),
                                  on_model_fixed=model_fixed)
    windows = RateWindowStore(c.db)  # request counts and failed logins, shared by every process
    documents = DocumentService(c, access, lifecycle, changes, rebuild, audit, doc_tags)
    svc = Services(c, settings, lifecycle, changes, sync, kbs, documents,
                   AnswerService(c, settings, lifecycle, kbs, recent, catch_up=sync.catch_up, audit=audit),
                   ConversationDesk(c, access), OperationsService(c, lifecycle, changes, auditor, repairer),
                   ApiKeyService(ApiKeyStore(c.db), lambda kb_id: c.kbs.check(kb_id, fresh=True), audit),
                   RateLimiter(windows, lambda: settings.current.api_rate_limit_per_min,
                               lambda: settings.current.login_rate_limit_per_min), audit, LoginThrottle(windows),
                   ChunkService(c, access, lifecycle, changes, audit),
                   ChunkingService(c, settings, audit, start_rebuild=documents.start_rebuild,
                                   rebuild_busy=lifecycle.rebuild_busy), doc_tags)
    web = WebSources(c, svc.documents, audit, lambda: settings.current)
    folders = FolderSync(c, svc.documents, audit, lambda: settings.current)
    svc.sources = Sources(web, folders, SourceSchedule([web.run_due, folders.run_due],
                                                       ready=lambda: lifecycle.state == "ready"))
    return svc


def load_models(c: Components, s: Settings) -> Models:
    """(Re)build the embedding model, the cross-encoder, the LLM and the retrieval service from the settings.

    The embedding model's calibration profile is read here, once per load, and handed to the retrieval service
    (fusion, gate), the extractive picker and the support check."""
    from pipeline.generation.llm_client import build_llm
    from pipeline.models.embeddings import load_embedding

    emb = load_embedding(s.embedding_model_path, c.project_root, c.models_dir)
    LISettings.embed_model = emb.embed_model  # never let LlamaIndex fall back to OpenAI
    LISettings.llm = None
    calibration = profile_for(emb.model_id, emb.dim, c.calibration_dir)
    if not calibration.calibrated:
        log.warning("embedding model %s is not calibrated: %s", emb.model_id, calibration.note)
    llm = build_llm(s)
    rewriter = (LLMRewriter(llm, c.rule_rewriter, timeout_s=min(REWRITE_TIMEOUT_S, s.llm_timeout))
                if llm is not None else c.rule_rewriter)
    models = Models(emb, _load_cross_encoder(c, s), llm, c.kbs.model_warning(emb.model_id, emb.dim), rewriter,
                    LLMQueryExpander(llm) if llm is not None else None, calibration)
    c.models = models
    texts = TextVectors(emb.embed_model)  # sentence / answer-window vectors, kept by text for both readers
    c.retrieval = RetrievalService(
        c.docs, c.kbs, c.tokenizer, emb.embed_model, models.cross_encoder, calibration,
        pending_vectors=c.docs.pending_chunk_count, vector_enabled=lambda: models.model_warning is None,
        background=lambda kb_ids: c.gate_background.current(kb_ids),
        sentences=SentenceEvidence(texts), tags=c.doc_tags, questions=c.questions)
    # One background per knowledge base, its probes scored over that knowledge base alone with the settings of
    # this load (recall size / fusion barely move their best cosine).
    c.gate_background = GateBackgrounds(c.gate_stats, lambda kb_id: GateBackground(
        c.gate_stats, lambda: emb.model_id, lambda q: c.retrieval.measure_gate(q, s, (kb_id,)),
        lambda: c.kbs.get(kb_id).bm25.view, kb_id=kb_id, sentences=c.retrieval.gate_model.two_stage), c.kbs.ids,
        busy=c.questions.busy)
    # the live IDF table and the background of the knowledge bases the sources come from, read per question
    weights = c.retrieval.term_weights
    background = c.gate_background.current
    prof = calibration.profile
    c.picker = ExtractivePicker(c.tokenizer, emb.embed_model, weights, PickerParams.from_calibration(prof.extractive),
                                background=background, vectors=texts, holds_document=c.docs.any_retrievable_named,
                                earlier=lambda doc_id, index: c.docs.texts_before(doc_id, index, EARLIER_CHUNKS))
    c.support = SupportChecker(emb.embed_model, c.tokenizer, weights, source_vectors=lambda nodes: _stored(c, nodes),
                               params=SupportParams.from_calibration(prof.support), background=background)
    return models


def _stored(c: Components, nodes) -> list | None:
    """The stored vectors of the source nodes, in order (None for a node without one), each read from the
    collection of its own knowledge base."""
    by_id: dict[int, list] = {}
    for kb_id in kb_ids_of(nodes):
        ids = [int(n.node.node_id) for n in nodes if kb_id_of(n) == kb_id]
        by_id.update(c.kbs.get(kb_id).vectors.embeddings_of(ids))
    return [by_id.get(int(n.node.node_id)) for n in nodes]


def _load_cross_encoder(c: Components, s: Settings) -> CrossEncoder | None:
    d = resolve_model_dir(s.reranker_model_path, c.project_root)
    if d is None:
        return None
    try:
        return load_cross_encoder(d, s.final_top_k)
    except Exception as exc:  # a broken reranker folder must not stop the app: the stage is skipped
        log.error("reranker %s failed to load: %s", d, exc)
        return None
