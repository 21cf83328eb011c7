"""BM25 route: llama-index's BM25Retriever over a bm25s index built from jieba tokens stored at ingest.

Out of the box BM25Retriever tokenizes with an English regex + stemmer, so Chinese scores 0.0 everywhere and
`from_defaults(tokenizer=...)` is ignored. We build the bm25s index ourselves from the tokens kept in SQLite
(never re-tokenizing the corpus), hand it in as `existing_bm25`, and tokenize the query with the same
ChineseTokenizer in `_retrieve`.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import bm25s
import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.retrievers.bm25 import BM25Retriever

from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.bm25_delta import DeltaBM25
from pipeline.retrieval.in_flight import lower_this_thread
from pipeline.retrieval.nodes import ChunkLookup, node_from_row, retrievable

log = logging.getLogger(__name__)

# Fold the delta into a full build before it grows past this share of the main index (or FOLD_MIN chunks):
# the delta is scored in Python per query, a rebuild costs time proportional to the main index, so folding at a
# fixed share keeps both the per-query cost and the amortized rebuild cost per chunk bounded.
FOLD_SHARE = 0.1
FOLD_MIN = 2000
# After an ingest drains, fold at once when the full build is predicted to take less than this (a small
# knowledge base: its answers are then exactly a full build's from the first question on); a larger one waits
# for a quiet moment. The prediction is this index's own last build time per chunk, measured in process;
# before any build, BUILD_MS_PER_CHUNK (measured on the 2-core reference machine: 8.8k chunks in 1.2 s).
FOLD_INLINE_MS = 150.0
BUILD_MS_PER_CHUNK = 0.14


@dataclass
class BM25Snapshot:
    """An immutable built index: bm25s object + position → chunk_id map."""

    bm25: bm25s.BM25 | None
    chunk_ids: np.ndarray  # int64, position in the index → chunk_id
    k1: float
    b: float
    total_len: int = 0  # Σ chunk lengths in tokens (the delta needs main's average length)
    generation: int = 0  # order in which builds started; an older build never replaces a newer one
    _order: np.ndarray | None = field(default=None, repr=False)  # argsort of chunk_ids (lazy)
    _sorted: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return int(len(self.chunk_ids))

    def doc_freq(self, term: str) -> int:
        """Chunks of this index holding `term` (a column of bm25s' CSC score matrix has one entry each)."""
        if self.bm25 is None:
            return 0
        tid = self.bm25.vocab_dict.get(term)
        if tid is None:
            return 0
        indptr = self.bm25.scores["indptr"]
        return int(indptr[tid + 1] - indptr[tid])

    def positions(self, chunk_ids: list[int]) -> np.ndarray:
        """Index position of each chunk_id, −1 where the snapshot does not hold it."""
        q = np.asarray(chunk_ids, dtype=np.int64)
        if self.size == 0:
            return np.full(len(q), -1, dtype=np.int64)
        if self._order is None:  # built in chunk_id order, but do not rely on it
            self._order = np.argsort(self.chunk_ids, kind="stable")
            self._sorted = self.chunk_ids[self._order]
        at = np.minimum(np.searchsorted(self._sorted, q), self.size - 1)
        return np.where(self._sorted[at] == q, self._order[at], -1)


def build_snapshot(items: Iterable[tuple[int, list[str]]], k1: float, b: float) -> BM25Snapshot:
    ids: list[int] = []
    corpus: list[list[str]] = []
    for chunk_id, tokens in items:
        ids.append(chunk_id)
        corpus.append(tokens or [""])
    if not ids:
        return BM25Snapshot(None, np.zeros(0, dtype=np.int64), k1, b)
    bm = bm25s.BM25(k1=k1, b=b, method="lucene")
    bm.index(corpus, show_progress=False)
    return BM25Snapshot(bm, np.asarray(ids, dtype=np.int64), k1, b, total_len=sum(len(c) for c in corpus))


def _placeholder_bm25() -> bm25s.BM25:
    """An empty bm25s object for BM25Retriever's constructor when only the delta holds chunks."""
    bm = bm25s.BM25(method="lucene")
    bm.scores = {"num_docs": 0}
    bm.vocab_dict = {}
    return bm


class JiebaBM25Retriever(BM25Retriever):
    """BM25Retriever whose query side uses our Chinese tokenizer and whose hits map to chunk_ids.

    `mask_out` holds chunk_ids deleted since the snapshot was built (a soft delete through bm25s' weight
    mask, until the background rebuild swaps in a fresh snapshot). `delta` holds chunks made ready since the
    snapshot was built (pipeline.retrieval.bm25_delta); its scores are merged with the main ones.
    """

    def __init__(self, snapshot: BM25Snapshot, tokenizer: ChineseTokenizer, lookup: ChunkLookup,
                 similarity_top_k: int = 50, mask_out: set[int] | None = None, delta: DeltaBM25 | None = None):
        self.snapshot = snapshot
        self.tokenizer = tokenizer
        self.lookup = lookup
        self.mask_out = set(mask_out or ())
        self.delta = delta
        # BM25Retriever's constructor raises on an empty corpus (max() of empty): when only the delta holds
        # chunks it gets an empty placeholder, and score_tokens never asks it.
        super().__init__(existing_bm25=snapshot.bm25 or _placeholder_bm25(), similarity_top_k=similarity_top_k,
                         skip_stemming=True)
        self.similarity_top_k = similarity_top_k  # the base caps it at the main index's size; the delta adds more

    def score_tokens(self, tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(chunk_ids, scores) over the main snapshot followed by the delta; deleted chunks score 0."""
        snap = self.snapshot
        ids = self.bm25.get_tokens_ids(tokens) if snap.bm25 is not None else []
        if ids:
            scores = self.bm25.get_scores_from_ids(ids)
        else:
            scores = np.zeros(snap.size, dtype=np.float32)
        chunk_ids = snap.chunk_ids
        if self.delta is not None and self.delta.size:
            d_ids, d_scores = self.delta.scores(tokens, snap.doc_freq, snap.size, snap.total_len, snap.k1, snap.b)
            chunk_ids = np.concatenate([chunk_ids, d_ids])
            scores = np.concatenate([scores.astype(np.float32), d_scores])
        if self.mask_out:
            scores = scores * np.isin(chunk_ids, np.fromiter(self.mask_out, dtype=np.int64), invert=True)
        return chunk_ids, scores

    def query_scores(self, query: str) -> np.ndarray:
        """BM25 score of every indexed chunk for this query: the snapshot's positions, then the delta's."""
        return self.score_tokens(self.tokenizer(query))[1]

    def _chunk_ids(self, n: int) -> np.ndarray:
        """chunk_id of each of the first n score positions (snapshot, then delta; the delta only appends)."""
        snap = self.snapshot
        if n <= snap.size:
            return snap.chunk_ids
        return np.concatenate([snap.chunk_ids, np.asarray(self.delta.chunk_ids[:n - snap.size], dtype=np.int64)])

    def _positions(self, chunk_ids: list[int], n: int) -> np.ndarray:
        """Score position of each chunk_id among the first n, −1 where neither index holds it."""
        pos = self.snapshot.positions(chunk_ids)
        if self.delta is not None and n > self.snapshot.size:
            for k, c in enumerate(chunk_ids):
                d = self.delta.pos_of.get(int(c))
                if pos[k] < 0 and d is not None and self.snapshot.size + d < n:
                    pos[k] = self.snapshot.size + d
        return pos

    def restrict(self, scores: np.ndarray, allowed) -> np.ndarray:
        """The scores with every chunk outside a filter's allowed set zeroed (pipeline/retrieval/doc_filter.py):
        `hits` then takes its top-k among the allowed chunks only."""
        snap = self.snapshot
        tail = self._chunk_ids(len(scores))[snap.size:] if len(scores) > snap.size else np.zeros(0, dtype=np.int64)
        keep = allowed.keep(snap.chunk_ids, tail)[:len(scores)]
        return np.where(keep, scores, 0.0).astype(scores.dtype, copy=False)

    def hits(self, scores: np.ndarray) -> list[NodeWithScore]:
        """The top `similarity_top_k` chunks with a positive score, as ready nodes."""
        chunk_ids = self._chunk_ids(len(scores))
        k = min(self.similarity_top_k, len(scores))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        # Sort by score desc, ties by chunk_id asc → deterministic.
        top = sorted(top.tolist(), key=lambda i: (-float(scores[i]), int(chunk_ids[i])))
        hits = [(int(chunk_ids[i]), float(scores[i])) for i in top if scores[i] > 0]
        rows = self.lookup([cid for cid, _ in hits])
        out = []
        for cid, score in hits:
            row = rows.get(cid)
            if not retrievable(row):
                continue
            out.append(NodeWithScore(node=node_from_row(row), score=score))
        return out

    def scores_of(self, scores: np.ndarray, chunk_ids: list[str]) -> dict[str, float]:
        """The real BM25 score of given chunks (0.0 for a chunk neither the snapshot nor the delta holds)."""
        pos = self._positions([int(c) for c in chunk_ids], len(scores))
        return {c: (float(scores[p]) if p >= 0 else 0.0) for c, p in zip(chunk_ids, pos)}

    def coverage(self, query: str, chunk_id: str) -> float:
        """idf-weighted share of the query's indexed tokens that occur in the chunk (0–1)."""
        tokens = self.tokenizer(query)
        p = int(self.snapshot.positions([int(chunk_id)])[0])
        if p < 0 and self.delta is not None and int(chunk_id) in self.delta.pos_of:
            snap = self.snapshot
            return self.delta.coverage(tokens, self.delta.pos_of[int(chunk_id)], snap.doc_freq, snap.size)
        if self.snapshot.bm25 is None:
            return 0.0
        ids = sorted(set(self.bm25.get_tokens_ids(tokens)))
        if p < 0 or not ids:
            return 0.0
        sc = self.bm25.scores
        indptr, indices, n = sc["indptr"], sc["indices"], float(sc["num_docs"])
        total = found = 0.0
        for t in ids:
            s, e = int(indptr[t]), int(indptr[t + 1])
            df = e - s
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            total += idf
            if df and bool(np.any(indices[s:e] == p)):
                found += idf
        return found / total if total > 0 else 0.0

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.hits(self.query_scores(query_bundle.query_str))


class BM25Index:
    """Owns the current snapshot and its delta: rebuild from stored tokens, persist, load, soft-delete, and
    `add_ready` for documents about to turn 就绪 (searchable at once through the delta).

    Readers take the (snapshot, delta) pair in one attribute read (atomic), so a rebuild never blocks
    questions. A rebuild reads the tokens without the lock (seconds at 50k chunks) and swaps under it: delta
    entries the new snapshot does not hold (made ready while it was being built) are carried over, and a build
    that started earlier than the current snapshot's is dropped, so no ready chunk ever falls out of BM25.
    """

    def __init__(self, persist_dir: Path, token_source: Callable[[], Iterable[tuple[int, list[str]]]]):
        self.persist_dir = Path(persist_dir)
        self.token_source = token_source
        # (snapshot, delta) is published as one pair: a reader taking the old snapshot with the new delta
        # (or the reverse) across a fold would miss the chunks that moved from one to the other.
        self._view: tuple[BM25Snapshot, DeltaBM25] = (BM25Snapshot(None, np.zeros(0, dtype=np.int64), 1.5, 0.75),
                                                      DeltaBM25())
        self.deleted: set[int] = set()
        self._lock = threading.Lock()
        self._generation = 0
        self._folding = False
        self._fold_thread: threading.Thread | None = None
        self._closing = threading.Event()  # wait_idle: a fold waiting for quiet runs at once
        self._fold_waiting = False  # a follow_ingest fold waits for a quiet moment (in _later_thread)
        self._fold_after = 0  # that fold is done once a build of a later generation than this has landed
        self._later_thread: threading.Thread | None = None
        self._discarded = False  # the knowledge base is being deleted: nothing is persisted any more
        self.last_build_ms = 0.0
        self._ms_per_chunk = BUILD_MS_PER_CHUNK

    @property
    def snapshot(self) -> BM25Snapshot:
        return self._view[0]

    @property
    def delta(self) -> DeltaBM25:
        return self._view[1]

    def _next_generation(self) -> int:
        with self._lock:
            self._generation += 1
            return self._generation

    def rebuild(self, k1: float, b: float, persist: bool = True) -> BM25Snapshot:
        gen = self._next_generation()
        t0 = time.perf_counter()
        snap = build_snapshot(self.token_source(), k1, b)
        snap.generation = gen
        with self._lock:
            if gen < self.snapshot.generation:
                log.info("BM25 build %d superseded by %d; dropped", gen, self.snapshot.generation)
                return self.snapshot
            held = set(snap.chunk_ids.tolist())
            self._view = (snap, DeltaBM25((c, t) for c, t in self.delta.items if c not in held))
            self.deleted = set()
            self.last_build_ms = (time.perf_counter() - t0) * 1000
            if snap.size:
                self._ms_per_chunk = self.last_build_ms / snap.size
            if persist and not self._discarded:
                self._persist(snap)
        log.info("BM25 rebuilt: %d chunks in %.0f ms (delta carries %d)", snap.size, self.last_build_ms,
                 self.delta.size)
        return snap

    def add_ready(self, items: list[tuple[int, list[str]]]) -> None:
        """Chunks of a document about to be marked 就绪 (called before mark_ready, on the ingest worker).

        The retriever still filters on status, so they surface exactly when the document turns ready. A
        delta past its share of the main index is folded by a background rebuild.
        """
        with self._lock:
            self.delta.add(items)
            params = self._claim_fold() if self.delta.size >= max(FOLD_MIN, FOLD_SHARE * self.snapshot.size) else None
        if params:
            self._fold_thread = threading.Thread(target=self._fold, args=params, name="bm25-fold", daemon=True)
            self._fold_thread.start()

    def _claim_fold(self) -> tuple[float, float] | None:
        """Under the lock: (k1, b) for the fold this caller now runs, or None when one runs already."""
        if self._folding:
            return None
        self._folding = True
        return self.snapshot.k1, self.snapshot.b

    def follow_ingest(self, expected_ids: set[int], quiet: Callable[[threading.Event], bool]) -> str:
        """This process's ingest made documents 就绪: their chunks are in the delta already (`add_ready`), so no
        full build is needed for them — that was seconds of CPU per drained queue, taken from the questions asked
        meanwhile. What else the ingest changed is followed here: chunks that left the ready set (the previous
        version a new one replaced) are soft-deleted. A ready chunk neither index holds (not this ingest's doing)
        means a full build, as before. The delta is folded into a full build (persisted, what the next start
        loads) once no question has computed for a while (`quiet`), or earlier when it passes its share.

        A build predicted to be short (FOLD_INLINE_MS) is not deferred: a small knowledge base then answers
        exactly as after a full build from the drain on.

        Returns "followed", "folded" or "rebuilt". The (snapshot, delta) pair is replaced either way: what keys
        on it (the gate background, the filter's allowed ids) re-reads what changed."""
        with self._lock:
            started = self._generation  # builds up to this one may have read the ready set before the caller did
        snap = self.snapshot
        indexed = self.indexed_ids()  # a build landing after the read above is caught under the lock below
        if expected_ids - indexed:
            self.rebuild(snap.k1, snap.b)
            return "rebuilt"
        with self._lock:
            if self._view[0] is not snap:  # a build landed meanwhile
                if self._view[0].generation > started:  # it began after the caller read the ready set
                    return "followed"
                snap, indexed = self._view[0], self.indexed_ids()  # an older one (a share fold): follow its view
            self.deleted = self.deleted | (indexed - expected_ids)
            self._view = (snap, self._view[1])
            if not self.delta.size:
                return "followed"
            cheap = self._ms_per_chunk * (snap.size + self.delta.size) <= FOLD_INLINE_MS
            now = self._claim_fold() if cheap else None
            # otherwise a build that starts after this call folds the delta in (one in flight may have read the
            # ready set before these documents were marked 就绪: its carried-over delta still needs a fold)
            self._fold_after = max(self._fold_after, started)
            later = not now and not self._fold_waiting
            self._fold_waiting = self._fold_waiting or later
        if now:
            self._fold(*now)
            return "folded"
        if later:
            self._later_thread = threading.Thread(target=self._fold_when_quiet, args=(quiet,), name="bm25-fold-later",
                                                  daemon=True)
            self._later_thread.start()
        return "followed"

    @property
    def settled(self) -> bool:
        """Nothing waits in the delta and no fold runs or waits: scores are a full build's. (Until then the main
        snapshot's chunks keep the statistics of their own build while the delta's use main + delta.)"""
        return self.delta.size == 0 and not self._folding and not self._fold_waiting

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait for a fold in flight: it persists into the data dir, which a closing caller may remove next. A
        fold still waiting for a quiet moment runs now (what the next start and the offline audit read)."""
        self._closing.set()
        for t in (self._later_thread, self._fold_thread):
            if t is not None and t is not threading.current_thread():
                t.join(timeout)

    def discard(self, timeout: float = 30.0) -> None:
        """The knowledge base is being deleted: a fold waiting for quiet ends without building, one in flight
        is waited for, and nothing is persisted from now on (the caller removes the folder next)."""
        with self._lock:  # a build persists under the lock: none is half-written once this returns
            self._discarded = True
        self.wait_idle(timeout)

    def _fold(self, k1: float, b: float) -> None:
        lower_this_thread()
        try:
            if self.delta.size:  # another build may have folded it meanwhile
                self.rebuild(k1, b)
        except Exception:
            log.exception("BM25 fold failed")
        finally:
            self._folding = False

    def _fold_when_quiet(self, quiet: Callable[[threading.Event], bool]) -> None:
        try:
            quiet(self._closing)  # closing ends the wait: the build is persisted before the app exits
        finally:
            self._fold_waiting = False
        while True:
            with self._lock:
                if self._discarded or not self.delta.size or self.snapshot.generation > self._fold_after:
                    return  # nothing left, or a build that began after the drain has landed
                params = self._claim_fold()
            if params:
                self._fold(*params)
                return
            running = self._fold_thread  # another fold in flight: wait for it, then look again
            if running is not None and running.is_alive() and running is not threading.current_thread():
                running.join(1.0)
            else:
                time.sleep(0.05)

    def soft_delete(self, chunk_ids: Iterable[int]) -> None:
        self.deleted = self.deleted | set(int(c) for c in chunk_ids)

    def _persist(self, snap: BM25Snapshot) -> None:
        tmp = self.persist_dir.with_name(self.persist_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if snap.bm25 is not None:
            snap.bm25.save(str(tmp))
        np.save(tmp / "chunk_ids.npy", snap.chunk_ids)
        (tmp / "meta.json").write_text(json.dumps({"k1": snap.k1, "b": snap.b, "size": snap.size,
                                                   "total_len": snap.total_len}))
        shutil.rmtree(self.persist_dir, ignore_errors=True)
        tmp.rename(self.persist_dir)

    def load_or_rebuild(self, k1: float, b: float, expected_ids: set[int]) -> str:
        """Load the persisted index when it matches the ready chunks and k1/b; else rebuild. Returns how."""
        try:
            meta = json.loads((self.persist_dir / "meta.json").read_text())
            ids = np.load(self.persist_dir / "chunk_ids.npy")
            if (meta["k1"] == k1 and meta["b"] == b and set(ids.tolist()) == expected_ids):
                bm = bm25s.BM25.load(str(self.persist_dir)) if len(ids) else None
                snap = BM25Snapshot(bm, ids.astype(np.int64), k1, b, total_len=int(meta["total_len"]))
                with self._lock:
                    snap.generation = self._generation
                    self._view = (snap, DeltaBM25())
                    self.deleted = set()
                return "loaded"
        except (OSError, ValueError, KeyError):
            pass
        self.rebuild(k1, b)
        return "rebuilt"

    def persisted_ids(self) -> set[int]:
        """Chunk ids of the index on disk (what the next start loads; empty when there is none)."""
        try:
            return set(np.load(self.persist_dir / "chunk_ids.npy").tolist())
        except (OSError, ValueError):
            return set()

    def indexed_ids(self) -> set[int]:
        """Chunk ids BM25 can find now (main + delta, minus soft deletes): what the audit compares."""
        snap, delta = self._view
        return (set(snap.chunk_ids.tolist()) | set(delta.chunk_ids[:delta.size])) - self.deleted

    def retriever(self, tokenizer: ChineseTokenizer, lookup: ChunkLookup, top_k: int) -> JiebaBM25Retriever | None:
        """A retriever over the current snapshot and delta (None while both are empty).

        Not capped at today's size: the delta grows under the retriever, and _retrieve caps k per query.
        """
        snap, delta = self._view
        if snap.size + delta.size == 0:
            return None
        return JiebaBM25Retriever(snap, tokenizer, lookup, similarity_top_k=top_k, mask_out=self.deleted,
                                  delta=delta)

    @property
    def view(self) -> tuple[BM25Snapshot, DeltaBM25]:
        """The current (snapshot, delta) pair; a new pair after every rebuild."""
        return self._view


class LiveBM25Retriever(BaseRetriever):
    """The BM25 route as a long-lived retriever: always searches the index's current snapshot.

    BM25Index swaps its (snapshot, delta) pair on rebuild and grows its soft-delete set on delete; the inner
    JiebaBM25Retriever is re-made only when either changed, not per question (a delta that grows in place is
    seen by the retriever that holds it).
    """

    def __init__(self, index: BM25Index, tokenizer: ChineseTokenizer, lookup: ChunkLookup, top_k: int):
        self._index = index
        self._tokenizer = tokenizer
        self._lookup = lookup
        self._top_k = top_k
        self._cached: tuple[object, frozenset[int], JiebaBM25Retriever | None] | None = None
        super().__init__()

    def _current(self) -> JiebaBM25Retriever | None:
        view, deleted = self._index.view, frozenset(self._index.deleted)
        cached = self._cached
        if cached is None or cached[0] is not view or cached[1] != deleted:
            cached = (view, deleted, self._index.retriever(self._tokenizer, self._lookup, self._top_k))
            self._cached = cached  # one attribute write: concurrent readers see an old or a new triple
        return cached[2]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        inner = self._current()
        return inner.retrieve(query_bundle) if inner is not None else []

    # Full-information fusion (pipeline.retrieval.fusion.HybridRetriever): the whole-corpus scores of one
    # query, its top list from them, and the real score of any other chunk — one scoring pass per question.
    def query_scores(self, query: str) -> tuple[JiebaBM25Retriever, np.ndarray] | None:
        """(the snapshot's retriever, its scores for the query), or None while the index is empty. The
        retriever is handed back so the list and the completion read the same snapshot."""
        inner = self._current()
        return None if inner is None else (inner, inner.query_scores(query))
