"""A PDF page rendered with the cited passage boxed — where the page's text layer lets us find the passage.

The chunk text is normalized (NFKC, whitespace), the text layer is not: both are compared as runs of non-space,
NFKC-folded characters, each folded character remembering its index in the text layer. The passage's first and
last characters found that way give the text-layer range whose rectangles pdfium reports; they are drawn on the
rendered page. OCR'd pages have no usable text layer: no box (the viewer says so).
"""
from __future__ import annotations

import io
import unicodedata
from pathlib import Path

from pipeline.ingestion.parsing.pdf import PDFIUM_LOCK

SCALE = 1.4  # ~100 DPI: readable in the drawer, small enough to send inline
PROBE = 16  # characters matched at each end of the passage


def _folded(text: str) -> tuple[str, list[int]]:
    out, index = [], []
    for i, ch in enumerate(text):
        if ch.isspace():
            continue
        for f in unicodedata.normalize("NFKC", ch):
            if not f.isspace():
                out.append(f)
                index.append(i)
    return "".join(out), index


def passage_range(layer: str, passage: str) -> tuple[int, int] | None:
    """(first, last) text-layer index of the passage, or None when it cannot be found."""
    hay, index = _folded(layer)
    needle, _ = _folded(passage)
    if not needle:
        return None
    head, tail = needle[:PROBE], needle[-PROBE:]
    start = hay.find(head)
    if start < 0:
        return None
    end = hay.find(tail, start + max(0, len(needle) - len(tail) - PROBE))
    if end < 0:
        end = hay.find(tail, start)
    if end < 0:
        return None
    return index[start], index[end + len(tail) - 1]


def render_page(pdf_path: Path, page_no: int, passage: str | None = None) -> tuple[bytes, bool]:
    """(JPEG of the page, whether the passage was boxed)."""
    import pypdfium2 as pdfium
    from PIL import ImageDraw

    with PDFIUM_LOCK:
        pdf = pdfium.PdfDocument(str(pdf_path))
        try:
            if not 1 <= page_no <= len(pdf):
                raise IndexError(page_no)
            page = pdf[page_no - 1]
            try:
                _, height = page.get_size()
                rects = []
                if passage:
                    textpage = page.get_textpage()
                    try:
                        found = passage_range(textpage.get_text_range(), passage)
                        if found:
                            n = textpage.count_rects(found[0], found[1] - found[0] + 1)
                            rects = [textpage.get_rect(k) for k in range(n)]
                    finally:
                        textpage.close()
                image = page.render(scale=SCALE).to_pil().convert("RGB")
            finally:
                page.close()
        finally:
            pdf.close()
    draw = ImageDraw.Draw(image, "RGBA")
    for left, bottom, right, top in rects:
        box = (left * SCALE - 2, (height - top) * SCALE - 2, right * SCALE + 2, (height - bottom) * SCALE + 2)
        draw.rectangle(box, outline=(245, 158, 11, 255), width=2, fill=(253, 230, 138, 70))
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=80)
    return buf.getvalue(), bool(rects)
