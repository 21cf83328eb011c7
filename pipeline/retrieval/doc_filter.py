"""Filters on document tags and metadata: what the doors accept, and how both routes apply them.

A question's filter is an explicit argument next to its knowledge bases. It is resolved once per question in SQL
to the allowed documents (store.doc_tags.DocTagStore.allowed: one small query over document rows); then
- the BM25 route scores the whole index as always and zeroes every chunk of another document before taking its
  top-k (`Allowed.keep`: the document of each score position comes from `ChunkDocs`, learned once per index
  segment — reading the allowed chunk ids per question cost ~1 µs a row, 7 ms for 5,000), and
- the vector route asks Chroma for the top-k among the allowed chunks (their ids, `AllowedChunkIds`; `where` on
  doc_id past a bound), so the ANN search ranks allowed chunks only,
both before the fusion. A filter therefore never comes back empty because the unfiltered top-k held other
documents.

The accepted shape (REST `filter`, /v1 `kbqa_filter`, MCP `filter`, the chat's tag picker):
    {"tags_any": [..], "tags_all": [..], "metadata": {"key": "value"}, "date_from": "YYYY-MM-DD",
     "date_to": "YYYY-MM-DD"}
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np

from pipeline.errors import CODE_VALIDATION, EngineError
from store.doc_tags import AUTO_KEYS, DocFilter

__all__ = ["AUTO_KEYS", "Allowed", "AllowedChunkIds", "ChunkDocs", "DocFilter", "clean_metadata", "clean_tags", "parse_filter"]

MAX_TAG = 50
MAX_TAGS = 50
MAX_KEY = 50
MAX_VALUE = 500
MAX_KEYS = 50
_FIELDS = {"tags_any", "tags_all", "metadata", "date_from", "date_to"}


def _bad(msg: str, field: str = "filter") -> EngineError:
    return EngineError(CODE_VALIDATION, msg, field)


def clean_tags(tags: Any, field: str = "tags") -> list[str]:
    """Tags as stored: trimmed, inner whitespace collapsed, blanks and duplicates dropped, sorted. A string is a
    comma-separated list (an upload form's field)."""
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = tags.replace("，", ",").split(",")
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags):
        raise _bad(f"{field} 必须是标签列表", field)
    out = sorted({" ".join(t.split()) for t in tags} - {""})
    if len(out) > MAX_TAGS or any(len(t) > MAX_TAG for t in out):
        raise _bad(f"{field} 过长（最多 {MAX_TAGS} 个标签，每个最多 {MAX_TAG} 字）", field)
    return out


def clean_metadata(meta: Any, field: str = "metadata") -> dict[str, str]:
    """Metadata as stored: {key: value} of text (numbers become text); automatic keys cannot be set."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _bad(f"{field} 必须是键值对象", field)
    out: dict[str, str] = {}
    for k, v in meta.items():
        key = " ".join(str(k).split())
        if not key or len(key) > MAX_KEY:
            raise _bad(f"{field} 的键不能为空，最多 {MAX_KEY} 字", field)
        if key in AUTO_KEYS:
            raise _bad(f"{field} 的键「{key}」由系统自动生成，不能设置", field)
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise _bad(f"{field}.{key} 必须是文本或数字", field)
        value = str(v).strip()
        if len(value) > MAX_VALUE:
            raise _bad(f"{field}.{key} 过长（最多 {MAX_VALUE} 字）", field)
        out[key] = value
    if len(out) > MAX_KEYS:
        raise _bad(f"{field} 最多 {MAX_KEYS} 个键", field)
    return out


def _date(v: Any, name: str) -> date | None:
    if v in (None, ""):
        return None
    try:
        return date.fromisoformat(str(v)[:10])
    except ValueError:
        raise _bad(f"filter.{name} 必须是日期 YYYY-MM-DD") from None


def parse_filter(raw: Any) -> DocFilter | None:
    """A door's filter value → DocFilter, or None when there is none (None, {}, or only empty parts)."""
    if raw is None or isinstance(raw, DocFilter):
        return None if raw is None or raw.empty else raw
    if not isinstance(raw, dict):
        raise _bad("filter 必须是对象：{tags_any, tags_all, metadata, date_from, date_to}")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise _bad(f"filter 不认识的字段：{', '.join(sorted(unknown))}（可用 {', '.join(sorted(_FIELDS))}）")
    meta = raw.get("metadata") or {}
    if not isinstance(meta, dict):
        raise _bad("filter.metadata 必须是键值对象")
    pairs = []
    for k, v in meta.items():
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise _bad(f"filter.metadata.{k} 必须是文本或数字")
        pairs.append((" ".join(str(k).split()), str(v).strip()))
    f = DocFilter(tags_any=tuple(clean_tags(raw.get("tags_any"), "filter.tags_any")),
                  tags_all=tuple(clean_tags(raw.get("tags_all"), "filter.tags_all")),
                  meta=tuple(sorted(pairs)), date_from=_date(raw.get("date_from"), "date_from"),
                  date_to=_date(raw.get("date_to"), "date_to"))
    if f.date_from and f.date_to and f.date_from > f.date_to:
        raise _bad("filter.date_from 不能晚于 date_to")
    return None if f.empty else f


