"""Ruled tables in text-layer PDFs (pdfplumber, pure Python over pdfminer.six), so their rows stay whole.

pdfium gives a page's text as lines, a table's cells run together and chunks cut rows in half. pdfplumber finds
tables from the ruling lines of the page; where it finds a real one, the page text is rebuilt from pdfplumber:
the text above each table, the table one row per line (cells joined by ` | `, header = first row), the text
beside it, and so on down the page — and the rows go to chunking as a TableBlock (the DOCX rule: whole rows,
header repeated per chunk). Pages without tables keep pdfium's text unchanged.

Cost (measured on /work/shared/docs, 2 shared cores): pdfplumber takes 0.3–0.8 s per page looked at, against
0.02–0.06 s for pdfium's text — about as much as embedding the page's chunks. So only pages whose text layer
draws enough paths (`MIN_RULE_PATHS` lines/rectangles, counted by pdfium while probing) are looked at: pages of
plain text never pay for it; a drawing-heavy page without a table (a chemistry sheet: 183 paths) does.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from .document import TableBlock
from .normalize import normalize_text

log = logging.getLogger(__name__)

MIN_RULE_PATHS = 8   # path objects (lines/rectangles) on a page before its tables are looked for
MIN_FILL = 0.5       # share of non-empty cells: a page frame drawn as one big "table" has mostly empty ones
MAX_CELL_CHARS = 600  # a "cell" holding a whole text block is a layout box, not a table cell
CELL_SEP = " | "


_CJK_BREAK = re.compile(r"(?<=[\u3400-\u9fff\uff00-\uffef])\s+(?=[\u3400-\u9fff\uff00-\uffef])")


def _cell(value) -> str:
    """A cell on one line: line breaks inside Chinese text joined without a space (「股票投资评\n级」)."""
    return _CJK_BREAK.sub("", " ".join(normalize_text(str(value)).split())) if value else ""


def _merged(raw: list[list]) -> list[list[str]]:
    """pdfplumber marks the cells a merged cell spans with None: a merged first-column cell (a row label spanning
    several rows) is repeated on each of its rows, so every row reads on its own; other spanned cells go."""
    rows: list[list[str]] = []
    for r in raw or []:
        row = []
        for j, c in enumerate(r):
            if c is None:
                if j == 0 and rows and rows[-1]:
                    row.append(rows[-1][0])
                continue
            row.append(_cell(c))
        rows.append(row)
    return rows


def real_table_rows(raw: list[list]) -> list[list[str]] | None:
    """Rows of a detected table when it is a real table (≥ 2 columns, ≥ 2 rows, mostly filled), else None."""
    if not raw or max(len(r) for r in raw) < 2:
        return None
    total = sum(len(r) for r in raw)
    if sum(1 for r in raw for c in r if c) / total < MIN_FILL:
        return None
    rows = [r for r in _merged(raw) if any(r)]
    if len(rows) < 2 or max(len(r) for r in rows) < 2:
        return None
    if max(len(c) for r in rows for c in r) > MAX_CELL_CHARS:
        return None
    return rows


def _text(region) -> str:
    try:
        return normalize_text(region.extract_text() or "")
    except ValueError:  # an empty or out-of-page crop
        return ""


def page_with_tables(plumber_page) -> tuple[str, list[list[str]]] | None:
    """(page text, the tables' row lines) rebuilt around the page's real tables; None when it has none."""
    found = []
    for t in plumber_page.find_tables():
        rows = real_table_rows(t.extract())
        if rows:
            found.append((t.bbox, rows))
    if not found:
        return None
    found.sort(key=lambda x: x[0][1])
    x0, top0, x1, bottom0 = plumber_page.bbox
    parts: list[str] = []
    tables: list[list[str]] = []
    y = top0
    for (tx0, ttop, tx1, tbottom), rows in found:
        if ttop < y:  # overlapping detections: keep the first
            continue
        if ttop > y:
            parts.append(_text(plumber_page.crop((x0, y, x1, ttop))))
        lines = [CELL_SEP.join(r) for r in rows]
        parts.append("\n".join(lines))
        tables.append(lines)
        band = plumber_page.crop((x0, ttop, x1, tbottom))
        parts.append(_text(band.outside_bbox((tx0, ttop, tx1, tbottom))))  # text beside the table
        y = tbottom
    if y < bottom0:
        parts.append(_text(plumber_page.crop((x0, y, x1, bottom0))))
    return "\n".join(p for p in parts if p.strip()), tables


def find_tables(path: Path, numbers: list[int]) -> dict[int, tuple[str, list[list[str]]]]:
    """For the given 1-based pages: {page: (text, tables)} of those with real tables. Never raises: a page
    pdfplumber cannot read keeps pdfium's text."""
    if not numbers:
        return {}
    try:
        import pdfplumber
    except ImportError:
        log.warning("pdfplumber missing: PDF tables are read as plain text")
        return {}
    out = {}
    logging.getLogger("pdfminer").setLevel(logging.ERROR)  # per-glyph font warnings of ordinary PDFs
    try:
        with pdfplumber.open(str(path)) as pdf:
            for n in numbers:
                try:
                    got = page_with_tables(pdf.pages[n - 1])
                except Exception:
                    log.exception("pdfplumber failed on page %s of %s", n, path.name)
                    continue
                if got:
                    out[n] = got
    except Exception:
        log.exception("pdfplumber could not open %s", path.name)
    return out


def table_blocks(text: str, tables: list[list[str]]) -> list[TableBlock]:
    """Row spans of each table inside the final page text (after header/footer stripping); a table whose rows
    are not all there any more is left as plain text."""
    blocks = []
    cursor = 0
    for lines in tables:
        spans = []
        pos = cursor
        for line in lines:
            i = text.find(line, pos)
            if i < 0:
                spans = []
                break
            spans.append((i, i + len(line)))
            pos = i + len(line)
        if spans:
            blocks.append(TableBlock(tuple(spans)))
            cursor = pos
    return blocks
