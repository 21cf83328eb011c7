"""A small BM25 index over the chunks that became 就绪 since the last full build (READY MEANS SEARCHABLE).

bm25s has no incremental add, and a full rebuild at 50k chunks costs seconds, so the main index is rebuilt only
when the ingest queue drains. Without more, a document would read 就绪 while BM25 cannot find it for as long
as the rest of the queue ingests. The ingest worker therefore adds each document's stored tokens here *before*
it marks the document ready; the retriever scores this delta beside the main snapshot and merges by score;
the next full build folds it in.

Scores must be comparable with the main index's (a merge by score is meaningless otherwise): the delta is
scored with the same Lucene BM25 as bm25s, using the statistics of main + delta together (N, document
frequency per term, average length). A term only the delta holds thus gets the IDF it would get in a full
build, not the much smaller IDF a 20-document index would give it.

Append-only with a size watermark: the worker appends while questions read; a reader takes `size` first and
ignores later positions, so it never needs a lock.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np


class DeltaBM25:
    def __init__(self, items: Iterable[tuple[int, list[str]]] = ()):
        self.items: list[tuple[int, list[str]]] = []  # kept to carry entries over a fold (see BM25Index)
        self.chunk_ids: list[int] = []
        self.pos_of: dict[int, int] = {}  # chunk_id → position
        self.lengths: list[int] = []
        self.total_len = 0
        self.postings: dict[str, list[tuple[int, int]]] = {}  # term → [(position, term frequency)]
        self.size = 0
        self.add(items)

    def add(self, items: Iterable[tuple[int, list[str]]]) -> None:
        for chunk_id, tokens in items:
            tokens = tokens or [""]  # as build_snapshot: an empty chunk is one empty token (length 1)
            pos = len(self.chunk_ids)
            for term, tf in Counter(tokens).items():
                self.postings.setdefault(term, []).append((pos, tf))
            self.items.append((int(chunk_id), tokens))
            self.chunk_ids.append(int(chunk_id))
            self.pos_of[int(chunk_id)] = pos
            self.lengths.append(len(tokens))
            self.total_len += len(tokens)
            self.size = pos + 1  # published last: readers below this watermark see complete entries

    def scores(self, query_tokens: list[str], main_df, main_n: int, main_total_len: int,
               k1: float, b: float) -> tuple[np.ndarray, np.ndarray]:
        """(chunk_ids, scores) of the delta's chunks for these query tokens (repeats count, as in bm25s).

        main_df(term) → how many main-index chunks hold the term.
        """
        n = self.size
        if n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        lengths = np.asarray(self.lengths[:n], dtype=np.float32)
        total_n = main_n + n
        avg = (main_total_len + float(lengths.sum())) / total_n
        norm = k1 * ((1 - b) + b * lengths / avg)
        out = np.zeros(n, dtype=np.float32)
        for term in query_tokens:
            plist = [(p, tf) for p, tf in self.postings.get(term, ()) if p < n]
            if not plist:
                continue
            df = main_df(term) + len(plist)
            idf = math.log(1 + (total_n - df + 0.5) / (df + 0.5))
            pos = np.fromiter((p for p, _ in plist), dtype=np.int64, count=len(plist))
            tf = np.fromiter((t for _, t in plist), dtype=np.float32, count=len(plist))
            out[pos] += idf * tf / (norm[pos] + tf)
        return np.asarray(self.chunk_ids[:n], dtype=np.int64), out

    def coverage(self, query_tokens: list[str], pos: int, main_df, main_n: int) -> float:
        """idf-weighted share of the query's indexed terms that occur in the chunk at `pos` (0–1), with the
        same main + delta statistics as `scores` (the fusion's per-query features read it)."""
        n = self.size
        total_n = main_n + n
        total = found = 0.0
        for term in set(query_tokens):
            plist = [p for p, _ in self.postings.get(term, ()) if p < n]
            df = main_df(term) + len(plist)
            if not df:
                continue  # not an indexed term
            idf = math.log(1.0 + (total_n - df + 0.5) / (df + 0.5))
            total += idf
            if pos in plist:
                found += idf
        return found / total if total > 0 else 0.0