class ChunkDocs:
    """doc_id of BM25 score positions. A chunk never moves to another document and chunk ids are never reused,
    so what is learned stays true: each segment's positions are mapped once (its chunk_ids array, one range
    read of the chunk table), and a segment outlives many views."""

    SEGMENTS = 256  # mapped segments kept (a few per knowledge base, plus the ones a merge just replaced)

    def __init__(self, fetch: Callable[[np.ndarray], np.ndarray]):
        self._fetch = fetch  # chunk ids → doc ids (−1: gone); store.doc_tags.DocTagStore.doc_ids_of
        self._parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(chunk_ids) → (chunk_ids, doc_ids)
        self._lock = threading.Lock()

    def of_part(self, chunk_ids: np.ndarray) -> np.ndarray:
        got = self._parts.get(id(chunk_ids))
        if got is not None and got[0] is chunk_ids:
            return got[1]
        docs = self._fetch(np.asarray(chunk_ids))
        with self._lock:
            if len(self._parts) >= self.SEGMENTS:
                self._parts.pop(next(iter(self._parts)))
            self._parts[id(chunk_ids)] = (chunk_ids, docs)  # holding the array keeps its id unique
        return docs


@dataclass
class Allowed:
    """What a filter lets one question search: the allowed documents per knowledge base, their chunk count."""

    doc_ids: dict[int, list[int]]
    chunk_count: int
    chunk_docs: ChunkDocs | None = field(default=None, repr=False)

    def docs_in(self, kb_id: int) -> list[int]:
        return self.doc_ids.get(int(kb_id), [])

    @property
    def all_doc_ids(self) -> list[int]:
        return sorted(d for ids in self.doc_ids.values() for d in ids)

    def keep(self, parts: list[np.ndarray]) -> np.ndarray:
        """Which BM25 score positions (segment after segment: `parts` are their chunk_ids arrays) belong to an
        allowed document."""
        allowed = np.asarray(self.all_doc_ids, dtype=np.int64)
        docs = [self.chunk_docs.of_part(p) for p in parts]
        return np.isin(np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64), allowed)


class AllowedChunkIds:
    """The retrievable chunk ids of a filter's documents in one knowledge base, as the strings Chroma takes, kept
    until that KB's BM25 view is replaced. Every change of what is searchable, here or in another
    process, ends in a new view (pipeline/services/changes.py), the same signal the gate background follows; reading
    the ids per question was most of a filter's cost (5,000 ids: ~10 ms of SQL and conversion, the ids-restricted
    ANN query itself ~2 ms more than an open one; docs/benchmarks.md). Between a change and its new view a cached
    list can be stale, which costs nothing wrong: every hit is looked up and dropped unless retrievable, and an id
    whose vector is gone makes the route fall back to `where`. A chunk that became retrievable meanwhile is found
    once the view follows, as on the BM25 route."""

    MAX_IDS = 400_000  # ids kept over all entries (~25 MB of strings); the oldest entries go first

    def __init__(self, fetch: Callable[[list[int]], list[int]], snapshot: Callable[[int], object]):
        self._fetch = fetch        # doc ids → retrievable chunk ids (store.documents.DocumentStore)
        self._snapshot = snapshot  # kb_id → that KB's current BM25 view
        self._cache: dict[tuple[int, tuple[int, ...]], tuple[object, list[str]]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def of(self, kb_id: int, doc_ids: list[int]) -> list[str]:
        key = (int(kb_id), tuple(sorted(int(d) for d in doc_ids)))
        snap = self._snapshot(kb_id)
        got = self._cache.get(key)
        if got is not None and got[0] is snap:
            return got[1]
        ids = [str(i) for i in self._fetch(list(key[1]))]
        if len(ids) > self.MAX_IDS:
            return ids  # too many to keep: the others stay cached
        with self._lock:
            old = self._cache.pop(key, None)
            self._held -= len(old[1]) if old else 0
            while self._cache and self._held + len(ids) > self.MAX_IDS:
                self._held -= len(self._cache.pop(next(iter(self._cache)))[1])
            self._cache[key] = (snap, ids)  # holding the view keeps its identity unique
            self._held += len(ids)
        return ids
