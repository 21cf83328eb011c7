"""Structure-aware chunking: sections follow headings, tables keep their rows whole and repeat their header.

A page without headings or tables (txt, PDF text layers) is cut exactly as `chunking.split_text` cuts it, unless it
is made of articles (below).
Otherwise the page is read as sections (a heading up to the next heading of any level). Prose inside a section
is cut with split_text and never crosses into the next section; each piece carries the section's heading path
as `context` (e.g. 「第二章 受理 › 第五条」), which is shown in the source card and embedded/indexed with the
chunk text. Prose made of articles (laws, regulations, contracts: lines opening with 「第…条」) is cut at article
starts: whole articles are packed into a piece up to `chunk_size`, and only an article longer than that is cut
inside (with the overlap) — a piece never starts in the middle of a rule or ends with half of the next one, so
what retrieval scores and what the answer quotes is one or a few whole rules (one article a piece was measured too:
docs/retrieval-eval.md). A table becomes pieces of whole rows, each starting with the table's header rows, up to
`chunk_size` characters — a single row longer than that still stays whole in its own piece, unless it exceeds
ROW_HARD_MAX (then, and only then, it is cut like prose, header repeated on every piece).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.generation.articles import HEADING  # an article's opening line, as the reader finds it
from pipeline.ingestion.chunking import split_text
from pipeline.ingestion.parsing.document import Heading, ParsedPage, TableBlock

CONTEXT_SEP = " › "
ROW_HARD_MAX = 2000  # characters; a longer table row is cut (the embedding model reads ~500 of them anyway)
MIN_ARTICLES = 2  # one such line may be a quotation; two or more make the text a list of articles


@dataclass(frozen=True)
class Piece:
    text: str
    start: int  # span of the piece in the page text (the viewer highlights it)
    end: int
    context: str | None = None  # sheet name / heading path


def indexed_text(text: str, context: str | None) -> str:
    """What is embedded and BM25-tokenized for a chunk: its context line, then its text."""
    return f"{context}\n{text}" if context else text


def chunk_page(page: ParsedPage, chunk_size: int, chunk_overlap: int, structured: bool = True) -> list[Piece]:
    """`structured` False (the chunk_structure setting off): the page is cut as plain text, like a txt page."""
    text = page.text
    if not structured:
        return [Piece(text[s:e], s, e, page.context) for s, e in split_text(text, chunk_size, chunk_overlap)]
    if not page.headings and not page.tables:
        return [Piece(text[s:e], s, e, page.context) for s, e in split_prose(text, chunk_size, chunk_overlap)]
    pieces: list[Piece] = []
    heading_spans = [(h.start, h.end) for h in page.headings]
    for a, b, path in _sections(text, page.headings):
        context = CONTEXT_SEP.join([c for c in (page.context, *path) if c]) or None
        cursor = a
        for table in (t for t in page.tables if a <= t.start < b):
            pieces += _prose(text, cursor, table.start, heading_spans, chunk_size, chunk_overlap, context)
            pieces += table_pieces(text, table, chunk_size, context)
            cursor = table.end
        pieces += _prose(text, cursor, b, heading_spans, chunk_size, chunk_overlap, context)
    return pieces


def _sections(text: str, headings: list[Heading]) -> list[tuple[int, int, list[str]]]:
    """(start, end, heading path) per section; text before the first heading is a section with no path."""
    out = []
    stack: list[Heading] = []
    starts = [h.start for h in headings]
    if not headings or headings[0].start > 0:
        out.append((0, starts[0] if starts else len(text), []))
    for i, h in enumerate(headings):
        while stack and stack[-1].level >= h.level:
            stack.pop()
        stack.append(h)
        end = starts[i + 1] if i + 1 < len(headings) else len(text)
        out.append((h.start, end, [x.title for x in stack if x.title]))
    return out


def _prose(text: str, a: int, b: int, heading_spans: list[tuple[int, int]], size: int, overlap: int,
           context: str | None) -> list[Piece]:
    region = text[a:b]
    if not region.strip():
        return []
    # A region holding nothing but its heading line (a heading right before a table or a sub-heading): the
    # heading already travels as context of what follows, a chunk of the title alone would only add noise.
    rest = "".join(ch for i, ch in enumerate(region, a) if not any(s <= i < e for s, e in heading_spans))
    if not rest.strip():
        return []
    return [Piece(region[s:e], a + s, a + e, context) for s, e in split_prose(region, size, overlap)]


def split_prose(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """`split_text`'s spans, except in a list of articles (MIN_ARTICLES lines opening with 「第…条」): whole articles
    packed up to `size` characters (what precedes the first one — a heading, a preamble — opens the first piece),
    an article longer than `size` cut by split_text on its own."""
    starts = [m.start() for m in HEADING.finditer(text)]
    if len(starts) < MIN_ARTICLES:
        return split_text(text, size, overlap)
    bounds = sorted({0, *starts, len(text)})
    spans: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for a, b in zip(bounds, bounds[1:]):
        s, e = _trimmed(text, a, b)
        if s >= e:
            continue
        if e - s > size:  # one long article: cut inside it, as any prose
            if cur:
                spans.append(cur)
                cur = None
            spans += [(s + x, s + y) for x, y in split_text(text[s:e], size, overlap)]
        elif cur and e - cur[0] <= size:
            cur = (cur[0], e)
        else:
            if cur:
                spans.append(cur)
            cur = (s, e)
    if cur:
        spans.append(cur)
    return spans


def _trimmed(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def table_pieces(text: str, table: TableBlock, chunk_size: int, context: str | None) -> list[Piece]:
    """Whole rows per piece, each piece starting with the header rows (when the header takes at most half of
    a chunk; a wider header is kept once, in the first piece)."""
    rows = [text[s:e] for s, e in table.rows]
    nh = min(table.header_rows, len(rows))
    header = "\n".join(rows[:nh])
    if nh == len(rows):  # a header without body rows: plain text
        return [Piece(p.text, table.start + p.start, table.start + p.end, context)
                for p in _split_long(header, chunk_size)]
    repeat = len(header) <= chunk_size // 2
    prefix = header + "\n" if repeat else ""
    pieces: list[Piece] = []
    group: list[int] = [] if repeat else list(range(nh))  # an unrepeated header opens the first piece
    size = len(prefix) + sum(len(rows[i]) + 1 for i in group)

    def emit(idx: list[int]) -> None:
        body = "\n".join(rows[i] for i in idx)
        start = table.start if not pieces else table.rows[idx[0]][0]  # the first piece's span covers the header
        pieces.append(Piece(prefix + body, start, table.rows[idx[-1]][1], context))

    for i in range(nh, len(rows)):
        row = rows[i]
        if len(row) > ROW_HARD_MAX:
            if group:
                emit(group)
            group, size = [], len(prefix)
            s0 = table.rows[i][0]
            for p in _split_long(row, max(chunk_size - len(prefix), chunk_size // 2)):
                pieces.append(Piece(prefix + p.text, s0 + p.start, s0 + p.end, context))
            continue
        if group and size + len(row) > chunk_size:
            emit(group)
            group, size = [], len(prefix)
        group.append(i)
        size += len(row) + 1
    if group:
        emit(group)
    return pieces


def _split_long(text: str, size: int) -> list[Piece]:
    return [Piece(text[s:e], s, e) for s, e in split_text(text, size, 0)]
