"""Plain text / Markdown: encoding detection and decoding."""
from __future__ import annotations

from pathlib import Path

from .errors import ParseError
from .normalize import normalize_text

R_UNKNOWN_ENCODING = "无法识别文本编码（支持 UTF-8 / GBK / GB18030 等）"


def decode_bytes(data: bytes) -> tuple[str, str]:
    """Returns (text, encoding). Order: BOM'd Unicode, UTF-8, GB18030 (superset of GBK/GB2312),
    then charset-normalizer. Raises ParseError when nothing fits."""
    if data.startswith(b"\xef\xbb\xbf"):
        try:
            return data[3:].decode("utf-8"), "utf-8-sig"
        except UnicodeDecodeError:
            pass
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16"), "utf-16"
        except UnicodeDecodeError:
            pass
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    try:
        # gb18030 covers GBK and GB2312 and maps the user-defined 0xA1–0xA7/0xAA–0xAF/0xF8–0xFE areas to
        # the PUA, so "dirty GBK" files (e.g. 红楼梦 e-book dumps) decode fully.
        return data.decode("gb18030"), "gb18030"
    except UnicodeDecodeError:
        pass
    try:
        from charset_normalizer import from_bytes

        best = from_bytes(data).best()
    except Exception:  # pragma: no cover - detection library failure
        best = None
    if best is not None and best.encoding:
        try:
            return data.decode(best.encoding), best.encoding
        except (UnicodeDecodeError, LookupError):
            pass
    raise ParseError(R_UNKNOWN_ENCODING)


def parse_text_file(path: Path) -> tuple[str, str]:
    """Reads, decodes and normalizes a txt/md file. Returns (text, encoding)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ParseError(f"无法读取文件：{exc.strerror or exc}") from exc
    raw, encoding = decode_bytes(data)
    return normalize_text(raw), encoding
