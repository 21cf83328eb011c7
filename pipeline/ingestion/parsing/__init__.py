"""File validation, parsing and OCR (txt / md / pdf / docx / xlsx / csv).

Public API (others code against these names):
    ALLOWED_EXTS, MAX_FILE_BYTES, MAX_BATCH_FILES
    UploadRefused, ParseError            (both carry a Chinese `reason`)
    check_upload(file_name, size) -> file_type
    sniff_content(path, file_type) -> None
    ParsedPage, ParsedDocument, Progress (a progress string carrying stage / done / total)
    parse_file(path, file_type, *, ocr_enabled=True, ocr_max_pages=50, progress=None) -> ParsedDocument
    normalize_text(text) -> str          (the NFKC-style folding applied to all parsed text; usable on queries)
"""
from .core import R_NO_TEXT, parse_file
from .document import ParsedDocument, ParsedPage, Progress
from .errors import ParseError, UploadRefused
from .normalize import normalize_text
from .validate import ALLOWED_EXTS, MAX_BATCH_FILES, MAX_FILE_BYTES, check_upload, sniff_content

__all__ = [
    "ALLOWED_EXTS", "MAX_FILE_BYTES", "MAX_BATCH_FILES",
    "UploadRefused", "ParseError",
    "check_upload", "sniff_content",
    "ParsedPage", "ParsedDocument", "Progress", "parse_file",
    "normalize_text", "R_NO_TEXT",
]
