from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Heading:
    """A heading line inside a page's text (Markdown `#`, DOCX 标题 styles): its span, level 1–6 and title."""

    start: int
    end: int
    level: int
    title: str


@dataclass(frozen=True)
class TableBlock:
    """A table inside a page's text: the span of every row (header rows first), so chunking can keep rows whole
    and repeat the header. `header_rows` = how many leading rows form the header (Markdown: header + the
    `|---|` line)."""

    rows: tuple[tuple[int, int], ...]
    header_rows: int = 1

    @property
    def start(self) -> int:
        return self.rows[0][0]

    @property
    def end(self) -> int:
        return self.rows[-1][1]


@dataclass
class ParsedPage:
    text: str
    page: int | None  # 1-based PDF page number; None for txt/md/docx/xlsx/csv
    source: str = "text"  # "text" (text layer / file text) | "ocr"
    headings: list[Heading] = field(default_factory=list)  # in text order
    tables: list[TableBlock] = field(default_factory=list)  # in text order, never overlapping
    context: str | None = None  # shown before the heading path, e.g. 工作表「销售」 of a workbook


@dataclass
class ParsedDocument:
    file_type: str  # "txt" | "md" | "pdf" | "docx" | "xlsx" | "csv"
    pages: list[ParsedPage]
    encoding: str | None = None  # txt/md/csv only: "utf-8", "utf-8-sig", "gb18030", ... as detected
    ocr_pages: int = 0  # how many pages went through OCR
    warnings: list[str] = field(default_factory=list)  # non-fatal notes in Chinese (e.g. 扫描页未 OCR)

    @property
    def text(self) -> str:
        return "\n\n".join(p.text for p in self.pages if p.text)


class Progress(str):
    """A progress message ("OCR 3/8 页") that also carries its stage and counts for structured progress.

    A plain `str` to callers that only show it (the `progress=` callback contract stays "a short Chinese
    status string")."""

    stage: str
    done: int
    total: int

    def __new__(cls, text: str, stage: str, done: int = 0, total: int = 0) -> "Progress":
        obj = super().__new__(cls, text)
        obj.stage, obj.done, obj.total = stage, int(done), int(total)
        return obj
