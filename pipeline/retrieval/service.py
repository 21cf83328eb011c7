"""Query flow (SRS §4.2): embed query → BM25 ‖ vector recall → fusion (fusion.py) → rerank → no-answer gate.

The retrievers and the rerank postprocessor are LlamaIndex components built once per settings change and set of
knowledge bases (they are cheap objects over the shared indexes and models) and used through their public
`retrieve` / `postprocess_nodes`. `kb_ids` scopes a question to some knowledge bases (None: all of them); each
route asks every one of them (pipeline.retrieval.scope). The result is a plain `RetrievalResult`;
pipeline.events renders it.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llama_index.core.schema import NodeWithScore, QueryBundle

from pipeline.calibration import ActiveProfile
from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.bm25 import LiveBM25Retriever
from pipeline.retrieval.doc_filter import Allowed, AllowedChunkIds, ChunkDocs, DocFilter
from pipeline.retrieval.fusion import FusionOutput, FusionParams, HybridRetriever
from pipeline.retrieval.gate import GateModel, decide
from pipeline.retrieval.gate_background import Background
from pipeline.retrieval.gate_features import GateFeatures, measure
from pipeline.retrieval.in_flight import QuestionsInFlight
from pipeline.retrieval.lexical import TermWeights, merged_weights
from pipeline.retrieval.rerank import CrossEncoder, SafeRerank, rerank_status
from pipeline.retrieval.result import RetrievalResult, fused_row, fusion_info
from pipeline.retrieval.result import rounded as _r
from pipeline.retrieval.scope import scoped, scoped_bm25
from pipeline.retrieval.sentence_evidence import SentenceEvidence
from pipeline.retrieval.vector import ReadyVectorRetriever, chroma_index, stored_cosines
from pipeline.settings import Settings
from store.doc_tags import DocTagStore
from store.documents import DocumentStore

if TYPE_CHECKING:
    from pipeline.retrieval.kb_indexes import KnowledgeBase, KnowledgeBases

log = logging.getLogger(__name__)

NOT_HIT_STATUS = {"status": "skipped", "msg": "未命中相关资料，跳过精排"}


@dataclass(frozen=True)
class _Stages:
    """The LlamaIndex components for one set of retrieval settings."""

    fusion: HybridRetriever
    rerank: SafeRerank


WARM_QUESTION = "预热：这份资料的主要内容是什么？"  # any question: it only exercises the stages


class RetrievalService:
    """`calibration`: the profile of the loaded embedding model (pipeline.calibration) — the fusion's α model and
    fragment prior, the gate's models; the min_similarity floor is a setting (its default from the same profile)."""

    def __init__(self, docs: DocumentStore, kbs: KnowledgeBases,
                 tokenizer: ChineseTokenizer, embed_model, cross_encoder: CrossEncoder | None,
                 calibration: ActiveProfile,
                 pending_vectors: Callable[[], int] = lambda: 0, vector_enabled: Callable[[], bool] = lambda: True,
                 background: Callable[[tuple[int, ...]], Background | None] = lambda kb_ids: None,
                 sentences: SentenceEvidence | None = None, tags: DocTagStore | None = None, *,
                 questions: QuestionsInFlight):
        self.tags = tags  # resolves a question's document filter to the documents it allows (store/doc_tags.py)
        self.chunk_docs = ChunkDocs(tags.doc_ids_of) if tags is not None else None  # BM25 position → doc_id
        # a filter's allowed chunk ids per knowledge base, for the vector route (kept per BM25 snapshot)
        self.allowed_ids = AllowedChunkIds(docs.ready_chunk_ids_of_docs, lambda kb_id: kbs.get(kb_id).bm25.view)
        # the gate's background of the knowledge bases a question searches (pipeline/retrieval/gate_background.py)
        self.background = background
        # questions computing now: background work (gate background refresh, ingest) yields to them
        self.questions = questions  # the one counter of the process (components.py)
        self.sentences = sentences  # the gate's second-stage evidence (None: the quick score decides alone)
        self.calibration = calibration
        self.gate_model = GateModel.from_calibration(calibration.profile.gate)  # on this model's cosine scale
        self.docs = docs
        self.kbs = kbs
        self.tokenizer = tokenizer
        self.embed_model = embed_model
        self.cross_encoder = cross_encoder
        self.pending_vectors = pending_vectors
        self.vector_enabled = vector_enabled
        # kb_id → (collection, VectorStoreIndex); the collection object changes on a model reset
        self._indexes: dict[int, tuple] = {}
        self._stages: dict[tuple, _Stages] = {}
        self._lock = threading.Lock()

    # --- components, built once per settings ----------------------------------------------------
    def _vector_index(self, kb: KnowledgeBase):
        col = kb.vectors.collection
        cached = self._indexes.get(kb.kb_id)
        if cached is None or cached[0] is not col:
            cached = self._indexes[kb.kb_id] = (col, chroma_index(col, self.embed_model))
        return cached[1]

    def scope(self, kb_ids=None) -> tuple[int, ...]:
        """The knowledge bases a question searches: the given ones (checked), or all."""
        return tuple(sorted({self.kbs.check(k) for k in kb_ids})) if kb_ids else tuple(self.kbs.ids())

    def stages(self, s: Settings, recall: int | None = None, kb_ids=None) -> _Stages:
        """Fusion retriever + rerank postprocessor for these settings and knowledge bases (cached; a settings
        change makes new ones)."""
        recall = recall or s.recall_size
        scope = self.scope(kb_ids)
        params = FusionParams.from_settings(s, self.calibration.profile.fusion)
        key = (recall, repr(params), s.final_top_k, s.rerank_candidates, scope)
        with self._lock:
            built = self._stages.get(key)
            if built is None:
                lookup = self.docs.get_chunks
                kbs = [self.kbs.get(k) for k in scope]
                bm25 = scoped_bm25([LiveBM25Retriever(kb.bm25, self.tokenizer, lookup, recall) for kb in kbs], recall)
                vec = scoped([ReadyVectorRetriever(lambda kb=kb: self._vector_index(kb), lookup, recall,
                                                   extra_fetch=lambda kb=kb: self.docs.pending_chunk_count(kb.kb_id),
                                                   enabled=self.vector_enabled,
                                                   ready_count=lambda kb=kb: self.docs.ready_chunk_count(kb.kb_id),
                                                   kb_id=kb.kb_id,
                                                   allowed_chunks=lambda d, kb=kb: self.allowed_ids.of(kb.kb_id, d))
                              for kb in kbs], recall)
                fusion = HybridRetriever(bm25, vec, lambda q, ids, others=(), kbs=kbs: self._stored_cosines(q, ids, kbs, others), params)
                built = _Stages(fusion, SafeRerank(self.cross_encoder, top_n=s.final_top_k,
                                                   candidates=s.rerank_candidates))
                if len(self._stages) > 32:  # settings edited many times / many scopes: drop the old ones
                    self._stages.clear()
                self._stages[key] = built
            return built

    @property
    def rerank_label(self) -> str:
        return self.cross_encoder.label if self.cross_encoder else ""

    def warm(self) -> None:
        """Pay the first question's one-off costs while the engine loads: the embedding session's first run and
        each collection's HNSW index, which Chroma reads from disk on the first query (the first wave of questions
        after a restart spent 0.2–0.7 s each in the vector route, all of them at once; docs/benchmarks.md)."""
        if not self.vector_enabled():
            return  # the collections hold another model's vectors: nothing to search
        emb = [float(x) for x in self.embed_model.get_query_embedding("预热")]
        for kb_id in self.kbs.ids():
            col = self.kbs.get(kb_id).vectors.collection
            try:
                if col.count():
                    col.query(query_embeddings=[emb], n_results=1, include=[])
            except Exception as exc:  # a warm-up never fails the load; the question reports a real error
                log.warning("warming the vector index of kb %s failed: %s", kb_id, exc)

    def warm_question(self, s: Settings) -> None:
        """One question through every stage once the indexes are loaded: what each builds on first use (the BM25
        route's retriever over its snapshot, the fusion stages of the default scope, the IDF table, the gate's
        background read) is built here rather than by the first wave of questions after a restart — all of them at
        once, each building it (up to 0.8 s each in the BM25 route before this)."""
        try:
            self.retrieve(WARM_QUESTION, s)
        except Exception as exc:  # a warm-up never fails the load; the question reports a real error
            log.warning("warming the retrieval stages failed: %s", exc)

    # --- stages ------------------------------------------------------------------------------------
    def forget(self, kb_id: int) -> None:
        """A knowledge base was deleted: drop what was built over it."""
        with self._lock:
            self._indexes.pop(kb_id, None)
            self._stages = {k: v for k, v in self._stages.items() if kb_id not in k[-1]}

    def allowed(self, doc_filter: DocFilter | None, kb_ids=None) -> Allowed | None:
        """The chunks a document filter lets a question in these knowledge bases search (None: no filter)."""
        if doc_filter is None or doc_filter.empty:
            return None
        if self.tags is None:
            raise RuntimeError("document filters need the tag store (RetrievalService(tags=...))")
        by_kb, chunks = self.tags.allowed(self.scope(kb_ids), doc_filter)
        return Allowed(by_kb, chunks, self.chunk_docs)

    def recall(self, query: str, s: Settings, recall: int | None = None,
               kb_ids=None, keep=None, doc_filter: DocFilter | None = None,
               expansions: Sequence[str] = (), query_embedding=None) -> tuple[QueryBundle, FusionOutput, float]:
        """Embed the query, run both routes and the fusion. Returns (bundle, routes + fused + ms, embed ms).
        `keep` (evaluation tools only): drop hits before the fusion, route lists then cut to recall_size.
        `doc_filter`: both routes rank only the documents it allows (pipeline/retrieval/doc_filter.py).
        `expansions`: other phrasings of the query searched with it (HybridRetriever.run).
        `query_embedding`: the query's, when a first retrieval already computed it (not embedded again)."""
        t0 = time.perf_counter()
        allowed = self.allowed(doc_filter, kb_ids)
        filter_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        vectors = self.vector_enabled()
        emb = (query_embedding if query_embedding is not None
               else self.embed_model.get_query_embedding(query) if vectors else None)
        extra = [QueryBundle(query_str=q, embedding=self.embed_model.get_query_embedding(q) if vectors else None)
                 for q in expansions]
        embed_ms = (time.perf_counter() - t0) * 1000
        bundle = QueryBundle(query_str=query, embedding=emb)
        fusion = self.stages(s, recall, kb_ids).fusion.run(bundle, keep, s.recall_size, allowed=allowed,
                                                           expansions=extra)
        if allowed is not None:
            fusion.ms["filter"] = filter_ms
        return bundle, fusion, embed_ms

    def _stored_cosines(self, query_embedding, chunk_ids: list[str], kbs=None, others=()) -> dict[str, float]:
        """Cosines of the query (its best over `others` too) with stored vectors, from the collections of the
        knowledge bases in scope."""
        out: dict[str, float] = {}
        for kb in kbs if kbs is not None else self.kbs.all():
            missing = [i for i in chunk_ids if i not in out]
            if not missing:
                break
            out.update(stored_cosines(kb.vectors.collection, query_embedding, missing, others))  # today's collection
        return out

    def recall_stage(self, query: str, s: Settings, kb_ids=None, doc_filter: DocFilter | None = None,
                     query_embedding=None) -> RetrievalResult:
        """Both routes + fusion + the no-answer gate on the query alone (the answer stream reports it as stage
        "recall"). Nothing here calls an LLM: a question the gate refuses is never sent to one."""
        with self.questions.computing():
            return self._recall_stage(query, s, kb_ids, doc_filter, query_embedding)

    def _recall_stage(self, query: str, s: Settings, kb_ids=None, doc_filter: DocFilter | None = None,
                      query_embedding=None) -> RetrievalResult:
        t_start = time.perf_counter()
        bundle, fusion, embed_ms = self.recall(query, s, kb_ids=kb_ids, doc_filter=doc_filter,
                                               query_embedding=query_embedding)
        res = self._result(query, s, bundle, fusion, embed_ms, t_start, doc_filter)
        # Gate (F3-4): refuse (no LLM call downstream) / weak evidence / answer — pipeline/retrieval/gate.py
        t_g = time.perf_counter()
        scope = self.scope(kb_ids)
        bg = self.background(scope) if s.adaptive_gate else None
        decision = decide(self.gate_features(query, fusion, scope), bg, s.min_similarity, bool(fusion.fused),
                          model=self.gate_model, adaptive=s.adaptive_gate,
                          sentence=lambda: self.best_sentence(bundle.embedding, fusion))
        res.gate, res.hit = decision.trace(), decision.hit  # plain data: stored for 重试 with the rest
        res.ms["gate"] = (time.perf_counter() - t_g) * 1000
        return res

    def expanded_stage(self, first: RetrievalResult, s: Settings, expansions: Sequence[str], kb_ids=None,
                       doc_filter: DocFilter | None = None) -> RetrievalResult:
        """Retrieval again with the query and its other phrasings (the LLM's multi-query) fused, for a question
        `first` (recall_stage) let through. The gate is not run again: its outcome is the question's own, which
        `first` decided before any LLM saw the question; only the candidates — hence the sources — change."""
        with self.questions.computing():
            t0 = time.perf_counter()
            bundle, fusion, embed_ms = self.recall(first.query, s, kb_ids=kb_ids, doc_filter=doc_filter,
                                                   expansions=expansions, query_embedding=first.query_embedding)
            res = self._result(first.query, s, bundle, fusion, embed_ms, first.started, doc_filter)
        res.gate, res.hit = first.gate, first.hit
        # the first retrieval's stages as they ran, then what the second one added in all
        res.ms = {**first.ms, "expanded_recall": (time.perf_counter() - t0) * 1000}
        return res

    def _result(self, query: str, s: Settings, bundle: QueryBundle, fusion: FusionOutput, embed_ms: float,
                started: float, doc_filter: DocFilter | None) -> RetrievalResult:
        """One retrieval's routes and fusion as a RetrievalResult, before any gate decision."""
        res = RetrievalResult(query=query, bm25=fusion.bm25, vector=fusion.vector, fused=fusion.fused,
                              min_similarity=s.min_similarity, bm25_weight=fusion.bm25_weight,
                              fusion_mode=fusion.mode, fusion_features=fusion.features,
                              query_embedding=bundle.embedding, started=started,
                              calibration=self.calibration.info(),
                              doc_filter=doc_filter.to_dict() if doc_filter is not None else None)
        res.max_similarity = max((n.score or 0.0 for n in fusion.vector), default=0.0)
        res.ms = {"embed": embed_ms, **fusion.ms}
        return res

    def term_weights(self, kb_ids=None) -> TermWeights:
        """IDF over the chunks of the knowledge bases in scope (one: its own table; several: their union's)."""
        return merged_weights([self.kbs.get(k).bm25.view.weights() for k in self.scope(kb_ids)]
                              or [TermWeights.uniform()])

    def gate_features(self, query: str, fusion: FusionOutput, kb_ids=None,
                      query_embedding=None) -> GateFeatures:
        """The gate's cheap features; with query_embedding also the sentence evidence (embeds sentences)."""
        # the evidence order: the fragment prior ranks what is shown, not whether the KB answers (fusion.py)
        f = measure(self.tokenizer(query), self.tokenizer.segments(query), self.term_weights(kb_ids),
                    fusion.bm25, fusion.vector, fusion.evidence)
        if query_embedding is not None:
            f = dataclasses.replace(f, best_sentence=self.best_sentence(query_embedding, fusion))
        return f

    def best_sentence(self, query_embedding, fusion: FusionOutput) -> float | None:
        return self.sentences.best(query_embedding, fusion.evidence) if self.sentences is not None else None

    def measure_gate(self, query: str, s: Settings, kb_ids=None) -> GateFeatures:
        """Gate features of one query without a decision, the sentence evidence included (how the background
        probes are scored, one KB each: the background needs both)."""
        bundle, fusion, _ = self.recall(query, s, kb_ids=kb_ids)
        # the sentence evidence only where this model's gate reads it (the background probes pay for it)
        return self.gate_features(query, fusion, kb_ids, bundle.embedding if self.gate_model.two_stage else None)

    def rerank_stage(self, res: RetrievalResult, s: Settings) -> RetrievalResult:
        """Cross-encoder (or its skip/fallback) over the fused candidates → the final, numbered sources."""
        with self.questions.computing():
            return self._rerank_stage(res, s)

    def _rerank_stage(self, res: RetrievalResult, s: Settings) -> RetrievalResult:
        t_r = time.perf_counter()
        if res.hit:
            final = self.stages(s).rerank.postprocess_nodes(res.fused, query_str=res.query)
            status = rerank_status(final, {"status": "ok", "msg": self.rerank_label})
        else:
            final, status = [], dict(NOT_HIT_STATUS)
        rerank_ms = (time.perf_counter() - t_r) * 1000
        self._fill_similarity(final, res.query_embedding)
        res.final, res.rerank_status = final, status
        res.ms.update(rerank=rerank_ms, total=(time.perf_counter() - res.started) * 1000)
        log.info("retrieval q=%r bm25=%.1fms vector=%.1fms rerank=%.1fms hit=%s",
                 res.query[:40], res.ms.get("bm25", 0), res.ms.get("vector", 0), rerank_ms, res.hit)
        return res

    def retrieve(self, query: str, s: Settings, kb_ids=None, doc_filter: DocFilter | None = None) -> RetrievalResult:
        return self.rerank_stage(self.recall_stage(query, s, kb_ids, doc_filter), s)

    def _fill_similarity(self, nodes: list[NodeWithScore], query_emb) -> None:
        """Cosine similarity for every final node, also those the vector route did not return."""
        missing = [n for n in nodes if n.node.metadata.get("similarity") is None]
        for n in nodes:
            n.node.metadata["similarity_full"] = n.node.metadata.get("similarity")
        if not missing or query_emb is None:
            return  # the fusion already scored every candidate on both routes
        got = self._stored_cosines(query_emb, [n.node.node_id for n in missing])
        for n in missing:
            n.node.metadata["similarity_full"] = got.get(n.node.node_id)

    def debug_search(self, query: str, top_k: int, s: Settings, kb_ids=None, doc_filter: DocFilter | None = None) -> dict:
        """SRS §7.2 shape: bm25 / vector / fused groups, each top_k long; `rrf` is the same fused list under the
        SRS's name (whatever the fusion mode). `filter`: the document filter applied (None: none)."""
        _, fusion, _ = self.recall(query, s, recall=max(top_k, s.recall_size), kb_ids=kb_ids, doc_filter=doc_filter)

        def row(n):
            m = n.node.metadata
            return {"chunk_id": int(n.node.node_id), "doc_id": m.get("doc_id"), "doc_name": m.get("doc_name"),
                    "kb_id": m.get("kb_id"), "kb_name": m.get("kb_name"), "page": m.get("page"),
                    "text": n.node.get_content()}

        return {
            "bm25": [row(n) | {"score": _r(n.score)} for n in fusion.bm25[:top_k]],
            "vector": [row(n) | {"similarity": _r(n.score)} for n in fusion.vector[:top_k]],
            "fused": [row(n) | fused_row(n) for n in fusion.fused[:top_k]],
            "ms": {k: round(v, 1) for k, v in fusion.ms.items()},
            "bm25_weight": round(fusion.bm25_weight, 3),
            "fusion": fusion_info(fusion.mode, fusion.bm25_weight, fusion.features),
            "filter": doc_filter.to_dict() if doc_filter is not None else None,
        }

