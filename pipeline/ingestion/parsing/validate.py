"""Upload checks (name/size, before storing) and content sniffing (magic bytes, zip bombs)."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

from .errors import ParseError, UploadRefused

ALLOWED_EXTS = {".txt", ".md", ".pdf", ".docx", ".xlsx", ".csv"}
MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_BATCH_FILES = 10

# DOCX zip-bomb guard
MAX_DOCX_UNCOMPRESSED = 200 * 1024 * 1024
MAX_DOCX_RATIO = 100  # total uncompressed / total compressed (real DOCX files: ~3–10; XML alone ≤ ~30)
MAX_DOCX_MEMBER_RATIO = 1000  # any single member (a 1 GB run of zeros deflates ~1000:1)
MAX_DOCX_ENTRIES = 10_000

_EXT_TO_TYPE = {".txt": "txt", ".md": "md", ".pdf": "pdf", ".docx": "docx", ".xlsx": "xlsx", ".csv": "csv"}
_ALLOWED_TEXT = "txt / md / pdf / docx / xlsx / csv"

R_EMPTY = "文件为空"
R_TOO_BIG = "文件超过 20 MB"
R_MISMATCH = "文件内容与扩展名不符"
R_PDF_BROKEN = "PDF 文件已损坏或无法读取"
R_DOCX_NOT_ZIP = "DOCX 文件无效（不是 zip 压缩包）"
R_DOCX_NO_DOCUMENT = "DOCX 文件无效（缺少 word/document.xml）"
R_DOCX_BOMB = "DOCX 文件解压后体积异常（疑似压缩炸弹）"
R_XLSX_BOMB = "XLSX 文件解压后体积异常（疑似压缩炸弹）"
R_DOCX_BROKEN = "DOCX 文件已损坏或无法读取"
R_OLD_DOC = "文件内容与扩展名不符（这是旧版 Word .doc 文件，请另存为 .docx）"
R_OLD_XLS = "文件内容与扩展名不符（这是旧版 Excel .xls 文件，请另存为 .xlsx）"
R_XLSX_NOT_ZIP = "XLSX 文件无效（不是 zip 压缩包）"
R_XLSX_NO_WORKBOOK = "XLSX 文件无效（缺少 xl/workbook.xml）"

# Known magic numbers of binary formats (for "renamed binary" detection).
_BINARY_MAGIC: list[tuple[bytes, str]] = [
    (b"\x7fELF", "ELF"),
    (b"MZ", "EXE"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"%PDF", "PDF"),
    (b"PK\x03\x04", "ZIP"),
    (b"PK\x05\x06", "ZIP"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "OLE"),
    (b"\x1f\x8b", "GZIP"),
    (b"7z\xbc\xaf\x27\x1c", "7Z"),
    (b"Rar!\x1a\x07", "RAR"),
    (b"BZh", "BZIP2"),
    (b"\xfd7zXZ\x00", "XZ"),
    (b"RIFF", "RIFF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\xca\xfe\xba\xbe", "CLASS"),
    (b"\xcf\xfa\xed\xfe", "MACHO"),
    (b"SQLite format 3\x00", "SQLITE"),
]
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_TEXT_AMBIGUOUS_MAGIC = {"EXE", "BZIP2", "RIFF"}


def check_upload(file_name: str, size: int) -> str:
    """Cheap check on name and size. Returns the normalized file_type; raises UploadRefused."""
    ext = Path(file_name or "").suffix.lower()
    if ext not in ALLOWED_EXTS:
        shown = ext if ext else "（无扩展名）"
        raise UploadRefused(f"不支持的文件类型 {shown}，仅支持 {_ALLOWED_TEXT}")
    if size is None or size <= 0:
        raise UploadRefused(R_EMPTY)
    if size > MAX_FILE_BYTES:
        raise UploadRefused(R_TOO_BIG)
    return _EXT_TO_TYPE[ext]


def binary_kind(head: bytes) -> str | None:
    """Name of the binary format whose magic `head` starts with, else None."""
    for magic, kind in _BINARY_MAGIC:
        if head.startswith(magic):
            return kind
    return None


def _read_head(path: Path, n: int = 8192) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


def sniff_content(path, file_type) -> None:
    """Magic-byte checks: raises ParseError when the content does not fit the declared type."""
    path = Path(path)
    file_type = str(file_type).lower().lstrip(".")
    try:
        size = os.path.getsize(path)
        head = _read_head(path)
    except OSError as exc:
        raise ParseError(f"无法读取文件：{exc.strerror or exc}") from exc
    if size == 0:
        raise ParseError(R_EMPTY)

    if file_type in ("txt", "md", "csv"):
        _sniff_text(head)
    elif file_type == "pdf":
        _sniff_pdf(head)
    elif file_type == "docx":
        _sniff_docx(path, head)
    elif file_type == "xlsx":
        _sniff_office_zip(path, head, "xl/workbook.xml", R_OLD_XLS, R_XLSX_NOT_ZIP, R_XLSX_NO_WORKBOOK,
                          R_XLSX_BOMB)
    else:
        raise ParseError(f"不支持的文件类型 .{file_type}，仅支持 {_ALLOWED_TEXT}")


def _sniff_text(head: bytes) -> None:
    if head.startswith(_UTF16_BOMS) or head.startswith(b"\xef\xbb\xbf"):
        return  # BOM-marked Unicode text (UTF-16 has NUL bytes by design)
    kind = binary_kind(head)
    if kind in _TEXT_AMBIGUOUS_MAGIC:
        kind = None  # short printable magics ("MZ", "BZh", "RIFF") can start real text; NULs below catch them
    if kind is not None or b"\x00" in head:
        raise ParseError(R_MISMATCH)
    # Many C0 control bytes (other than \t \n \r \f \x1b) → binary.
    ctrl = sum(1 for b in head if b < 0x20 and b not in (9, 10, 12, 13, 27))
    if head and ctrl / len(head) > 0.05:
        raise ParseError(R_MISMATCH)


def _sniff_pdf(head: bytes) -> None:
    # The spec lets the header sit anywhere in the first 1024 bytes (some producers prepend junk).
    if b"%PDF-" in head[:1024]:
        return
    kind = binary_kind(head)
    if kind is not None and kind != "PDF":
        raise ParseError(R_MISMATCH)
    raise ParseError(R_PDF_BROKEN)


def _sniff_docx(path: Path, head: bytes) -> None:
    _sniff_office_zip(path, head, "word/document.xml", R_OLD_DOC, R_DOCX_NOT_ZIP, R_DOCX_NO_DOCUMENT, R_DOCX_BOMB)


def _sniff_office_zip(path: Path, head: bytes, main_part: str, r_old: str, r_not_zip: str, r_no_main: str,
                      r_bomb: str) -> None:
    """DOCX / XLSX: a zip (not the old OLE format) holding its main part, without a zip bomb inside."""
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        raise ParseError(r_old)
    if not head.startswith(b"PK"):
        kind = binary_kind(head)
        raise ParseError(R_MISMATCH if kind is not None else r_not_zip)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ParseError(r_not_zip) from exc
    names = {i.filename for i in infos}
    if main_part not in names:
        raise ParseError(r_no_main)
    check_zip_bomb(infos, r_bomb)


def check_zip_bomb(infos: list[zipfile.ZipInfo], reason: str = R_DOCX_BOMB) -> None:
    """Raises ParseError(reason) when the central directory announces an absurd expansion (`reason` names the
    file type: an .xlsx bomb must not be called DOCX)."""
    if len(infos) > MAX_DOCX_ENTRIES:
        raise ParseError(reason)
    total_u = sum(max(i.file_size, 0) for i in infos)
    total_c = sum(max(i.compress_size, 0) for i in infos)
    if total_u > MAX_DOCX_UNCOMPRESSED:
        raise ParseError(reason)
    if total_u > 10 * 1024 * 1024 and total_u > MAX_DOCX_RATIO * max(total_c, 1):
        raise ParseError(reason)
    for i in infos:
        if i.file_size > 10 * 1024 * 1024 and i.file_size > MAX_DOCX_MEMBER_RATIO * max(i.compress_size, 1):
            raise ParseError(reason)
