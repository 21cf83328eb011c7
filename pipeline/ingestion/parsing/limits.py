"""Element bounds per format: a file under the byte and zip-ratio guards can still hold millions of elements
(issue 27: a 16 MB .docx whose document.xml is 190 MiB of ~5 million empty paragraphs took 4 GB and 16 minutes).

Every format is bounded by something other than bytes, checked as early and as cheaply as possible:
- DOCX: paragraphs and table cells, counted by streaming the decompressed XML parts (no tree built) before
  python-docx loads anything, and again while walking the body (a part written with another namespace prefix
  escapes the byte scan, not the walk);
- XLSX / CSV: cells (non-empty, all sheets together) and cells scanned (empty padding of a claimed range
  included), counted while the rows stream; the shared-strings table is counted before openpyxl loads it;
- PDF: pages, from the page count before any page is opened;
- TXT / MD: the 20 MB upload limit bounds the text; Markdown lines longer than MAX_MD_STRUCT_LINE are never
  matched as headings or table rows (the heading pattern backtracks quadratically on long runs of blanks).
Whatever still takes too long or too much memory is stopped by the per-document budget of the parse worker.
"""
from __future__ import annotations

import zipfile

from .errors import ParseError

MAX_DOCX_PARAGRAPHS = 200_000  # a 1,000-page Word document has ~30,000
MAX_DOCX_CELLS = 500_000
MAX_SHEET_CELLS = 2_000_000  # non-empty cells of a workbook / CSV (20 MB of CSV holds ~2 M short cells)
MAX_SHEET_SCANNED = 20_000_000  # cells iterated, empty ones of a claimed A1:XFD1048576 range included
MAX_PDF_PAGES = 10_000
MAX_MD_STRUCT_LINE = 2_000

_SCAN_CHUNK = 1 << 20
_P_TAGS = (b"<w:p>", b"<w:p ", b"<w:p/>")
_TC_TAGS = (b"<w:tc>", b"<w:tc ", b"<w:tc/>")
_SI_TAGS = (b"<si>", b"<si ", b"<si/>")


def over_limit(what: str, limit: int) -> ParseError:
    return ParseError(f"超出资源限制：{what}超过上限 {limit}")


def _count_tags(zf: zipfile.ZipFile, name: str, tags: tuple[bytes, ...], limit: int, what: str,
                n: int = 0) -> int:
    """n + occurrences of `tags` in member `name`, decompressed in chunks; raises once `limit` is passed."""
    keep = max(len(t) for t in tags) - 1  # a tag cut by a chunk boundary is found in tail + next chunk
    tail = b""
    with zf.open(name) as fh:
        while True:
            chunk = fh.read(_SCAN_CHUNK)
            if not chunk:
                return n
            buf = tail + chunk
            n += sum(buf.count(t) for t in tags)
            if n > limit:
                raise over_limit(what, limit)
            tail = buf[-keep:]


def check_docx_elements(path) -> None:
    """Paragraphs and table cells of every word/*.xml part (body, headers, footnotes …) under the limits."""
    try:
        with zipfile.ZipFile(path) as zf:
            parts = [i.filename for i in zf.infolist()
                     if i.filename.startswith("word/") and i.filename.endswith(".xml")]
            paragraphs = cells = 0
            for name in parts:
                paragraphs = _count_tags(zf, name, _P_TAGS, MAX_DOCX_PARAGRAPHS, "DOCX 段落数", paragraphs)
                cells = _count_tags(zf, name, _TC_TAGS, MAX_DOCX_CELLS, "DOCX 表格单元格数", cells)
    except ParseError:
        raise
    except Exception:  # a broken zip: python-docx reports it with its own reason
        return


def check_xlsx_elements(path) -> None:
    """The shared-strings table (loaded whole by openpyxl, even read-only) under the cell limit."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = {i.filename for i in zf.infolist()}
            if "xl/sharedStrings.xml" in names:
                _count_tags(zf, "xl/sharedStrings.xml", _SI_TAGS, MAX_SHEET_CELLS, "XLSX 共享字符串数")
    except ParseError:
        raise
    except Exception:
        return


class CellBudget:
    """Counts cells while a table streams (all sheets of a workbook share one budget)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.filled = 0
        self.scanned = 0

    def row(self, values) -> None:
        self.scanned += len(values)
        self.filled += sum(1 for v in values if v is not None and v != "")
        if self.filled > MAX_SHEET_CELLS:
            raise over_limit(f"{self.kind} 非空单元格数", MAX_SHEET_CELLS)
        if self.scanned > MAX_SHEET_SCANNED:
            raise over_limit(f"{self.kind} 单元格数（含空单元格）", MAX_SHEET_SCANNED)
