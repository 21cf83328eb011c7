from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ParsedPage:
    text: str
    page: int | None  # 1-based PDF page number; None for txt/md/docx
    source: str = "text"  # "text" (text layer / file text) | "ocr"


@dataclass
class ParsedDocument:
    file_type: str  # "txt" | "md" | "pdf" | "docx"
    pages: list[ParsedPage]
    encoding: str | None = None  # txt/md only: "utf-8", "utf-8-sig", "gb18030", ... as detected
    ocr_pages: int = 0  # how many pages went through OCR
    warnings: list[str] = field(default_factory=list)  # non-fatal notes in Chinese (e.g. 扫描页未 OCR)

    @property
    def text(self) -> str:
        return "\n\n".join(p.text for p in self.pages if p.text)
