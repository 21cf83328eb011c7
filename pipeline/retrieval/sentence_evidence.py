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

from collections.abc import Sequence
from typing import Any

from pipeline.generation.sentences import split_sentences
from pipeline.models.vectors import TextVectors, unit

TOP_CHUNKS = 3  # the fused top-3, the same chunks the gate's lexical coverage reads


def chunk_sentences(text: str) -> list[str]:
    """The sentences of a chunk with their closing punctuation (all of them: a heading can be what matches)."""
    return [p.text + p.punct for p in split_sentences(text)] or [text.strip() or " "]


class SentenceEvidence:
    """best(query_embedding, nodes): max cosine of the question against the sentences of the top chunks."""

    def __init__(self, vectors: TextVectors, top: int = TOP_CHUNKS):
        self.vectors = vectors  # kept per sentence text, shared with the extractive picker
        self.top = top

    def best(self, query_embedding: Sequence[float] | None, nodes: Sequence[Any]) -> float | None:
        if query_embedding is None or not nodes:
            return None
        sentences = [s for n in list(nodes)[: self.top] for s in chunk_sentences(n.node.get_content())]
        return float((self.vectors(sentences) @ unit(query_embedding)).max()) if sentences else None
