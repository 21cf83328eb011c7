"""Spreadsheets: .xlsx (openpyxl, cached formula values) and .csv, one table per sheet.

Each non-empty sheet becomes one ParsedPage: one line per row, cells joined with " | ", the first row the
header, the sheet's name as context. An empty sheet is skipped with a note; a workbook openpyxl cannot read is a
ParseError with a clear reason.
"""
from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

from .document import ParsedPage, TableBlock
from .errors import ParseError
from .limits import CellBudget, check_xlsx_elements
from .normalize import normalize_text
from .text import decode_bytes

R_XLSX_BROKEN = "XLSX 文件已损坏或无法读取"
R_SHEETS_EMPTY = "工作簿中没有非空的工作表"
CELL_SEP = " | "


def cell_text(v) -> str:
    """A cell value as shown in a chunk: integral floats without ".0", dates without a zero time."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else format(v, ".15g")
    if isinstance(v, dt.datetime):
        return v.date().isoformat() if v.time() == dt.time() else v.isoformat(sep=" ", timespec="seconds")
    if isinstance(v, (dt.date, dt.time)):
        return v.isoformat()
    return " ".join(normalize_text(str(v)).split())  # a cell's own line breaks would split its row


def table_page(rows: list[list[str]], context: str | None) -> ParsedPage | None:
    """One page from rows of cell texts (trailing empty cells and empty rows dropped); None if nothing left."""
    lines = []
    for cells in rows:
        while cells and not cells[-1]:
            cells = cells[:-1]
        if any(cells):
            lines.append(CELL_SEP.join(cells))
    if not lines:
        return None
    spans, pos = [], 0
    for line in lines:
        spans.append((pos, pos + len(line)))
        pos += len(line) + 1
    return ParsedPage("\n".join(lines), None, tables=[TableBlock(tuple(spans), header_rows=1)], context=context)


def parse_xlsx(path: Path, warnings: list[str]) -> list[ParsedPage]:
    import openpyxl

    check_xlsx_elements(path)
    budget = CellBudget("XLSX")
    try:
        values = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as exc:  # BadZipFile, KeyError (missing part), InvalidFileException, XML errors …
        raise ParseError(R_XLSX_BROKEN) from exc
    pages: list[ParsedPage] = []
    try:
        for ws in values.worksheets:
            try:
                rows = []
                for row in ws.iter_rows(values_only=True):
                    budget.row(row)
                    rows.append([cell_text(v) for v in row])
            except ParseError:
                raise
            except Exception as exc:
                raise ParseError(f"{R_XLSX_BROKEN}（工作表「{ws.title}」）") from exc
            page = table_page(rows, f"工作表「{ws.title}」")
            if page is None:
                warnings.append(f"工作表「{ws.title}」为空，已跳过")
            else:
                pages.append(page)
    finally:
        values.close()
    missing = _formulas_without_values(path)
    if missing:
        warnings.append(f"{missing} 个公式单元格没有保存计算结果（文件未在 Excel 中计算并保存），显示为空")
    if not pages:
        raise ParseError(R_SHEETS_EMPTY)
    return pages


def _formulas_without_values(path: Path) -> int:
    """Formula cells whose cached value is missing (a workbook written by a program, never calculated)."""
    import openpyxl

    try:
        formulas = openpyxl.load_workbook(path, read_only=True, data_only=False)
        values = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception:
        return 0
    n = 0
    try:
        for wf, wv in zip(formulas.worksheets, values.worksheets):
            for rf, rv in zip(wf.iter_rows(values_only=True), wv.iter_rows(values_only=True)):
                n += sum(1 for f, v in zip(rf, rv) if isinstance(f, str) and f.startswith("=") and v is None)
    finally:
        formulas.close()
        values.close()
    return n


def parse_csv(path: Path) -> tuple[list[ParsedPage], str]:
    """(pages, encoding): one page, the delimiter sniffed among , ; tab and |."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ParseError(f"无法读取文件：{exc.strerror or exc}") from exc
    text, encoding = decode_bytes(data)
    sample = text[:20000]
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    budget = CellBudget("CSV")
    try:
        rows = []
        for row in csv.reader(io.StringIO(text, newline=""), dialect):
            budget.row(row)
            rows.append([cell_text(c) for c in row])
    except csv.Error as exc:
        raise ParseError(f"CSV 文件格式错误：{exc}") from exc
    page = table_page(rows, None)
    return ([page] if page else []), encoding
