"""parse_file: the one entry point that turns an accepted upload into text pages."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .document import ParsedDocument, ParsedPage
from .errors import ParseError
from .validate import sniff_content

R_NO_TEXT = "未解析到文本"


def parse_file(
    path,
    file_type,
    *,
    ocr_enabled: bool = True,
    ocr_max_pages: int = 50,
    progress: Callable[[str], None] | None = None,
) -> ParsedDocument:
    """Parses a txt/md/pdf/docx/xlsx/csv file into normalized text pages.

    Runs `sniff_content` first (magic bytes, zip-bomb guard). txt/md/docx/csv give one page with page=None;
    PDFs give one ParsedPage per page with text (1-based page numbers; OCR'd pages have source="ocr"); xlsx one
    page per non-empty sheet (context = the sheet's name). Markdown and DOCX pages carry their headings and
    tables, spreadsheet pages one table each (ParsedPage.headings / .tables).
    `progress` receives short Chinese status strings such as "OCR 3/8 页" (an exception raised by it
    propagates, so it can be used to cancel). Raises ParseError with a Chinese `reason`."""
    path = Path(path)
    file_type = str(file_type).lower().lstrip(".")
    sniff_content(path, file_type)
    warnings: list[str] = []
    encoding = None
    ocr_pages = 0
    if file_type in ("txt", "md"):
        from .text import parse_text_file

        text, encoding = parse_text_file(path)
        pages = [ParsedPage(text=text, page=None)]
        if file_type == "md":
            from .markdown import markdown_structure

            pages[0].headings, pages[0].tables = markdown_structure(text)
    elif file_type == "docx":
        from .docx_parser import parse_docx_page

        pages = [parse_docx_page(path)]
    elif file_type == "xlsx":
        from .sheets import parse_xlsx

        pages = parse_xlsx(path, warnings)
    elif file_type == "csv":
        from .sheets import parse_csv

        pages, encoding = parse_csv(path)
    elif file_type == "pdf":
        from .pdf import parse_pdf

        pages, ocr_pages = parse_pdf(path, ocr_enabled=ocr_enabled, ocr_max_pages=max(0, int(ocr_max_pages)),
                                     progress=progress, warnings=warnings)
    else:  # sniff_content already refused it
        raise ParseError(f"不支持的文件类型 .{file_type}")

    pages = [p for p in pages if p.text and p.text.strip()]
    if not pages:
        raise ParseError(R_NO_TEXT)
    return ParsedDocument(file_type=file_type, pages=pages, encoding=encoding, ocr_pages=ocr_pages,
                          warnings=warnings)
