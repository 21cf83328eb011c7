"""Cross-encoder rerank stage that can never fail retrieval.

`SafeRerank` is a LlamaIndex node postprocessor: callers use its public `postprocess_nodes(nodes, query_bundle)`.
It keeps the first `candidates` fused nodes, reranks them to `top_n`, and writes what happened into every
returned node's metadata (`rerank_status`, `rerank_msg`, `rerank_score`):
- no model configured → stage skipped (「未配置精排模型，已跳过」), fused order kept;
- a model that raises at run time → fused order kept, status fallback with the reason.
The loaded model (`CrossEncoder`) is shared; SafeRerank itself is cheap and rebuilt when the sizes change.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import Field, PrivateAttr

log = logging.getLogger(__name__)

SKIPPED_MSG = "未配置精排模型，已跳过"
STATUS_KEYS = ("rerank_status", "rerank_msg", "rerank_score")


@dataclass
class CrossEncoder:
    """A loaded cross-encoder (LlamaIndex SentenceTransformerRerank) and the lock around its shared top_n."""

    inner: Any
    label: str
    lock: threading.Lock = field(default_factory=threading.Lock)


def load_cross_encoder(model_dir: Path, top_n: int) -> CrossEncoder:
    """SentenceTransformerRerank over a local cross-encoder directory (imports torch lazily)."""
    from llama_index.postprocessor.sbert_rerank import SentenceTransformerRerank

    inner = SentenceTransformerRerank(model=str(model_dir), top_n=top_n, device="cpu", keep_retrieval_score=True)
    return CrossEncoder(inner, f"本地精排模型 {model_dir.name}")


def rerank_status(nodes: list[NodeWithScore], default: dict | None = None) -> dict:
    """The status SafeRerank stamped on its output ({status, msg}); `default` when there were no nodes."""
    if nodes and nodes[0].node.metadata.get("rerank_status"):
        m = nodes[0].node.metadata
        return {"status": m["rerank_status"], "msg": m.get("rerank_msg") or ""}
    return dict(default or {"status": "ok", "msg": ""})


class SafeRerank(BaseNodePostprocessor):
    """Rerank the first `candidates` nodes to `top_n`; never raises."""

    top_n: int = Field(6, description="nodes kept after rerank (final_top_k)", gt=0)
    candidates: int = Field(20, description="fused nodes given to the cross-encoder (rerank_candidates)", gt=0)
    _model: CrossEncoder | None = PrivateAttr(default=None)

    def __init__(self, model: CrossEncoder | None = None, top_n: int = 6, candidates: int = 20):
        super().__init__(top_n=top_n, candidates=candidates)
        self._model = model

    @classmethod
    def class_name(cls) -> str:
        return "SafeRerank"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        pool = list(nodes[: max(self.candidates, self.top_n)])
        if self._model is None:
            return _stamp(pool[: self.top_n], "skipped", SKIPPED_MSG, scored=False)
        if not pool:
            return []
        try:
            # Score all candidates (top_n = len) and cut ourselves: the inner top_n is shared by every SafeRerank.
            with self._model.lock:
                self._model.inner.top_n = len(pool)
                ranked = self._model.inner.postprocess_nodes(pool, query_bundle=query_bundle)
            return _stamp(ranked[: self.top_n], "ok", self._model.label, scored=True)
        except Exception as exc:  # retrieval must survive a broken reranker
            log.warning("rerank failed, keeping fused order: %s", exc)
            return _stamp(pool[: self.top_n], "fallback", f"精排失败，已按 RRF 顺序：{exc}", scored=False)


def _stamp(nodes: list[NodeWithScore], status: str, msg: str, scored: bool) -> list[NodeWithScore]:
    for n in nodes:
        n.node.metadata.update(rerank_status=status, rerank_msg=msg,
                               rerank_score=float(n.score) if scored and n.score is not None else None)
        for k in STATUS_KEYS:  # shown in the trace, never sent to the LLM or embedded
            if k not in n.node.excluded_llm_metadata_keys:
                n.node.excluded_llm_metadata_keys = [*n.node.excluded_llm_metadata_keys, k]
                n.node.excluded_embed_metadata_keys = [*n.node.excluded_embed_metadata_keys, k]
    return nodes
