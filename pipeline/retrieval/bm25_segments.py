"""Immutable BM25 segments: term frequencies of a set of chunks, on disk, opened memory-mapped.

A segment stores what Lucene's BM25 needs *before* corpus statistics enter: per term the chunks holding it and
how often (a CSC matrix: `indptr` by term, `docs` = position in the segment, `tfs`), each chunk's length in
tokens and its chunk_id. IDF and the average length are not baked in (bm25s bakes them into its score matrix,
so an index built in parts would score with the statistics of each part): `SegmentView` in bm25.py sums the
statistics of every segment at question time, so a knowledge base in ten segments scores exactly as one full
build over the same chunks.

Terms are kept sorted in one UTF-8 blob with offsets, found by bisection: nothing is decoded when a segment is
opened, so opening a million-chunk segment costs a few file maps, not a vocabulary load.

Files of a segment folder: chunk_ids.npy (int64, ascending), lengths.npy (int32), indptr.npy (int64),
docs.npy (int32), tfs.npy (uint16), terms.npy (uint8 blob), term_offsets.npy (int64).
"""
from __future__ import annotations

import bisect
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_ARRAYS = ("chunk_ids", "lengths", "indptr", "docs", "tfs", "terms", "term_offsets")


class Terms(Sequence):
    """Sorted terms in a UTF-8 blob (term i = blob[offsets[i]:offsets[i + 1]]), searchable by bisection."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray):
        self.blob, self.offsets = blob, offsets
        # memoryviews of the (mapped) arrays: indexing them costs ~0.1 µs, a numpy memmap slice ~5 µs
        self._bytes = memoryview(np.ascontiguousarray(blob))
        self._at = memoryview(np.ascontiguousarray(offsets))

    @classmethod
    def of(cls, sorted_terms: Sequence[str]) -> "Terms":
        encoded = [t.encode("utf-8") for t in sorted_terms]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.raw(i).decode("utf-8")

    def raw(self, i: int) -> bytes:
        return self._bytes[self._at[i]:self._at[i + 1]].tobytes()

    def find(self, term: str) -> int:
        """The term's id, −1 when the segment does not hold it. Bisection on the UTF-8 bytes: their order is the
        code points' order, the order the terms were sorted in."""
        key = term.encode("utf-8")
        i = bisect.bisect_left(_RawView(self), key)
        return i if i < len(self) and self.raw(i) == key else -1


class _RawView(Sequence):
    def __init__(self, terms: Terms):
        self.terms = terms

    def __len__(self) -> int:
        return len(self.terms)

    def __getitem__(self, i):
        return self.terms.raw(i)


