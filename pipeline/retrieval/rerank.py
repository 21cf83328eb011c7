"""Cross-encoder rerank stage that can never fail retrieval.

Wraps LlamaIndex's SentenceTransformerRerank. No model configured → stage skipped ("未配置精排模型，已跳过");
a model that raises at run time → RRF order kept, stage marked fallback with the reason.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Optional

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import PrivateAttr

log = logging.getLogger(__name__)

SKIPPED_MSG = "未配置精排模型，已跳过"


def load_cross_encoder(model_dir: Path, top_n: int):
    """SentenceTransformerRerank over a local cross-encoder directory (imports torch lazily)."""
    from llama_index.postprocessor.sbert_rerank import SentenceTransformerRerank

    return SentenceTransformerRerank(model=str(model_dir), top_n=top_n, device="cpu", keep_retrieval_score=True)


class SafeRerank(BaseNodePostprocessor):
    """Rerank the first `candidates` nodes to `top_n`; record what happened in `last_status`."""

    top_n: int = 6
    candidates: int = 20
    _inner: Optional[object] = PrivateAttr(default=None)
    _model_label: str = PrivateAttr(default="")
    _lock: object = PrivateAttr(default_factory=threading.Lock)
    _last_status: dict = PrivateAttr(default_factory=dict)

    def __init__(self, inner=None, model_label: str = "", top_n: int = 6, candidates: int = 20):
        super().__init__(top_n=top_n, candidates=candidates)
        self._inner = inner
        self._model_label = model_label

    @classmethod
    def class_name(cls) -> str:
        return "SafeRerank"

    @property
    def available(self) -> bool:
        return self._inner is not None

    @property
    def last_status(self) -> dict:
        return self._last_status

    @property
    def model_label(self) -> str:
        return self._model_label

    def rerank(self, nodes: list[NodeWithScore], query: str, top_n: int | None = None,
               candidates: int | None = None) -> tuple[list[NodeWithScore], dict]:
        """Returns (top_n nodes, status). Per-call sizes keep concurrent questions independent."""
        top_n = top_n or self.top_n
        pool = nodes[: max(candidates or self.candidates, top_n)]
        if self._inner is None:
            return pool[:top_n], {"status": "skipped", "msg": SKIPPED_MSG}
        if not pool:
            return [], {"status": "ok", "msg": self._model_label}
        try:
            # Score all candidates (top_n=len) and cut ourselves: the inner top_n is shared state.
            with self._lock:
                self._inner.top_n = len(pool)
                ranked = self._inner.postprocess_nodes(pool, query_bundle=QueryBundle(query))
            return ranked[:top_n], {"status": "ok", "msg": self._model_label}
        except Exception as exc:  # retrieval must survive a broken reranker
            log.warning("rerank failed, keeping RRF order: %s", exc)
            return pool[:top_n], {"status": "fallback", "msg": f"精排失败，已按 RRF 顺序：{exc}"}

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> list[NodeWithScore]:
        ranked, status = self.rerank(nodes, query_bundle.query_str if query_bundle else "")
        self._last_status = status
        return ranked
