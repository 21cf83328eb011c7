"""DOCX: paragraphs and tables in document order (python-docx, walking the body XML).

Besides the text, the page records its structure: 标题/Heading-styled paragraphs as headings and every top-level
table's rows as a TableBlock (first row = header), so chunking keeps rows whole and follows headings.
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

from .document import Heading, ParsedPage, TableBlock
from .errors import ParseError
from .limits import MAX_DOCX_CELLS, MAX_DOCX_PARAGRAPHS, check_docx_elements, over_limit
from .normalize import normalize_text
from .validate import R_DOCX_BROKEN, R_DOCX_NOT_ZIP

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_P, _TBL, _SDT, _SDT_CONTENT, _TR, _TC = (_W + t for t in ("p", "tbl", "sdt", "sdtContent", "tr", "tc"))
# Containers whose children are block content (tracked insertions, custom XML, smart tags …).
_BLOCK_WRAPPERS = {_W + t for t in ("ins", "customXml", "smartTag", "moveTo")}
_TXBX = _W + "txbxContent"
_HEADING_STYLE = re.compile(r"^(?:heading|标题)\s*([1-6])$", re.IGNORECASE)



class _Budget:
    """Paragraphs and cells met while walking (the byte scan before loading misses other namespace prefixes)."""

    def __init__(self):
        self.paragraphs = 0
        self.cells = 0

    def paragraph(self) -> None:
        self.paragraphs += 1
        if self.paragraphs > MAX_DOCX_PARAGRAPHS:
            raise over_limit("DOCX 段落数", MAX_DOCX_PARAGRAPHS)

    def cell(self) -> None:
        self.cells += 1
        if self.cells > MAX_DOCX_CELLS:
            raise over_limit("DOCX 表格单元格数", MAX_DOCX_CELLS)


def parse_docx_page(path: Path) -> ParsedPage:
    check_docx_elements(path)  # before python-docx builds the tree: an element bomb fails in a second
    try:
        import docx  # python-docx
        from docx.opc.exceptions import PackageNotFoundError

        document = docx.Document(str(path))
    except PackageNotFoundError as exc:
        raise ParseError(R_DOCX_NOT_ZIP) from exc
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as exc:
        raise ParseError(R_DOCX_BROKEN) from exc
    except Exception as exc:  # lxml XMLSyntaxError and friends from malformed parts
        raise ParseError(R_DOCX_BROKEN) from exc

    lines: list[str] = []
    marks: list[tuple] = []
    _walk_blocks(document.element.body, document, lines, marks, _Budget())
    return _assemble(lines, marks)


def _assemble(lines: list[str], marks: list[tuple]) -> ParsedPage:
    """Normalized text (blank-line runs collapsed as normalize_text does) + heading and table spans."""
    parts: list[str] = []
    pos = 0
    blank = False
    headings: list[Heading] = []
    tables: dict[int, list[tuple[int, int]]] = {}
    for line, mark in zip(lines, marks):
        t = normalize_text(line)
        if not t:
            blank = True
            continue
        sep = ("\n\n" if blank else "\n") if parts else ""
        blank = False
        start = pos + len(sep)
        parts.append(sep + t)
        pos = start + len(t)
        if mark[0] == "heading":
            headings.append(Heading(start, pos, mark[1], t))
        elif mark[0] == "row":
            tables.setdefault(mark[1], []).append((start, pos))
    return ParsedPage("".join(parts), None, headings=headings,
                      tables=[TableBlock(tuple(rows)) for _, rows in sorted(tables.items())])


def _heading_level(paragraph) -> int | None:
    try:
        name = paragraph.style.name if paragraph.style is not None else ""
    except Exception:  # a style id missing from styles.xml
        return None
    m = _HEADING_STYLE.match((name or "").strip())
    return int(m.group(1)) if m else None


def _walk_blocks(container, document, out: list[str], marks: list[tuple] | None = None,
                 budget: _Budget | None = None) -> None:
    """Appends one line per paragraph and per table row, in document order. With `marks` (the body, not a
    table cell) one mark per line: ("heading", level), ("row", table number) or ("text",)."""
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    budget = budget or _Budget()
    for el in container.iterchildren():
        tag = el.tag
        if tag == _P:
            budget.paragraph()
            paragraph = Paragraph(el, document)
            out.append(_paragraph_text(paragraph))
            if marks is not None:
                level = _heading_level(paragraph)
                marks.append(("heading", level) if level else ("text",))
        elif tag == _TBL:
            n = len(out)
            _table_lines(Table(el, document), document, out, budget)
            if marks is not None:
                marks.extend([("row", len(marks))] * (len(out) - n))  # the first row's index names the table
        elif tag == _SDT:
            content = el.find(_SDT_CONTENT)
            if content is not None:
                _walk_blocks(content, document, out, marks, budget)
        elif tag in _BLOCK_WRAPPERS:
            _walk_blocks(el, document, out, marks, budget)
        # sectPr, bookmarkStart/End, … carry no text


def _paragraph_text(paragraph) -> str:
    text = paragraph.text  # runs + hyperlinks (python-docx ≥ 1.0)
    # Text boxes (w:txbxContent inside drawings / VML) are not in paragraph.text; append their paragraphs.
    boxes = paragraph._p.findall(".//" + _TXBX)
    if boxes:
        from docx.text.paragraph import Paragraph

        extra = []
        for box in boxes:
            for p in box.iter(_P):
                t = Paragraph(p, paragraph._parent).text
                if t.strip():
                    extra.append(t)
        # mc:AlternateContent usually holds the same text box twice (DrawingML + VML fallback)
        seen: set[str] = set()
        extra = [t for t in extra if not (t in seen or seen.add(t))]
        text = "\n".join([text, *extra]) if text.strip() else "\n".join(extra)
    return text


def _cell_text(cell, document, budget: _Budget | None = None) -> str:
    parts: list[str] = []
    _walk_blocks(cell._tc, document, parts, None, budget)
    # a cell's own lines (paragraphs, line breaks) are joined with spaces so that one table row stays one line
    return " ".join(" ".join(x.strip() for x in p.split("\n") if x.strip()) for p in parts if p.strip())


def _table_lines(table, document, out: list[str], budget: _Budget | None = None) -> None:
    """One line per row: distinct cells joined by " | ". python-docx returns the same cell (same `_tc`)
    for every grid position a horizontally merged cell spans, and the top cell's text again for rows
    a vertical merge continues: both are emitted once."""
    seen_tc: set = set()  # lxml elements (kept alive here, so identity is stable)
    for row in table.rows:
        cells: list[str] = []
        try:
            row_cells = row.cells
        except Exception:  # malformed grid → fall back to the raw w:tc children
            from docx.table import _Cell

            row_cells = [_Cell(tc, table) for tc in row._tr.findall(_TC)]
        for cell in row_cells:
            key = cell._tc
            if key in seen_tc:
                continue
            seen_tc.add(key)
            if budget is not None:
                budget.cell()
            text = _cell_text(cell, document, budget)
            if text:
                cells.append(text)
        if cells:
            out.append(" | ".join(cells))
