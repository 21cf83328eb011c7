"""The best sentence of a formal document quoted with the whole article it belongs to.

A regulation decides a question in one article, and its clauses lean on each other: 「软件的合法复制品所有人享有下列
权利：……（二）为了防止复制品损坏而制作备份复制品。这些备份复制品不得通过任何方式提供给他人使用……」 — quoted alone,
the sentence the picker likes best (「这些备份复制品不得…提供给他人使用」) reads as a prohibition, while the article
allows the backup; an exemption (「但是…除外」) or the figure (「前款结算起点定为1000元」) often sits one sentence away.
Articles are short (the regulations corpus: median 95 characters, 96 % at most 300), so the extractive answer
quotes the best sentence's article whole, its deciding clause still bold, and the other picked sentences of that
article are not repeated. What the chunk holds of the article is what is quoted: from the chunk's start when the
article began in an earlier chunk, up to its last whole sentence when it goes on in the next one. An article longer
than ARTICLE_CHARS, a best sentence not found verbatim in its chunk (re-joined wrapped lines), and the sentences of
other documents are quoted as before.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pipeline.generation.articles import DIVISION, HEADING, LEADING_HEADING
from pipeline.retrieval.nodes import node_text

ARTICLE_CHARS = 300  # longer articles are quoted by their sentences (96 % of the corpus's articles are shorter);
                     # a whole article's line is not cut at extractive.MAX_SENTENCE_CHARS
# where an article ends inside a chunk: the next article heading, or a chapter / section heading line
_END = re.compile(f"{HEADING.pattern}|{DIVISION.pattern}", re.M)
_BREAKS = re.compile(r"\s*\n\s*")
_CLOSING = "。！？!?；;"


def article_span(text: str, at: int) -> tuple[int, int]:
    """[start, end) of the article around position `at` of a chunk's text: from the last article heading at or
    before it (the chunk's start when the article began in an earlier chunk) to the next heading."""
    start = 0
    for m in HEADING.finditer(text):
        if m.start() > at:
            break
        start = m.start()
    nxt = next((m.start() for m in _END.finditer(text, at + 1)), len(text))
    return start, nxt


def with_article(best: Any, bold: tuple[int, int] | None, node: Any) -> tuple[Any, tuple[int, int] | None] | None:
    """(the best candidate carrying its whole article as its text, the bold span moved into it), or None when the
    article is not to be quoted whole (too long, not found verbatim, nothing beyond the sentence itself)."""
    text = node_text(node)
    sentence = best.piece.text
    at = text.find(sentence)
    if at < 0 or not sentence:
        return None
    a, b = article_span(text, at)
    raw = text[a:b].strip()
    head = LEADING_HEADING.match(raw)
    body = raw[head.end():] if head else raw
    article = _BREAKS.sub("", body)  # its paragraphs (款) on one line: the answer quotes one line per article
    # up to its last whole sentence (the chunk may end inside one when the article goes on in the next chunk)
    end = max(article.rfind(ch) for ch in _CLOSING)
    if end < 0:
        return None
    article, punct = article[:end], article[end]
    offset = article.find(sentence)
    if offset < 0 or len(article) > ARTICLE_CHARS or len(article) <= len(sentence) + 1:
        return None
    moved = (bold[0] + offset, bold[1] + offset) if bold is not None else (offset, offset + len(sentence))
    piece = replace(best.piece, text=article, punct=punct if punct not in "；;" else "。")
    return replace(best, piece=piece, lead="", whole_article=True), moved


def quote_article(sentences: Sequence[Any], best: Any, bold: tuple[int, int] | None,
                  nodes: Sequence[Any]) -> tuple[list[Any], Any, tuple[int, int] | None]:
    """The picked sentences with the best one replaced by its whole article (when `with_article` allows) and the
    others of that article dropped; unchanged otherwise. Only for a formal document (its chunk has 第…条 headings)."""
    if best is None or not best.formal or not best.cite:  # no article named: a preamble, a title, a cut
        return list(sentences), best, bold
    got = with_article(best, bold, nodes[best.source - 1])
    if got is None:
        return list(sentences), best, bold
    whole, moved = got
    inside = _flat(whole.piece.text)
    # a sentence that opens its article holds the heading the article's text has dropped
    return [whole if c is best else c for c in sentences
            if c is best or _flat(LEADING_HEADING.sub("", c.piece.text)) not in inside], whole, moved


def _flat(text: str) -> str:
    return "".join(text.split())
