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
        if not sentences:
            return None
        q = np.asarray(query_embedding, dtype=np.float32)
        q = q / (np.linalg.norm(q) + 1e-9)
        return float((self._vectors(sentences) @ q).max())

    def _vectors(self, sentences: list[str]) -> np.ndarray:
        with self._lock:
            missing = list(dict.fromkeys(s for s in sentences if s not in self._cache))
        if missing:
            got = np.asarray(self.embed_model.get_text_embedding_batch(missing), dtype=np.float32)
            got /= np.linalg.norm(got, axis=1, keepdims=True) + 1e-9
            with self._lock:
                for s, v in zip(missing, got):
                    self._cache[s] = v
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        with self._lock:
            out = []
            for s in sentences:
                v = self._cache.get(s)
                if v is None:  # evicted between the two steps by another thread's batch: embed it alone
                    v = np.asarray(self.embed_model.get_text_embedding_batch([s])[0], dtype=np.float32)
                    v = v / (np.linalg.norm(v) + 1e-9)
                else:
                    self._cache.move_to_end(s)
                out.append(v)
        return np.vstack(out)
