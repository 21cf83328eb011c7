"""The one place that constructs the app's components (PrivateGPT's `di.py` idea).

    components = build_components(data_dir, settings=..., on_ingested=..., busy_reason=...)
    load_models(components, settings)   # embedding, cross-encoder, LLM, retrieval service; again on 重载引擎

`Engine` is a facade over a `Components`; tools and tests use `engine.components.<store>` (or Engine's public
methods). Nothing else builds stores, indexes or models.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Settings as LISettings

from pipeline.generation.extractive import ExtractivePicker
from pipeline.generation.support import SupportChecker
from pipeline.ingestion.service import IngestService
from pipeline.models.paths import resolve_model_dir
from pipeline.retrieval.bm25 import BM25Index
from pipeline.retrieval.gate_background import GateBackground
from pipeline.retrieval.lexical import weights_for
from pipeline.retrieval.rerank import CrossEncoder, load_cross_encoder
from pipeline.retrieval.service import RetrievalService
from pipeline.settings import Settings
from pipeline.tokenize_zh import ChineseTokenizer
from store.config_store import ConfigStore
from store.db import Database
from store.documents import DocumentStore
from store.files import FileStore
from store.gate_stats import GateStatsStore
from store.vectors import VectorStore

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Models:
    """What (re)loading builds from the settings."""

    embedding: Any                       # pipeline.models.embeddings.LoadedEmbedding
    cross_encoder: CrossEncoder | None   # None → rerank stage skipped
    llm: Any                             # OpenAILike, or None → extractive answers
    model_warning: str | None = None     # the collection holds vectors of another model (需要全量重建)


@dataclass
class Components:
    data_dir: Path
    project_root: Path
    models_dir: Path
    db: Database
    config: ConfigStore
    docs: DocumentStore
    files: FileStore
    vectors: VectorStore
    tokenizer: ChineseTokenizer
    bm25: BM25Index
    ingest: IngestService
    gate_stats: GateStatsStore | None = None
    models: Models | None = None
    retrieval: RetrievalService | None = None
    # built with the embedding model by load_models: the gate's background, extractive picker, support check
    gate_background: GateBackground | None = None
    picker: ExtractivePicker | None = None
    support: SupportChecker | None = None

    def close(self) -> None:
        if self.gate_background is not None:
            self.gate_background.cancel()
        self.ingest.stop()
        self.db.close()


def build_components(data_dir: Path | str, *, project_root: Path | None = None, models_dir: Path | None = None,
                     settings: Callable[[], Settings], on_ingested: Callable[[], None] = lambda: None,
                     busy_reason: Callable[[], str | None] = lambda: None) -> Components:
    """Stores, indexes and the ingest worker over one data dir. Models come later (`load_models`).

    `settings` returns the current settings (they change at run time); `on_ingested` runs after the ingest
    queue drains; `busy_reason` says why uploads are refused right now (or None).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    project_root = Path(project_root or PROJECT_ROOT)
    db = Database(data_dir / "app.db")
    docs = DocumentStore(db)
    files = FileStore(data_dir / "uploads")
    vectors = VectorStore(data_dir / "chroma")
    tokenizer = ChineseTokenizer(user_dict=data_dir / "userdict.txt")
    comps: Components  # the ingest worker reads the models that load_models puts here later

    def embed_model():
        return comps.models.embedding.embed_model

    def model_ident() -> tuple[str, int]:
        return comps.models.embedding.model_id, comps.models.embedding.dim

    ingest = IngestService(docs, vectors, files, tokenizer, settings, embed_model, model_ident,
                           on_change=on_ingested, busy_reason=busy_reason)
    comps = Components(data_dir, project_root, Path(models_dir or project_root / "models"), db, ConfigStore(db),
                       docs, files, vectors, tokenizer, BM25Index(data_dir / "bm25", docs.iter_ready_tokens), ingest,
                       GateStatsStore(db))
    return comps


def load_models(c: Components, s: Settings) -> Models:
    """(Re)build the embedding model, the cross-encoder, the LLM and the retrieval service from the settings."""
    from pipeline.generation.llm_client import build_llm
    from pipeline.models.embeddings import load_embedding

    emb = load_embedding(s.embedding_model_path, c.project_root, c.models_dir)
    LISettings.embed_model = emb.embed_model  # never let LlamaIndex fall back to OpenAI
    LISettings.llm = None
    models = Models(emb, _load_cross_encoder(c, s), build_llm(s), c.vectors.check_model(emb.model_id, emb.dim))
    c.models = models
    c.retrieval = RetrievalService(
        c.docs, c.vectors, c.bm25, c.tokenizer, emb.embed_model, models.cross_encoder,
        pending_vectors=c.docs.pending_chunk_count, vector_enabled=lambda: models.model_warning is None,
        background=lambda: c.gate_background.current())
    # Probes are scored with the settings of this load (recall size / fusion barely move their best cosine).
    c.gate_background = GateBackground(c.gate_stats, lambda: emb.model_id, lambda q: c.retrieval.measure_gate(q, s),
                                       lambda: c.bm25.snapshot)
    weights = lambda: weights_for(c.bm25.snapshot.bm25)  # noqa: E731 — the live IDF table, read per question
    c.picker = ExtractivePicker(c.tokenizer, emb.embed_model, weights, background=lambda: c.gate_background.current())
    c.support = SupportChecker(emb.embed_model, c.tokenizer, weights, source_vectors=lambda nodes: _stored(c, nodes),
                               background=lambda: c.gate_background.current())
    return models


def _stored(c: Components, nodes) -> list | None:
    """The stored vectors of the source nodes, in order (None for a node without one)."""
    by_id = c.vectors.embeddings_of([int(n.node.node_id) for n in nodes])
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
