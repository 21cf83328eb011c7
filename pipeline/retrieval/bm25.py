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

from pipeline.retrieval.nodes import ChunkLookup, node_from_row
from pipeline.tokenize_zh import ChineseTokenizer

log = logging.getLogger(__name__)

@dataclass
class BM25Snapshot:
    """An immutable built index: bm25s object + position → chunk_id map."""

    bm25: bm25s.BM25 | None
    chunk_ids: np.ndarray  # int64, position in the index → chunk_id
    k1: float
    b: float
    _order: np.ndarray | None = field(default=None, repr=False)  # argsort of chunk_ids (lazy)
    _sorted: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return int(len(self.chunk_ids))

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
    return BM25Snapshot(bm, np.asarray(ids, dtype=np.int64), k1, b)


class JiebaBM25Retriever(BM25Retriever):
    """BM25Retriever whose query side uses our Chinese tokenizer and whose hits map to chunk_ids.

    `mask_out` holds chunk_ids deleted since the snapshot was built (a soft delete through bm25s' weight
    mask, until the background rebuild swaps in a fresh snapshot).
    """

    def __init__(self, snapshot: BM25Snapshot, tokenizer: ChineseTokenizer, lookup: ChunkLookup,
                 similarity_top_k: int = 50, mask_out: set[int] | None = None):
        self.snapshot = snapshot
        self.tokenizer = tokenizer
        self.lookup = lookup
        self.mask_out = set(mask_out or ())
        # BM25Retriever's constructor raises on an empty corpus (max() of empty): the snapshot is non-empty here.
        super().__init__(existing_bm25=snapshot.bm25, similarity_top_k=similarity_top_k, skip_stemming=True)

    def score_tokens(self, tokens: list[str]) -> np.ndarray:
        ids = self.bm25.get_tokens_ids(tokens)
        if not ids:
            return np.zeros(self.snapshot.size, dtype=np.float32)
        mask = None
        if self.mask_out:
            mask = np.isin(self.snapshot.chunk_ids, np.fromiter(self.mask_out, dtype=np.int64), invert=True)
            mask = mask.astype(np.float32)
        return self.bm25.get_scores_from_ids(ids, weight_mask=mask)

    def query_scores(self, query: str) -> np.ndarray:
        """BM25 score of every indexed chunk for this query (position order of the snapshot)."""
        return self.score_tokens(self.tokenizer(query))

    def hits(self, scores: np.ndarray) -> list[NodeWithScore]:
        """The top `similarity_top_k` chunks with a positive score, as ready nodes."""
        k = min(self.similarity_top_k, len(scores))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        # Sort by score desc, ties by chunk_id asc → deterministic.
        top = sorted(top.tolist(), key=lambda i: (-float(scores[i]), int(self.snapshot.chunk_ids[i])))
        hits = [(int(self.snapshot.chunk_ids[i]), float(scores[i])) for i in top if scores[i] > 0]
        rows = self.lookup([cid for cid, _ in hits])
        out = []
        for cid, score in hits:
            row = rows.get(cid)
            if row is None or row.get("status") != "ready":
                continue
            out.append(NodeWithScore(node=node_from_row(row), score=score))
        return out

    def scores_of(self, scores: np.ndarray, chunk_ids: list[str]) -> dict[str, float]:
        """The real BM25 score of given chunks (0.0 for a chunk the snapshot does not hold)."""
        pos = self.snapshot.positions([int(c) for c in chunk_ids])
        return {c: (float(scores[p]) if p >= 0 else 0.0) for c, p in zip(chunk_ids, pos)}

    def coverage(self, query: str, chunk_id: str) -> float:
        """idf-weighted share of the query's indexed tokens that occur in the chunk (0–1)."""
        p = int(self.snapshot.positions([int(chunk_id)])[0])
        ids = sorted(set(self.bm25.get_tokens_ids(self.tokenizer(query))))
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
    """Owns the current snapshot: rebuild from stored tokens, persist, load, soft-delete.

    Readers take `self.snapshot` (an attribute read is atomic), so a rebuild never blocks questions.
    """

    def __init__(self, persist_dir: Path, token_source: Callable[[], Iterable[tuple[int, list[str]]]]):
        self.persist_dir = Path(persist_dir)
        self.token_source = token_source
        self.snapshot = BM25Snapshot(None, np.zeros(0, dtype=np.int64), 1.5, 0.75)
        self.deleted: set[int] = set()
        self._lock = threading.Lock()
        self.last_build_ms = 0.0

    def rebuild(self, k1: float, b: float, persist: bool = True) -> BM25Snapshot:
        with self._lock:
            t0 = time.perf_counter()
            snap = build_snapshot(self.token_source(), k1, b)
            self.snapshot = snap
            self.deleted = set()
            self.last_build_ms = (time.perf_counter() - t0) * 1000
            if persist:
                self._persist(snap)
            log.info("BM25 rebuilt: %d chunks in %.0f ms", snap.size, self.last_build_ms)
            return snap

    def soft_delete(self, chunk_ids: Iterable[int]) -> None:
        self.deleted = self.deleted | set(int(c) for c in chunk_ids)

    def _persist(self, snap: BM25Snapshot) -> None:
        tmp = self.persist_dir.with_name(self.persist_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if snap.bm25 is not None:
            snap.bm25.save(str(tmp))
        np.save(tmp / "chunk_ids.npy", snap.chunk_ids)
        (tmp / "meta.json").write_text(json.dumps({"k1": snap.k1, "b": snap.b, "size": snap.size}))
        shutil.rmtree(self.persist_dir, ignore_errors=True)
        tmp.rename(self.persist_dir)

    def load_or_rebuild(self, k1: float, b: float, expected_ids: set[int]) -> str:
        """Load the persisted index when it matches the ready chunks and k1/b; else rebuild. Returns how."""
        try:
            meta = json.loads((self.persist_dir / "meta.json").read_text())
            ids = np.load(self.persist_dir / "chunk_ids.npy")
            if (meta["k1"] == k1 and meta["b"] == b and set(ids.tolist()) == expected_ids):
                bm = bm25s.BM25.load(str(self.persist_dir)) if len(ids) else None
                self.snapshot = BM25Snapshot(bm, ids.astype(np.int64), k1, b)
                return "loaded"
        except (OSError, ValueError, KeyError):
            pass
        self.rebuild(k1, b)
        return "rebuilt"

    def retriever(self, tokenizer: ChineseTokenizer, lookup: ChunkLookup, top_k: int) -> JiebaBM25Retriever | None:
        """A retriever over the current snapshot (None while the index is empty)."""
        snap = self.snapshot
        if snap.bm25 is None or snap.size == 0:
            return None
        return JiebaBM25Retriever(snap, tokenizer, lookup, similarity_top_k=min(top_k, snap.size),
                                  mask_out=self.deleted)


class LiveBM25Retriever(BaseRetriever):
    """The BM25 route as a long-lived retriever: always searches the index's current snapshot.

    BM25Index swaps snapshots on rebuild and grows its soft-delete set on delete; the inner
    JiebaBM25Retriever is re-made only when either changed, not per question.
    """

    def __init__(self, index: BM25Index, tokenizer: ChineseTokenizer, lookup: ChunkLookup, top_k: int):
        self._index = index
        self._tokenizer = tokenizer
        self._lookup = lookup
        self._top_k = top_k
        self._cached: tuple[object, frozenset[int], JiebaBM25Retriever | None] | None = None
        super().__init__()

    def _current(self) -> JiebaBM25Retriever | None:
        snap, deleted = self._index.snapshot, frozenset(self._index.deleted)
        cached = self._cached
        if cached is None or cached[0] is not snap or cached[1] != deleted:
            cached = (snap, deleted, self._index.retriever(self._tokenizer, self._lookup, self._top_k))
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
