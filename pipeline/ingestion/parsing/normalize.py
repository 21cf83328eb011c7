"""Text normalisation shared by every format.

NFKC folds compatibility characters onto the ordinary ones: Kangxi / CJK radicals (⽤ U+2F64 → 用), CJK
compatibility ideographs, full-width letters and digits (ＡＢＣ１２３ → ABC123), ligatures, circled numbers.
Deliberate exception: full-width *punctuation* (，。！？：；（）etc.) is kept as is. Plain NFKC would turn
「，！？（）：」 into ASCII, which reads wrong in Chinese citations and removes ！？ from the sentence
boundaries the chunker splits on. Query-side code that wants the same folding can call `normalize_text`.
"""
from __future__ import annotations

import re
import unicodedata

# Full-width ASCII punctuation (U+FF01–FF5E minus letters/digits) and the half-width CJK punctuation block
# neighbours that NFKC would fold; kept verbatim.
_KEEP_CHARS = "".join(
    chr(c) for c in range(0xFF01, 0xFF5F)
    if not chr(c).isalnum()
) + "\u3000\u2026"  # ideographic space and …（Chinese ellipsis ……）are kept too
_KEEP_RE = re.compile("([" + re.escape(_KEEP_CHARS) + "]+)")
# C0/C1 controls except \t and \n; also zero-width chars and BOMs that leak out of PDFs/DOCX.
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u2060\ufeff\ufffe]")
# only from the start of a blank run: "[ \t]+\n" alone retried from every position of a long run not followed by
# a newline (3 MB of spaces in one line: quadratic, minutes)
_TRAILING_WS_RE = re.compile(r"(?<![ \t])[ \t]+\n")
_MANY_BLANK_LINES_RE = re.compile(r"\n{3,}")


def nfkc(text: str) -> str:
    """NFKC except full-width punctuation (see module docstring)."""
    if text.isascii():
        return text
    parts = _KEEP_RE.split(text)
    # split() with a capturing group: even indexes are normal text, odd ones the kept punctuation runs
    return "".join(p if i % 2 else unicodedata.normalize("NFKC", p) for i, p in enumerate(parts))


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n").replace("\u2029", "\n")


def normalize_text(text: str) -> str:
    """Newlines → \\n, NFKC (keeping full-width punctuation), control characters dropped, trailing spaces and
    runs of blank lines trimmed. Leading/trailing whitespace of the whole text is stripped."""
    text = normalize_newlines(text)
    text = _CONTROL_RE.sub("", text)
    text = nfkc(text)
    text = _TRAILING_WS_RE.sub("\n", text)
    text = _MANY_BLANK_LINES_RE.sub("\n\n", text)
    return text.strip()

