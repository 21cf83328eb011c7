"""Which article (第…条) of a formal document a sentence belongs to, and the citation naming it: 《…》第十九条.

Laws, regulations and contracts number their articles with a heading at the start of a line, 「第十九条 …」 (the
regulations corpus: 6247 of 6247 headings so). Only the first paragraph (款) of an article carries it, so a
sentence belongs to the last heading before it in the chunk. A chunk that starts inside an article (a long one cut
in two) takes the article from the earlier chunks of its document when the reader can read them (carried_article);
nothing is guessed across a chapter heading. A 「第十一条」 inside a sentence (「依照本条例第十一条的规定」) is a
cross-reference, not a heading: only a line start followed by a space counts.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.generation.sentences import Piece

NUMERALS = "一二三四五六七八九十百千零〇"  # how articles are numbered: 第二十二条
HEADING = re.compile(rf"^[ \t\u3000]*(第[{NUMERALS}\d]+条(?:之[{NUMERALS}]+)?)(?=[ \t\u3000])", re.M)
LEADING_HEADING = re.compile(rf"^\s*第[{NUMERALS}\d]+条(?:之[{NUMERALS}]+)?[ \t\u3000]+")  # a sentence that opens its article
_DATED = re.compile(r"\s*[（(]\d{4}[-.年]\d{1,2}[-.月]\d{1,2}日?[)）]$")  # 「人民币管理条例(2018-03-19)」
_EXT = re.compile(r"\.(?:txt|md|pdf|docx|xlsx|csv)$", re.I)


def articles_of(text: str, pieces: Sequence[Piece]) -> dict[int, str]:
    """piece position → the article heading it sits under, for pieces under one (found by walking the pieces
    through the chunk text in order)."""
    heads = [(m.start(), m.group(1)) for m in HEADING.finditer(text or "")]
    if not heads:
        return {}
    out: dict[int, str] = {}
    cursor, h = 0, -1
    for p in pieces:
        at = text.find(p.text[:12], cursor)
        if at < 0:
            continue  # re-joined wrapped lines: the piece is not verbatim in the text; leave it unnamed
        cursor = at
        while h + 1 < len(heads) and heads[h + 1][0] <= at:
            h += 1
        if h >= 0:
            out[p.position] = heads[h][1]
    return out


# a chapter / section heading line: an article does not run on across it
DIVISION = re.compile(rf"^[ \t\u3000]*(?:#|第[{NUMERALS}\d]+[编章节][ \t\u3000])", re.M)


def carried_article(head: str, earlier: Sequence[str]) -> str:
    """The article a chunk's first lines belong to when the chunk starts inside it (a long article cut in two):
    the last heading of the nearest earlier chunk that has one. `head`: the chunk's text before the sentence;
    `earlier`: the texts of the chunks before it, nearest first. Nothing when a chapter heading or an article
    heading stands between."""
    if HEADING.search(head) or DIVISION.search(head):
        return ""
    for text in earlier:
        heads = HEADING.findall(text)
        last_division = max((m.start() for m in DIVISION.finditer(text)), default=-1)
        if heads:
            last = list(HEADING.finditer(text))[-1]
            return last.group(1) if last.start() > last_division else ""
        if last_division >= 0:
            return ""
    return ""


def title_of(doc_name: str | None) -> str:
    """The document's name as a reader cites it: file extension and a trailing date in brackets dropped."""
    return _DATED.sub("", _EXT.sub("", (doc_name or "").strip())).strip()


def citation(doc_name: str | None, article: str) -> str:
    """「《人民币管理条例》第二十二条」; the article alone when the document has no name."""
    if not article:
        return ""
    title = title_of(doc_name)
    return f"《{title}》{article}" if title else article
