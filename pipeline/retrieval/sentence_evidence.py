"""Sentence-level evidence for the no-answer gate: the question's best cosine against single sentences.

A chunk's vector averages 300 characters: an out-of-KB question about the same kind of thing (another fish's body
length, another bus route's hours) scores about as high against it as the question the chunk answers. Against the
chunk's sentences one at a time, the sentence that states the answer stands out more. The gate asks for this only
when its cheap inputs leave the outcome open (pipeline/retrieval/gate.py), so most questions never pay for it;
when asked, it embeds the sentences of the fused top-3 chunks with the loaded embedding model (≈ 7 ms a sentence
on 2 cores, ~6 sentences a chunk) and keeps their vectors in a bounded cache, so the background probes, a
repeated question or a follow-up over the same chunks do not embed them again.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.generation.sentences import split_sentences
from pipeline.models.vectors import unit

TOP_CHUNKS = 3  # the fused top-3, the same chunks the gate's lexical coverage reads


def chunk_sentences(text: str) -> list[str]:
    """The sentences of a chunk with their closing punctuation (all of them: a heading can be what matches)."""
    return [p.text + p.punct for p in split_sentences(text)] or [text.strip() or " "]


class SentenceEvidence:
    """best(query_embedding, nodes): max cosine of the question against the sentences of the top chunks."""

    def __init__(self, embed_model: Any, top: int = TOP_CHUNKS, cache_size: int = 20_000):
        self.embed_model = embed_model
        self.top = top
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def best(self, query_embedding: Sequence[float] | None, nodes: Sequence[Any]) -> float | None:
        if query_embedding is None or not nodes:
            return None
        sentences = [s for n in list(nodes)[: self.top] for s in chunk_sentences(n.node.get_content())]
        return float((self._vectors(sentences) @ unit(query_embedding)).max()) if sentences else None

    def _vectors(self, sentences: list[str]) -> np.ndarray:
        """Unit vectors of the sentences, in order: cached ones as they are, the rest embedded in one batch."""
        wanted = list(dict.fromkeys(sentences))
        with self._lock:
            have = {s: self._cache[s] for s in wanted if s in self._cache}
            for s in have:
                self._cache.move_to_end(s)
        missing = [s for s in wanted if s not in have]
        if missing:
            have.update(zip(missing, unit(self.embed_model.get_text_embedding_batch(missing))))
            with self._lock:
                for s in missing:
                    self._cache[s] = have[s]
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return np.vstack([have[s] for s in sentences])
