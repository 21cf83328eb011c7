"""Markdown structure: headings (ATX `#` and setext `===`/`---`) and GFM pipe tables, as spans of the text.

The text itself is kept as it is (the file's normalized text); this only marks where sections start and which
lines are table rows, so chunking can follow headings and keep rows whole. Lines inside fenced code blocks are
neither headings nor tables.
"""
from __future__ import annotations

import re

from .document import Heading, TableBlock
from .limits import MAX_MD_STRUCT_LINE

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-{2,})[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_DELIM_CELL = re.compile(r"^\s*:?-+:?\s*$")


def _lines(text: str) -> list[tuple[int, int, str]]:
    """(start, end, line) for every line; end excludes the newline."""
    out, pos = [], 0
    for line in text.split("\n"):
        out.append((pos, pos + len(line), line))
        pos += len(line) + 1
    return out


def _cells(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return s.split("|")


def _is_delimiter_row(line: str) -> bool:
    if "-" not in line or "|" not in line:
        return False
    cells = _cells(line)
    return bool(cells) and all(_DELIM_CELL.match(c) for c in cells)


def _is_pipe_row(line: str) -> bool:
    return "|" in line and bool(line.strip())


def markdown_structure(text: str) -> tuple[list[Heading], list[TableBlock]]:
    """Headings and tables of a Markdown text, in order, as character spans of `text`."""
    lines = _lines(text)
    headings: list[Heading] = []
    tables: list[TableBlock] = []
    fence: str | None = None
    i = 0
    while i < len(lines):
        start, end, line = lines[i]
        if len(line) > MAX_MD_STRUCT_LINE:  # never a heading or table row; _ATX backtracks on long blank runs
            i += 1
            continue
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            i += 1
            continue
        if m:
            fence = m.group(1)
            i += 1
            continue
        m = _ATX.match(line)
        if m:
            headings.append(Heading(start, end, len(m.group(1)), (m.group(2) or "").strip()))
            i += 1
            continue
        # GFM table: a pipe row followed by a delimiter row, then pipe rows until a blank / non-pipe line
        if _is_pipe_row(line) and i + 1 < len(lines) and _is_delimiter_row(lines[i + 1][2]):
            rows = [(start, end), (lines[i + 1][0], lines[i + 1][1])]
            j = i + 2
            while j < len(lines) and _is_pipe_row(lines[j][2]) and not _ATX.match(lines[j][2]):
                rows.append((lines[j][0], lines[j][1]))
                j += 1
            tables.append(TableBlock(tuple(rows), header_rows=2))
            i = j
            continue
        # setext heading: a text line underlined with === (level 1) or --- (level 2)
        if line.strip() and i + 1 < len(lines) and _SETEXT.match(lines[i + 1][2]) and not _is_pipe_row(line):
            under = lines[i + 1]
            level = 1 if under[2].strip().startswith("=") else 2
            headings.append(Heading(start, under[1], level, line.strip()))
            i += 2
            continue
        i += 1
    return headings, tables
