"""The per-question outcomes of the formal-documents evaluation (tools/eval/formal_eval.py), on plain values.

Pure functions over what the answer path returns (`ask_sync`: answer text, sources, weak): no engine, no model, so
tests/test_formal_metrics.py checks every rule on tiny inputs.

- **span in sources**: the gold `span` is contained in a source's text once whitespace is removed from both (the
  regulations dev set's own rule, tools/eval/regulations_devset.norm; a span may run over a line break).
- **right document first**: source 1 is a chunk of the gold file.
- **answer-hit** (extractive): one line of the answer (label line dropped, ** and [n] removed) holds a contiguous
  run of at least ANSWER_SHARE of the span's content characters (CJK, letters, digits — punctuation and whitespace
  are dropped from both sides first, so 「、」 vs 「，」 or a cut at MAX_SENTENCE_CHARS does not decide). 1.0 is the
  whole span; 0.6 lets the answer quote the deciding clause of a span that runs over two sentences, but not a
  sentence that merely shares scattered words with it (contiguous, not a bag of characters). Fixed, not tuned.
- **bold-hit** (stricter): a bold run of the answer (the clause the picker judged deciding) holds ANSWER_SHARE of the
  span the same way. Answer-hit counts what is on screen — a whole article quoted holds its deciding clause whether
  or not the picker chose it; bold-hit counts what the picker chose.
- **refused**: the gate refused (no sources) or the answer says 「资料中未找到…」; **weak**: answered with the
  weak-evidence banner; **answered**: neither — for an unanswerable or off-topic question, answered as if.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from tools.eval.regulations_devset import norm

ANSWER_SHARE = 0.6
NOT_FOUND_MARK = "资料中未找到"  # pipeline.generation.extractive.NOT_FOUND_TEXT starts with it
_MARKS = re.compile(r"\*\*|\[\d{1,3}\]")
_NON_CONTENT = re.compile(r"[^\w]|_")  # \w in str patterns covers CJK, letters and digits


def content(text: str) -> str:
    """The characters that carry words: CJK, letters, digits (punctuation, whitespace and markup dropped)."""
    return _NON_CONTENT.sub("", _MARKS.sub("", text or ""))


def holds_span(text: str, span: str) -> bool:
    return bool(span) and norm(span) in norm(text or "")


def span_in_sources(sources: Sequence[dict], span: str, k: int = 6) -> bool:
    return any(holds_span(s.get("text", ""), span) for s in sources[:k])


def right_doc_first(sources: Sequence[dict], gold_doc_id: int | None) -> bool:
    return bool(sources) and gold_doc_id is not None and sources[0].get("doc_id") == gold_doc_id


def answer_lines(answer: str) -> list[str]:
    """The quoted lines of an answer: the label line (「原文摘录…：」) dropped, markup and citations removed."""
    lines = (answer or "").split("\n")[1:]
    return [s for s in (_MARKS.sub("", ln).lstrip("- ").strip() for ln in lines) if s]


def longest_common_run(a: str, b: str) -> int:
    """Length of the longest common substring (dynamic programming over one row; spans are ≤ 120 characters)."""
    if not a or not b:
        return 0
    best, prev = 0, [0] * (len(b) + 1)
    for ca in a:
        cur = [0] * (len(b) + 1)
        for j, cb in enumerate(b, start=1):
            if ca == cb:
                cur[j] = prev[j - 1] + 1
                if cur[j] > best:
                    best = cur[j]
        prev = cur
    return best


def span_share(line: str, span: str) -> float:
    """The longest run of the span's content characters found in the line, as a share of them."""
    s = content(span)
    return longest_common_run(s, content(line)) / len(s) if s else 0.0


def answer_hit(answer: str, span: str, share: float = ANSWER_SHARE) -> bool:
    if is_not_found(answer):
        return False
    return any(span_share(line, span) >= share for line in answer_lines(answer))


_BOLD = re.compile(r"\*\*(.+?)\*\*")


def bold_hit(answer: str, span: str, share: float = ANSWER_SHARE) -> bool:
    if is_not_found(answer):
        return False
    return any(span_share(bold, span) >= share for bold in _BOLD.findall(answer or ""))


def is_not_found(answer: str) -> bool:
    return NOT_FOUND_MARK in (answer or "")


def outcome(result: dict) -> str:
    """'refused' (gate: no sources, or 「资料中未找到」) / 'weak' / 'answered'."""
    if not result.get("sources") or is_not_found(result.get("answer", "")):
        return "refused"
    return "weak" if result.get("weak") else "answered"


def share_of(rows: Sequence[dict], key: str, value=True) -> float:
    return round(sum(1 for r in rows if r.get(key) == value) / len(rows), 4) if rows else 0.0
