"""Character-based Chinese chunking (`split_text`), under the structured chunker of ingest.

SentenceSplitter counts tiktoken tokens (~0.64 Chinese chars per token) and cuts at English punctuation; the
settings contract says chunk_size / chunk_overlap are *characters*. It:
- never emits a chunk longer than `chunk_size` characters;
- cuts after a sentence end (。！？；… and their ASCII forms, or a newline) whenever one falls in the window,
  else at a weaker boundary (，、：space), else hard at chunk_size;
- starts the next chunk ≤ `chunk_overlap` characters back, at a sentence start when one exists in that window;
- never crosses a page, so every chunk has one page number; is deterministic.
Python strings are code-point sequences, so a cut can never split a surrogate pair.
"""
from __future__ import annotations

import re

_STRONG = re.compile(r"(?:[。！？；!?;…]+[”’」』）)\"']*|\n+)")
_WEAK = re.compile(r"[，,、：:\s]")


def _boundaries(text: str) -> list[int]:
    return [m.end() for m in _STRONG.finditer(text)]


def split_text(text: str, chunk_size: int, chunk_overlap: int) -> list[tuple[int, int]]:
    """Return (start, end) character spans of the chunks of `text` (whitespace-trimmed, non-empty)."""
    if chunk_overlap >= chunk_size:
        raise ValueError("chunk_overlap must be smaller than chunk_size")
    n = len(text)
    bounds = _boundaries(text)
    spans: list[tuple[int, int]] = []
    s = 0
    bi = 0  # index into bounds: first boundary > s
    while s < n:
        while s < n and text[s].isspace():
            s += 1
        if s >= n:
            break
        limit = s + chunk_size
        if limit >= n:
            end = n
        else:
            end = None
            while bi < len(bounds) and bounds[bi] <= s:
                bi += 1
            j = bi
            while j < len(bounds) and bounds[j] <= limit:
                end = bounds[j]
                j += 1
            if end is None or end - s < chunk_size // 3:
                # No sentence end in a useful place: fall back to the last weak boundary, then a hard cut.
                weak = None
                for m in _WEAK.finditer(text, s + chunk_size // 2, limit):
                    weak = m.end()
                end = weak if weak and (end is None or weak > end) else (end or limit)
        # trim trailing whitespace
        e = end
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            spans.append((s, e))
        if end >= n:
            break
        # overlap: go back at most chunk_overlap chars, preferring a sentence start
        nxt = end
        if chunk_overlap > 0:
            window_start = max(s + 1, end - chunk_overlap)
            cand = [b for b in bounds if window_start <= b < end]
            nxt = cand[0] if cand else window_start
        s = max(nxt, s + 1)
    return spans
