"""The last retrievals by (conversation, question), so 重试 regenerates an answer without retrieving again —
on any process.

The value is (the query rewrite, the RetrievalResult): a retried follow-up keeps the query it was answered with
(an LLM rewrite asked again could differ). Stored in the database (store/retrievals.py), not in process memory:
behind a load balancer the retry may reach another app process than the failed answer did. Only what a replay
shows is kept: the top rows of each route that the trace displays, and the final numbered sources in full. A
stored retrieval whose sources are no longer all 就绪 (a delete or re-processing raced with the answer) is not
replayed: the retry retrieves again.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, fields

from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.conversation.rewrite import Rewrite
from pipeline.events import TRACE_TOP
from pipeline.retrieval.nodes import retrievable
from pipeline.retrieval.result import RetrievalResult
from store.retrievals import RetrievalStore

log = logging.getLogger(__name__)

_LISTS = ("bm25", "vector", "fused")
# Every other plain field of RetrievalResult is kept, so fields added later replay too; the query embedding and
# the start time are only needed while retrieving.
_SCALARS = tuple(f.name for f in fields(RetrievalResult)
                 if f.name not in (*_LISTS, "final", "query", "query_embedding", "started"))


def _num(x):
    """JSON fallback for numpy scalars in scores/metadata."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def _node_out(n: NodeWithScore) -> dict:
    return {"id": n.node.node_id, "text": n.node.get_content(), "meta": dict(n.node.metadata), "score": n.score}


def _node_in(d: dict) -> NodeWithScore:
    meta = d["meta"]
    node = TextNode(id_=d["id"], text=d["text"], metadata=meta, excluded_embed_metadata_keys=list(meta),
                    excluded_llm_metadata_keys=list(meta))
    return NodeWithScore(node=node, score=d["score"])


def dumps(res: RetrievalResult) -> str:
    data = {k: [_node_out(n) for n in getattr(res, k)[:TRACE_TOP]] for k in _LISTS}
    data["final"] = [_node_out(n) for n in res.final]
    data.update({k: getattr(res, k) for k in _SCALARS})
    data["query"] = res.query
    return json.dumps(data, ensure_ascii=False, default=_num)


def loads(text: str) -> RetrievalResult:
    data = json.loads(text)
    res = RetrievalResult(query=data["query"], **{k: data[k] for k in _SCALARS if k in data})
    for k in (*_LISTS, "final"):
        setattr(res, k, [_node_in(d) for d in data[k]])
    return res


class StoredRetrievals:
    """get(key) → (Rewrite, RetrievalResult) | None, put(key, value), clear(); key = (conversation id, question)."""

    def __init__(self, store: RetrievalStore, lookup: Callable[[list[int]], dict[int, dict]]):
        self.store = store
        self.lookup = lookup  # chunk_ids → rows (store.documents.DocumentStore.get_chunks)

    @staticmethod
    def _key(key: Hashable) -> str:
        return json.dumps(list(key) if isinstance(key, Sequence) and not isinstance(key, str) else key,
                          ensure_ascii=False)

    def get(self, key: Hashable) -> tuple[Rewrite, RetrievalResult] | None:
        text = self.store.get(self._key(key))
        if text is None:
            return None
        try:
            data = json.loads(text)
            rw, res = Rewrite(**data["rewrite"]), loads(data["retrieval"])
        except (ValueError, KeyError, TypeError) as exc:  # written by another version: retrieve again
            log.warning("stored retrieval unreadable (%s); retrieving again", exc)
            return None
        ids = [int(n.node.node_id) for n in res.final]
        rows = self.lookup(ids) if ids else {}
        if any(not retrievable(rows.get(i)) for i in ids):
            return None  # a source was deleted, is being re-processed, or a newer version replaced it since
        return rw, res

    def put(self, key: Hashable, value: tuple[Rewrite, RetrievalResult]) -> None:
        rw, res = value
        self.store.put(self._key(key), json.dumps({"rewrite": asdict(rw), "retrieval": dumps(res)},
                                                  ensure_ascii=False))

    def copy(self, key: Hashable, to: Hashable) -> None:
        """What `key` holds also under `to` (a retry checks its sources when it reads it)."""
        self.store.copy(self._key(key), self._key(to))

    def clear(self) -> None:
        """After a delete or rebuild: stored retrievals may hold chunks that are gone."""
        self.store.clear()
