"""BM25 route: Lucene BM25 over the jieba tokens stored at ingest, kept in segments on disk (bm25_segments.py).

Out of the box llama-index's BM25Retriever tokenizes with an English regex + stemmer (Chinese scores 0.0) and
rebuilds its bm25s matrix from the whole corpus for every change. Here a knowledge base's index is a list of
immutable segments named in a manifest (one folder per knowledge base, in the shared files dir of a team
deployment, so every process opens the same files):

- a document about to turn 就绪 becomes one small segment (`add_ready`), written before the ready mark, so it
  is searchable from that moment; a chunk whose tokens change (an edit) gets a new entry and its old one is
  marked replaced in the manifest (Lucene's update = delete + add);
- what is searchable is the ready set in the database: entries of chunks no longer ready (deleted documents,
  old versions, switched-off chunks) are masked per process, and `sync` — on load and whenever the KB
  generation moves — opens segments other processes added and builds one for ready chunks no segment holds
  (a crash between the two writes, an old data dir). Both cost what changed, not the corpus;
- segments of one size tier are merged in the background once there are MERGE_FACTOR of them, dropping dead
  entries, so the count stays logarithmic in the corpus;
- scores use the statistics of every live entry together (N, document frequency, average length), computed at
  question time, so they equal one full build over the same chunks (test_bm25_segments), at every moment.

One manifest writer at a time across processes (an exclusive file lock around read-modify-write); readers
open segments memory-mapped, so a restart over a million chunks opens files instead of re-indexing.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.bm25_segments import Segment
from pipeline.retrieval.in_flight import lower_this_thread
from pipeline.retrieval.lexical import TermWeights, content_terms
from pipeline.retrieval.nodes import ChunkLookup, node_from_row, retrievable

log = logging.getLogger(__name__)

MERGE_FACTOR = 8        # this many segments of one size tier are merged into one
TIER_BASE = 256         # tier of a segment: ⌊log_MERGE_FACTOR(size / TIER_BASE)⌋ (sizes up to TIER_BASE: tier 0)
MAX_MERGED = 300_000    # a merge writes at most this many chunks (bounds the merging process's memory)
BUILD_BATCH = 50_000    # a full build writes segments of at most this many chunks (bounds its token lists)
DEAD_SHARE = 0.3        # a segment with this share of dead entries is rewritten without them
CACHED_POSTINGS = 4_000_000  # per view: postings kept for the next questions (~32–48 MB at most)
OPEN_CHECKS = 16        # live entries compared with the database's tokens when a process opens the folder
FROM_ALL = 0.3          # missing chunks above this share of the ready set: stream every token row, not by id

TokenSource = Callable[[Collection[int] | None], Iterable[tuple[int, list[str]]]]


def _ids(values: Iterable[int]) -> np.ndarray:
    arr = np.fromiter((int(v) for v in values), dtype=np.int64)
    arr.sort()
    return arr


class SegmentView:
    """What one question scores: segments, which entries are live, k1/b. Immutable once published (a change
    publishes a new view), so readers never lock; its identity keys what is derived from it (gate background,
    a filter's allowed ids)."""

    def __init__(self, segments: tuple[Segment, ...], alive: tuple[np.ndarray, ...], k1: float, b: float,
                 generation: int = 0):
        self.segments, self.alive, self.k1, self.b, self.generation = segments, alive, k1, b, generation
        self.offsets = np.zeros(len(segments) + 1, dtype=np.int64)
        np.cumsum([s.size for s in segments], out=self.offsets[1:])
        self._all_alive = [bool(a.all()) for a in alive]
        self.n = int(sum(int(a.sum()) for a in alive))
        self.total_len = int(sum(int(s.lengths[a].sum()) for s, a in zip(segments, alive)))
        self._terms = _TermCache()  # term → (df, [(score positions, contributions)])
        self._chunk_ids: np.ndarray | None = None
        self._weights: TermWeights | None = None

    @classmethod
    def empty(cls, k1: float = 1.5, b: float = 0.75) -> "SegmentView":
        return cls((), (), k1, b)

    @property
    def size(self) -> int:
        """Score positions (live or not): segment after segment."""
        return int(self.offsets[-1])

    @property
    def chunk_ids(self) -> np.ndarray:
        """chunk_id of each score position."""
        if self._chunk_ids is None:
            self._chunk_ids = (np.concatenate([s.chunk_ids for s in self.segments]) if self.segments
                               else np.zeros(0, dtype=np.int64))
        return self._chunk_ids

    def parts(self) -> list[np.ndarray]:
        """The chunk_ids array of each segment, in score order (what is mapped once per segment, not per view)."""
        return [s.chunk_ids for s in self.segments]

    def live_ids(self) -> set[int]:
        return set(np.concatenate([s.chunk_ids[a] for s, a in zip(self.segments, self.alive)]
                                  or [np.zeros(0, dtype=np.int64)]).tolist())

    def with_dead(self, chunk_ids: Iterable[int]) -> "SegmentView":
        """This view with these chunks' entries dead (a soft delete or a replaced entry)."""
        q = _ids(chunk_ids)
        alive = []
        for seg, a in zip(self.segments, self.alive):
            loc = seg.locate(q)
            loc = loc[loc >= 0]
            if len(loc) and a[loc].any():
                a = a.copy()
                a[loc] = False
            alive.append(a)
        return SegmentView(self.segments, tuple(alive), self.k1, self.b, self.generation)

    # --- statistics and scoring ----------------------------------------------------------------------
    def doc_freq(self, term: str) -> int:
        return self.contributions(term)[0]

    def idf(self, df: int) -> float:
        return math.log(1.0 + (self.n - df + 0.5) / (df + 0.5))

    def weights(self) -> TermWeights:
        """IDF per token over the live entries (lexical.TermWeights)."""
        if self._weights is None:
            self._weights = _ViewWeights(self)
        return self._weights

    def contributions(self, term: str) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
        """(document frequency among live entries, [(score positions, this term's BM25 contribution there)]).
        Fixed for the view's lifetime (N, df, average length and k1/b are), so computed once per term and kept, up
        to CACHED_POSTINGS postings (least recently used first out): questions share their common words."""
        got = self._terms.get(term)
        if got is not None:
            return got
        parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        for i, (seg, a) in enumerate(zip(self.segments, self.alive)):
            p = seg.postings(term)
            if p is None:
                continue
            if self._all_alive[i]:
                docs, tfs = p  # slices of the mapped files: no copy
            else:
                keep = a[p[0]]
                docs, tfs = p[0][keep], p[1][keep]
            if len(docs):
                parts.append((i, docs, tfs))
        df = sum(len(docs) for _, docs, _ in parts)
        out: list[tuple[np.ndarray, np.ndarray]] = []
        if df:
            idf, avg, k1, b = self.idf(df), self.total_len / self.n, self.k1, self.b
            for i, docs, tfs in parts:
                tf = tfs.astype(np.float32)
                norm = k1 * ((1 - b) + b * self.segments[i].lengths[docs].astype(np.float32) / avg)
                pos = docs.astype(np.int64) + self.offsets[i] if self.offsets[-1] > 2**31 - 1 else \
                    docs.astype(np.int32) + np.int32(self.offsets[i])
                out.append((pos, (idf * tf / (norm + tf)).astype(np.float32)))
        got = (df, out)
        self._terms.put(term, got, df)
        return got

    def scores(self, tokens: list[str]) -> np.ndarray:
        """Lucene BM25 of every position for these query tokens (repeats count, as in bm25s); dead ones 0."""
        out = np.zeros(self.size, dtype=np.float32)
        if not self.n:
            return out
        for term in tokens:
            for pos, contrib in self.contributions(term)[1]:
                out[pos] += contrib
        return out

    def positions(self, chunk_ids: list[int]) -> np.ndarray:
        """Score position of each chunk's live entry, −1 where none is live."""
        q = np.asarray(chunk_ids, dtype=np.int64)
        out = np.full(len(q), -1, dtype=np.int64)
        for i, (seg, a) in enumerate(zip(self.segments, self.alive)):
            loc = seg.locate(q)
            ok = loc >= 0
            ok[ok] = a[loc[ok]]
            out[ok] = self.offsets[i] + loc[ok]
        return out

    def coverage(self, tokens: list[str], pos: int) -> float:
        """idf-weighted share of the query's indexed terms that occur in the chunk at position `pos` (0–1)."""
        total = found = 0.0
        for term in set(tokens):
            df, parts = self.contributions(term)
            if not df:
                continue
            idf = self.idf(df)
            total += idf
            if any(_holds(at, pos) for at, _ in parts):
                found += idf
        return found / total if total > 0 else 0.0


class _TermCache:
    """term → value, least recently used out first once the values hold more than CACHED_POSTINGS postings."""

    def __init__(self):
        self._items: OrderedDict[str, tuple[object, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, term: str):
        with self._lock:
            got = self._items.get(term)
            if got is None:
                return None
            self._items.move_to_end(term)
            return got[0]

    def put(self, term: str, value, postings: int) -> None:
        with self._lock:
            if term in self._items:
                return
            self._items[term] = (value, postings)
            self._held += postings
            while self._held > CACHED_POSTINGS and len(self._items) > 1:
                self._held -= self._items.popitem(last=False)[1][1]


class _ViewWeights(TermWeights):
    def __init__(self, view: SegmentView):
        self.view = view
        self.n = max(view.n, 1)
        self.max_idf = self._idf(0)

    def df_of(self, token: str) -> int:
        return self.view.doc_freq(token)


class SegmentDir:
    """One knowledge base's folder: manifest.json (segments in publish order, each with the chunk ids a newer
    entry replaced), manifest.lock, segments/<name>/. Opened segments are kept by name."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._open: dict[str, Segment] = {}
        self._open_lock = threading.Lock()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes and threads (flock holds per open file, so two opens in one process
        exclude each other too)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "manifest.lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def read(self) -> list[dict]:
        try:
            return json.loads((self.root / "manifest.json").read_text())["segments"]
        except (OSError, ValueError, KeyError):
            return []

    def listed(self) -> tuple[list[dict], list[Segment]]:
        """Under the lock: the manifest's entries and their opened segments. An entry whose files cannot be read
        (a crash mid-write, a disk error) is left out: its chunks are ready chunks no segment holds, which the
        next sync writes again from the stored tokens (the database is the source of truth, so no fsync)."""
        entries, segments = [], []
        listed = self.read()
        for e in listed:
            try:
                segments.append(self.segment(e["name"]))
                entries.append(e)
            except (OSError, ValueError, EOFError) as exc:
                log.warning("BM25 segment %s unreadable (%s): its chunks are written again", e["name"], exc)
        if len(entries) < len(listed):
            self.write(entries)
        return entries, segments

    def write(self, entries: list[dict]) -> None:
        tmp = self.root / "manifest.json.tmp"
        tmp.write_text(json.dumps({"segments": entries}))
        os.replace(tmp, self.root / "manifest.json")
        self._collect({e["name"] for e in entries})

    def segment(self, name: str) -> Segment:
        with self._open_lock:
            seg = self._open.get(name)
            if seg is None:
                seg = self._open[name] = Segment.open(self.root / "segments" / name)
            return seg

    def save(self, seg: Segment) -> None:
        seg.save(self.root / "segments" / seg.name)

    def _collect(self, listed: set[str]) -> None:
        """Remove what no manifest names any more (under the lock: every save is listed before it is released).
        A process still reading a removed segment keeps its mapped files until it lets go of them."""
        with self._open_lock:
            for name in [n for n in self._open if n not in listed]:
                self._open.pop(name)
        folder = self.root / "segments"
        for p in folder.iterdir() if folder.exists() else ():
            if p.name not in listed:
                shutil.rmtree(p, ignore_errors=True)
        for old in ("meta.json", "chunk_ids.npy", "params.index.json", "vocab.index.json", "data.csc.index.npy",
                    "indices.csc.index.npy", "indptr.csc.index.npy", "nonoccurrence_array.index.npy"):
            (self.root / old).unlink(missing_ok=True)  # the single bm25s build of earlier releases


def _holds(positions: np.ndarray, pos: int) -> bool:
    """Is `pos` among these sorted score positions (a term's postings keep their segment's order)?"""
    i = int(np.searchsorted(positions, pos))
    return i < len(positions) and int(positions[i]) == pos


def new_name() -> str:
    return f"{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:8]}"


def batched_segments(items: Iterable[tuple[int, list[str]]]) -> Iterator[Segment]:
    """Segments of at most BUILD_BATCH chunks over these (chunk_id, tokens), built as the items stream in."""
    batch: list[tuple[int, list[str]]] = []
    for item in items:
        batch.append(item)
        if len(batch) >= BUILD_BATCH:
            yield Segment.build(new_name(), batch)
            batch = []
    if batch:
        yield Segment.build(new_name(), batch)


def tier(size: int) -> int:
    return 0 if size <= TIER_BASE else int(math.log(size / TIER_BASE, MERGE_FACTOR))


class BM25Index:
    """One knowledge base's keyword index: the published view, and the segment folder it comes from.

    `sync(ready_ids)` is the one way to follow what is 就绪 (load, another process's change, a drained queue);
    `add_ready` and `replace` write new entries; `soft_delete` masks entries at once (until the next sync, which
    reads the ready set itself); `rebuild` writes everything anew (tokens rewritten in place by a repair).
    """

    def __init__(self, persist_dir: Path, token_source: TokenSource, merges: bool = True):
        self.persist_dir = Path(persist_dir)
        self.merges = merges  # False in a process that only answers (--role web): the ingesting ones merge
        self.dir = SegmentDir(self.persist_dir)
        self.token_source = token_source  # chunk ids (None: every ready chunk) → (chunk_id, tokens), by id
        self._view = SegmentView.empty()
        self._lock = threading.Lock()  # publishing a view; _pending
        self._pending: set[int] = set()  # written by add_ready here, not seen 就绪 yet: kept live meanwhile
        self._generation = 0
        self._merging: threading.Thread | None = None
        self._discarded = False
        self.last_build_ms = 0.0

    @property
    def view(self) -> SegmentView:
        return self._view

    def _publish(self, segments, alive, k1=None, b=None) -> SegmentView:
        """Under self._lock."""
        self._generation += 1
        v = self._view
        self._view = SegmentView(tuple(segments), tuple(alive), v.k1 if k1 is None else k1,
                                 v.b if b is None else b, self._generation)
        return self._view

    def set_params(self, k1: float, b: float) -> None:
        """BM25 parameters act at question time: no rebuild."""
        with self._lock:
            v = self._view
            self._publish(v.segments, v.alive, k1, b)

    # --- following the ready set ---------------------------------------------------------------------
    def open(self, k1: float, b: float, ready_ids: Collection[int]) -> str:
        """At load: the segments on disk, plus a segment for ready chunks none holds. Segments that do not match
        the database's tokens (a folder left by another database: chunk ids are that database's) are written
        anew. Returns what it did."""
        self.set_params(k1, b)
        done = self.sync(ready_ids)
        if self._foreign():
            log.warning("BM25 segments in %s do not match the stored tokens: rebuilding them", self.persist_dir)
            self.rebuild()
            return "rebuilt"
        return done

    def _foreign(self) -> bool:
        """Compare the length of OPEN_CHECKS live entries, spread over the index, with their stored tokens."""
        v = self._view
        live = np.flatnonzero(np.concatenate(v.alive)) if v.segments else np.zeros(0, dtype=np.int64)
        if not len(live):
            return False
        pos = live[np.linspace(0, len(live) - 1, min(OPEN_CHECKS, len(live))).astype(np.int64)]
        ids = v.chunk_ids[pos]
        stored = dict(self.token_source(ids.tolist()))
        for p, cid in zip(pos.tolist(), ids.tolist()):
            i = int(np.searchsorted(v.offsets, p, side="right")) - 1
            if len(stored.get(cid) or [""]) != int(v.segments[i].lengths[p - v.offsets[i]]):
                return True
        return False

    def sync(self, ready_ids: Collection[int], settled: Collection[int] = ()) -> str:
        """Make the live entries exactly the ready chunks: open segments other processes wrote, write one for
        ready chunks no segment holds, mask the rest. Entries this process's ingest wrote stay live until their
        document is `settled` (ready, or failed). Returns "followed", or "added N" when it wrote one."""
        ready = _ids(ready_ids)
        done = "followed"
        with self.dir.locked():
            entries, segments = self.dir.listed()
            held = [s.chunk_ids[~np.isin(s.chunk_ids, e.get("replaced", []))] for s, e in zip(segments, entries)]
            missing = np.setdiff1d(ready, np.concatenate(held) if held else np.zeros(0, dtype=np.int64),
                                   assume_unique=True)
            if len(missing) and not self._discarded:
                t0 = time.perf_counter()
                for seg in self._build(missing, len(ready)):
                    self._append(entries, segments, seg)
                self.dir.write(entries)
                self.last_build_ms = (time.perf_counter() - t0) * 1000
                done = f"added {len(missing)}"
                log.info("BM25 segment: %d ready chunks no segment held, written in %.0f ms", len(missing),
                         self.last_build_ms)
            with self._lock:  # still under the folder lock: a write of this process cannot land in between
                self._pending -= set(settled)
                live = np.union1d(ready, _ids(self._pending))
                alive = [np.isin(s.chunk_ids, live) & ~np.isin(s.chunk_ids, e.get("replaced", []))
                         for s, e in zip(segments, entries)]
                self._publish(segments, alive)
        self._merge_soon()
        return done

    def open_listed(self) -> int:
        """Take the manifest's segments as they are now, before the ready set is read (`sync` then masks exactly):
        a document another process just made 就绪 is searchable in this process after one manifest read, not
        after reading the whole ready set (seconds at a million chunks). Segments new to this process are live
        — as an ingest's own entries are before their ready mark; the retriever drops rows not 就绪 — and
        segments merged away elsewhere leave the view. Returns how many segments were new."""
        with self.dir.locked(), self._lock:
            entries, segments = self.dir.listed()
            v = self._view
            known = {s.name: a for s, a in zip(v.segments, v.alive)}
            if not segments or all(s.name in known for s in segments) and len(segments) == len(known):
                return 0
            alive = [known[s.name] if s.name in known else ~np.isin(s.chunk_ids, e.get("replaced", []))
                     for s, e in zip(segments, entries)]
            self._publish(segments, alive)
            return sum(s.name not in known for s in segments)

    def follow_ingest(self, ready_ids: Collection[int]) -> str:
        """This process's ingest queue drained: its documents are in segments already (add_ready); what else
        changed (an old version left the ready set) is followed by `sync`."""
        with self._lock:
            done = set(self._pending)  # an ingest starting meanwhile adds to _pending: its entries stay live
        return self.sync(ready_ids, settled=done)

    def _build(self, chunk_ids: np.ndarray, ready_count: int) -> Iterator[Segment]:
        """Segments of at most BUILD_BATCH chunks over these chunks' stored tokens."""
        want = None if len(chunk_ids) > FROM_ALL * max(ready_count, 1) else chunk_ids.tolist()
        wanted = set(chunk_ids.tolist()) if want is None else None
        yield from batched_segments(item for item in self.token_source(want) if wanted is None or item[0] in wanted)

    def _append(self, entries: list[dict], segments: list[Segment], seg: Segment) -> None:
        """Under the folder lock: save `seg`, list it last, mark its chunk ids replaced in older entries."""
        self.dir.save(seg)
        for e, old in zip(entries, segments):
            loc = old.locate(seg.chunk_ids)
            again = old.chunk_ids[loc[loc >= 0]]
            if len(again):
                e["replaced"] = sorted(set(e.get("replaced", [])) | set(again.tolist()))
        entries.append({"name": seg.name, "size": seg.size})
        segments.append(seg)
        self.dir.segment(seg.name)  # the saved files, memory-mapped, replace the built arrays

    # --- writing entries --------------------------------------------------------------------------------
    def add_ready(self, items: list[tuple[int, list[str]]]) -> None:
        """Chunks of a document about to be marked 就绪 (called before mark_ready, on the ingest worker): one
        new segment, live here at once (the retriever still drops rows that are not 就绪)."""
        self._write(items, pending=True)

    def replace(self, items: list[tuple[int, list[str]]]) -> None:
        """Chunks whose stored tokens changed (an edit, a restore): new entries; the old ones never match
        again, here at once and in other processes from their next sync."""
        self._write(items, pending=False)

    def _write(self, items: list[tuple[int, list[str]]], pending: bool) -> None:
        if not items or self._discarded:
            return
        seg = Segment.build(new_name(), items)
        with self.dir.locked():
            entries, segments = self.dir.listed()
            self._append(entries, segments, seg)
            self.dir.write(entries)
            seg = self.dir.segment(seg.name)
            with self._lock:  # under the folder lock: a sync reading the manifest comes wholly before or after
                if pending:
                    self._pending |= set(seg.chunk_ids.tolist())
                v = self._view.with_dead(seg.chunk_ids.tolist())
                self._publish(v.segments + (seg,), v.alive + (np.ones(seg.size, dtype=bool),))
        log.info("BM25 segment: %d chunks added", seg.size)
        self._merge_soon()

    def soft_delete(self, chunk_ids: Iterable[int]) -> None:
        """Out of this process's results now (the database change follows; the next sync reads it)."""
        with self._lock:
            v = self._view.with_dead(chunk_ids)
            self._publish(v.segments, v.alive)

    def rebuild(self, k1: float | None = None, b: float | None = None) -> SegmentView:
        """Every ready chunk written anew from its stored tokens (a repair re-tokenized chunks in place)."""
        t0 = time.perf_counter()
        ready = self.token_source(None)
        with self.dir.locked():
            entries: list[dict] = []
            segments: list[Segment] = []
            if not self._discarded:
                for seg in batched_segments(ready):
                    self._append(entries, segments, seg)
                self.dir.write(entries)
            with self._lock:
                self._pending.clear()
                v = self._publish(segments, [np.ones(s.size, dtype=bool) for s in segments], k1, b)
        self.last_build_ms = (time.perf_counter() - t0) * 1000
        log.info("BM25 rebuilt: %d chunks in %.0f ms", v.n, self.last_build_ms)
        return v

    # --- merging --------------------------------------------------------------------------------------
    def _merge_plan(self, view: SegmentView) -> list[int] | None:
        """Indexes (in the view) of the segments to merge next: MERGE_FACTOR of the smallest full tier, or one
        segment whose dead share passed DEAD_SHARE."""
        by_tier: dict[int, list[int]] = {}
        for i, (s, a) in enumerate(zip(view.segments, view.alive)):
            if s.size and (s.size - int(a.sum())) / s.size >= DEAD_SHARE:
                return [i]
            by_tier.setdefault(tier(s.size), []).append(i)
        for t in sorted(by_tier):
            group = by_tier[t]
            if len(group) >= MERGE_FACTOR and sum(view.segments[i].size for i in group) <= MAX_MERGED:
                return group
        return None

    def _merge_soon(self) -> None:
        with self._lock:
            if not self.merges or self._merging is not None and self._merging.is_alive() or self._discarded:
                return
            if self._merge_plan(self._view) is None:
                return
            self._merging = threading.Thread(target=self._merge_all, name="bm25-merge", daemon=True)
            self._merging.start()

    def _merge_all(self) -> None:
        lower_this_thread()
        try:
            while not self._discarded:
                view = self._view
                plan = self._merge_plan(view)
                if plan is None or not self._merge(view, plan):
                    return
        except Exception:
            log.exception("BM25 merge failed")

    def _merge(self, view: SegmentView, plan: list[int]) -> bool:
        """Merge the live entries of these segments into one; False when the folder changed under it."""
        t0 = time.perf_counter()
        inputs = [view.segments[i] for i in plan]
        names = {s.name for s in inputs}
        merged = Segment.merge(new_name(), [(view.segments[i], view.alive[i]) for i in plan])
        with self.dir.locked():
            entries = self.dir.read()
            if not names <= {e["name"] for e in entries} or self._discarded:
                return False  # another process merged or rebuilt meanwhile: plan again on the new view
            late = set().union(*(e.get("replaced", []) for e in entries if e["name"] in names))
            at = min(i for i, e in enumerate(entries) if e["name"] in names)
            kept = [e for e in entries if e["name"] not in names]
            if merged.size:  # only dead entries: the inputs just go
                self.dir.save(merged)
                entry = {"name": merged.name, "size": merged.size}
                again = sorted(late & set(merged.chunk_ids.tolist()))
                if again:
                    entry["replaced"] = again
                kept.insert(at, entry)
            self.dir.write(kept)
            with self._lock:  # under the folder lock, as every publish that follows the manifest
                v = self._view
                live = set().union(*(s.chunk_ids[a].tolist() for s, a in zip(v.segments, v.alive) if s.name in names))
                rest = [(s, a) for s, a in zip(v.segments, v.alive) if s.name not in names]
                if merged.size:
                    merged = self.dir.segment(merged.name)
                    pos = min([i for i, s in enumerate(v.segments) if s.name in names] or [len(rest)])
                    rest.insert(pos, (merged, np.isin(merged.chunk_ids,
                                                      np.fromiter(live, dtype=np.int64, count=len(live)))))
                self._publish([s for s, _ in rest], [a for _, a in rest])
        log.info("BM25 segment: merged %d segments into one of %d chunks in %.0f ms", len(inputs), merged.size,
                 (time.perf_counter() - t0) * 1000)
        return True

    # --- lifecycle and audit ------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        """No merge runs (scores are exact at every moment; this says the segment folder is not about to change)."""
        return self._merging is None or not self._merging.is_alive()

    def wait_idle(self, timeout: float = 30.0) -> None:
        t = self._merging
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def discard(self, timeout: float = 30.0) -> None:
        """The knowledge base is being deleted: nothing is written from now on (the caller removes the folder)."""
        self._discarded = True
        self.wait_idle(timeout)

    def indexed_ids(self) -> set[int]:
        """Chunk ids BM25 can find now (live entries): what the audit compares."""
        return self._view.live_ids()

    def persisted_ids(self) -> set[int]:
        """Chunk ids the segments on disk hold (what the next start opens; empty when there are none)."""
        out: set[int] = set()
        try:
            for e in self.dir.read():
                ids = np.load(self.persist_dir / "segments" / e["name"] / "chunk_ids.npy", mmap_mode="r")
                out |= set(ids.tolist()) - set(e.get("replaced", []))
        except (OSError, ValueError):
            pass
        return out

    def retriever(self, tokenizer: ChineseTokenizer, lookup: ChunkLookup, top_k: int) -> "JiebaBM25Retriever | None":
        """A retriever over the current view (None while it holds nothing)."""
        v = self._view
        return JiebaBM25Retriever(v, tokenizer, lookup, top_k) if v.size else None


class JiebaBM25Retriever(BaseRetriever):
    """llama-index's BM25 retriever contract (`retrieve(query)` → top-k nodes by Lucene BM25) over one view,
    with the query tokenized by our Chinese tokenizer and hits mapped to ready chunk rows."""

    def __init__(self, view: SegmentView, tokenizer: ChineseTokenizer, lookup: ChunkLookup, similarity_top_k: int = 50):
        self.view = view
        self.tokenizer = tokenizer
        self.lookup = lookup
        self.similarity_top_k = similarity_top_k
        super().__init__()

    def query_scores(self, query: str) -> np.ndarray:
        return self.view.scores(self.tokenizer(query))

    def restrict(self, scores: np.ndarray, allowed) -> np.ndarray:
        """The scores with every chunk outside a filter's allowed set zeroed (pipeline/retrieval/doc_filter.py):
        `hits` then takes its top-k among the allowed chunks only."""
        keep = allowed.keep(self.view.parts())
        return np.where(keep, scores, 0.0).astype(scores.dtype, copy=False)

    def hits(self, scores: np.ndarray) -> list[NodeWithScore]:
        """The top `similarity_top_k` chunks with a positive score, as ready nodes."""
        chunk_ids = self.view.chunk_ids
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
            if retrievable(row):
                out.append(NodeWithScore(node=node_from_row(row), score=score))
        return out

    def holds(self, chunk_id: int) -> bool:
        return int(self.view.positions([int(chunk_id)])[0]) >= 0

    def scores_of(self, scores: np.ndarray, chunk_ids: list[str]) -> dict[str, float]:
        """The real BM25 score of given chunks (0.0 for a chunk no live entry holds)."""
        pos = self.view.positions([int(c) for c in chunk_ids])
        return {c: (float(scores[p]) if p >= 0 else 0.0) for c, p in zip(chunk_ids, pos)}

    def coverage(self, query: str, chunk_id: str) -> float:
        """idf-weighted share of the query's indexed tokens that occur in the chunk (0–1)."""
        p = int(self.view.positions([int(chunk_id)])[0])
        return self.view.coverage(self.tokenizer(query), p) if p >= 0 else 0.0

    def visible_share(self, query: str) -> float:
        """IDF-weighted share of the query's content words that occur in some chunk of this index (a word no chunk
        holds weighs the most): the part of the question the keyword route can see at all."""
        return self.view.weights().visible_share(content_terms(self.tokenizer(query)))

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.hits(self.query_scores(query_bundle.query_str))


class LiveBM25Retriever(BaseRetriever):
    """The BM25 route as a long-lived retriever: always searches the index's current view (a retriever over it
    is made once per view, not per question)."""

    def __init__(self, index: BM25Index, tokenizer: ChineseTokenizer, lookup: ChunkLookup, top_k: int):
        self._index = index
        self._tokenizer = tokenizer
        self._lookup = lookup
        self._top_k = top_k
        self._cached: tuple[SegmentView, JiebaBM25Retriever | None] | None = None
        super().__init__()

    def _current(self) -> JiebaBM25Retriever | None:
        view = self._index.view
        cached = self._cached
        if cached is None or cached[0] is not view:
            cached = (view, self._index.retriever(self._tokenizer, self._lookup, self._top_k))
            self._cached = cached  # one attribute write: concurrent readers see an old or a new pair
        return cached[1]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        inner = self._current()
        return inner.retrieve(query_bundle) if inner is not None else []

    # Full-information fusion (pipeline.retrieval.fusion.HybridRetriever): the whole-corpus scores of one
    # query, its top list from them, and the real score of any other chunk — one scoring pass per question.
    def query_scores(self, query: str) -> tuple[JiebaBM25Retriever, np.ndarray] | None:
        """(the view's retriever, its scores for the query), or None while the index is empty. The retriever is
        handed back so the list and the completion read the same view."""
        inner = self._current()
        return None if inner is None else (inner, inner.query_scores(query))