@dataclass(frozen=True, eq=False)
class Segment:
    name: str
    chunk_ids: np.ndarray   # int64, ascending: position in the segment → chunk_id
    lengths: np.ndarray     # int32: tokens per chunk
    indptr: np.ndarray      # int64: term id → its postings [indptr[t], indptr[t + 1])
    docs: np.ndarray        # int32: posting → position in the segment
    tfs: np.ndarray         # uint16: posting → term frequency
    terms: Terms

    @property
    def size(self) -> int:
        return int(len(self.chunk_ids))

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(positions, term frequencies) of the chunks holding `term`, None when none does."""
        t = self.terms.find(term)
        if t < 0:
            return None
        s, e = int(self.indptr[t]), int(self.indptr[t + 1])
        return self.docs[s:e], self.tfs[s:e]

    def locate(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Position of each chunk_id in this segment, −1 where it holds none."""
        q = np.asarray(chunk_ids, dtype=np.int64)
        if not self.size:
            return np.full(len(q), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.chunk_ids, q), self.size - 1)
        return np.where(self.chunk_ids[at] == q, at, -1)

    # --- building --------------------------------------------------------------------------------------
    @classmethod
    def build(cls, name: str, items: Iterable[tuple[int, list[str]]]) -> "Segment":
        """A segment over (chunk_id, tokens); a chunk_id given twice keeps its last tokens. An empty token list
        counts as one empty token, as the bm25s build did (length 1, so no chunk has length 0)."""
        by_id = {int(c): (t or [""]) for c, t in items}
        ids = np.fromiter(sorted(by_id), dtype=np.int64, count=len(by_id))
        toks = [by_id[int(c)] for c in ids]
        lengths = np.fromiter((len(t) for t in toks), dtype=np.int32, count=len(toks))
        vocab: dict[str, int] = {}
        tids = np.fromiter((vocab.setdefault(t, len(vocab)) for doc in toks for t in doc), dtype=np.int64,
                           count=int(lengths.sum()))
        terms = sorted(vocab)
        rank = np.empty(len(vocab), dtype=np.int64)
        rank[np.fromiter((vocab[t] for t in terms), dtype=np.int64, count=len(terms))] = np.arange(len(terms))
        doc = np.repeat(np.arange(len(ids), dtype=np.int64), lengths)
        return cls._from_pairs(name, ids, lengths, rank[tids], doc, np.ones(len(tids), dtype=np.int64),
                               Terms.of(terms))

    @classmethod
    def _from_pairs(cls, name: str, ids: np.ndarray, lengths: np.ndarray, term: np.ndarray, doc: np.ndarray,
                    count: np.ndarray, terms: Terms) -> "Segment":
        """From (term rank, position, count) triples, in any order and with repeats (summed)."""
        n = max(len(ids), 1)
        key, inv = np.unique(term * n + doc, return_inverse=True)
        tf = np.bincount(inv.ravel(), weights=count, minlength=len(key))
        term_of = key // n
        indptr = np.searchsorted(term_of, np.arange(len(terms) + 1)).astype(np.int64)
        return cls(name, ids, lengths.astype(np.int32), indptr, (key % n).astype(np.int32),
                   np.minimum(tf, np.iinfo(np.uint16).max).astype(np.uint16), terms)

    @classmethod
    def merge(cls, name: str, parts: list[tuple["Segment", np.ndarray]]) -> "Segment":
        """One segment holding the kept chunks of several: `parts` = (segment, boolean keep mask). A chunk_id
        kept in two parts keeps the later part's entry (parts in manifest order: later ones are newer)."""
        kept = [np.flatnonzero(keep) for _, keep in parts]
        ids = np.concatenate([s.chunk_ids[k] for (s, _), k in zip(parts, kept)] or [np.zeros(0, dtype=np.int64)])
        order = np.argsort(ids, kind="stable")  # equal ids stay in part order: the last one is the newest
        last = np.ones(len(ids), dtype=bool)
        last[:-1] = ids[order][1:] != ids[order][:-1]
        chosen = order[last]  # one entry per id, ascending by id
        new_pos = np.full(len(ids), -1, dtype=np.int64)
        new_pos[chosen] = np.arange(len(chosen))
        union = sorted(set().union(*(s.terms[:] for s, _ in parts)))
        where = {t: i for i, t in enumerate(union)}
        lengths = np.zeros(len(chosen), dtype=np.int32)
        terms, docs, counts = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
        at = 0
        for (seg, _), k in zip(parts, kept):
            pos = np.full(seg.size, -1, dtype=np.int64)  # old position → new position (−1: dropped)
            pos[k] = new_pos[at:at + len(k)]
            at += len(k)
            lengths[pos[pos >= 0]] = seg.lengths[pos >= 0]
            seg_rank = np.fromiter((where[t] for t in seg.terms[:]), dtype=np.int64, count=len(seg.terms))
            p = pos[seg.docs]
            live = p >= 0
            terms.append(np.repeat(seg_rank, np.diff(seg.indptr))[live])
            docs.append(p[live])
            counts.append(seg.tfs[live].astype(np.float64))
        used, term = np.unique(np.concatenate(terms), return_inverse=True)  # terms only dropped chunks held go
        return cls._from_pairs(name, ids[chosen], lengths, term.ravel(), np.concatenate(docs),
                               np.concatenate(counts), Terms.of([union[i] for i in used]))

    # --- disk ------------------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """Written into a temporary folder and renamed: a reader never opens a half-written segment. Not synced
        to disk: a segment lost in a crash is written again from the stored tokens (BM25Index.sync)."""
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        arrays = {"chunk_ids": self.chunk_ids, "lengths": self.lengths, "indptr": self.indptr, "docs": self.docs,
                  "tfs": self.tfs, "terms": self.terms.blob, "term_offsets": self.terms.offsets}
        for key, arr in arrays.items():
            np.save(tmp / f"{key}.npy", np.ascontiguousarray(arr))
        os.replace(tmp, folder)

    @classmethod
    def open(cls, folder: Path) -> "Segment":
        a = {k: np.load(folder / f"{k}.npy", mmap_mode="r") for k in _ARRAYS}
        return cls(folder.name, a["chunk_ids"], a["lengths"], a["indptr"], a["docs"], a["tfs"],
                   Terms(a["terms"], a["term_offsets"]))
