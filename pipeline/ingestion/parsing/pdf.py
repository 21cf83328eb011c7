"""PDF: text layer page by page (pypdfium2), cheap per-page OCR decision, OCR fallback.

Per page, without rendering:
- "ok": a usable text layer → kept, never OCR'd.
- "scan": < 20 non-space characters on a page that carries images → OCR (the few text-layer characters are
  kept, OCR lines already present in them are dropped).
- "garbled": a mojibake text layer (fonts without ToUnicode) → the layer is discarded, the page is OCR'd.
- "empty": little or no text and no images → nothing to read.
"""
from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import ocr, pdf_tables
from .document import ParsedPage, Progress
from .errors import ParseError
from .limits import MAX_PDF_PAGES, over_limit
from .normalize import normalize_text
from .validate import R_PDF_BROKEN

R_PDF_ENCRYPTED = "PDF 文件已加密，无法读取"
R_PDF_NO_PAGES = "PDF 文件没有页面"

MIN_TEXT_CHARS = 20  # fewer non-space characters than this on an image page → treat as scanned
MIN_IMAGE_COVERAGE = 0.02  # share of the page area covered by images for a low-text page to be OCR'd

# pdfium is not thread-safe: every call into it goes through this lock (OCR inference runs outside it).
PDFIUM_LOCK = threading.RLock()


@dataclass
class PageProbe:
    number: int  # 1-based
    text: str  # normalized text layer
    verdict: str  # "ok" | "scan" | "garbled" | "empty"
    needs_cjk_font: bool
    rule_paths: int = 0  # path objects (ruling lines, cell borders) on a usable text page: tables are looked for


# --- cheap page tests -----------------------------------------------------------------------------

_ASCII_RUN_RE = re.compile(r"[\x21-\x7e]+")
_RUN_STRIP = ".,;:-()[]{}\"'!?*"
_NUMERIC_RE = re.compile(r"^[+\-~]?[\d.,%~+\-/]+$")
_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def garbled_ascii_share(text: str) -> tuple[int, float]:
    """(number of ASCII runs considered, share of them that are > 40% punctuation).

    Runs are whitespace-free ASCII stretches of ≥ 3 characters after trimming ordinary leading/trailing
    punctuation; pure numbers (4.0%, 1.4.4) are skipped. Mojibake from fonts without ToUnicode maps letters
    and digits onto punctuation (e.g. "FHIT" → '!"#$', "Marker" → '>./?2/'): ≈ 0.46 on the garbled fixture,
    ≤ 0.11 on the normal Chinese/English pages."""
    runs = []
    for raw in _ASCII_RUN_RE.findall(text):
        run = raw.strip(_RUN_STRIP)
        if len(run) >= 3 and not _NUMERIC_RE.match(run):
            runs.append(run)
    if not runs:
        return 0, 0.0
    bad = sum(1 for r in runs if sum(not c.isalnum() for c in r) / len(r) > 0.4)
    return len(runs), bad / len(runs)


def is_garbled(text: str) -> bool:
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return False
    n = len(chars)
    # GBK/GB18030 bytes read as Latin-1 (e.g. "»ùÒòÍâÏÔ×Ó" for 基因外显子): many Latin-1 supplement chars,
    # few CJK ones. Real French/German text stays far below 20% accented letters.
    latin1 = sum(1 for c in chars if "\u00a1" <= c <= "\u00ff")
    cjk = sum(1 for c in chars if _CJK_RE.match(c))
    if n >= 20 and latin1 / n > 0.2 and cjk / n < 0.1:
        return True
    # replacement / private-use characters from broken encodings
    junk = sum(1 for c in chars if c == "\ufffd" or "\ue000" <= c <= "\uf8ff")
    if n >= 20 and junk / n > 0.3:
        return True
    runs, share = garbled_ascii_share(text)
    if runs >= 10 and share > 0.25:
        return True
    if 3 <= runs < 10 and share > 0.5:
        return True
    return False


def _image_coverage(page, width: float, height: float) -> float:
    import pypdfium2.raw as pdfium_c

    try:
        x_lo, y_lo, x_hi, y_hi = page.get_cropbox()  # object bounds are in this box's coordinates
    except Exception:
        x_lo, y_lo, x_hi, y_hi = 0.0, 0.0, width, height
    area = max((x_hi - x_lo) * (y_hi - y_lo), 1.0)
    covered = 0.0
    for obj in page.get_objects(max_depth=3):
        if obj.type != pdfium_c.FPDF_PAGEOBJ_IMAGE:
            continue
        try:
            left, bottom, right, top = obj.get_bounds()
        except Exception:
            continue
        w = max(0.0, min(right, x_hi) - max(left, x_lo))
        h = max(0.0, min(top, y_hi) - max(bottom, y_lo))
        covered += w * h
    return min(covered / area, 1.0)


def _uses_non_embedded_font(page) -> bool:
    import pypdfium2.raw as pdfium_c

    for obj in page.get_objects(max_depth=3):
        if obj.type != pdfium_c.FPDF_PAGEOBJ_TEXT:
            continue
        try:
            font = pdfium_c.FPDFTextObj_GetFont(obj.raw)
            if font and not pdfium_c.FPDFFont_GetIsEmbedded(font):
                return True
        except Exception:  # older pdfium without these APIs: assume the worst
            return True
    return False


def probe_page(page, number: int) -> PageProbe:
    """Text layer + verdict for one page (caller holds PDFIUM_LOCK)."""
    width, height = page.get_size()
    textpage = page.get_textpage()
    try:
        raw = textpage.get_text_range()
    finally:
        textpage.close()
    text = normalize_text(raw)
    n_chars = sum(1 for c in text if not c.isspace())
    if n_chars and is_garbled(text):
        verdict = "garbled"
    elif n_chars < MIN_TEXT_CHARS:  # images measured only where they decide (object walks cost on big documents)
        coverage = _image_coverage(page, width, height)
        verdict = "scan" if coverage >= MIN_IMAGE_COVERAGE else ("ok" if n_chars else "empty")
    else:
        verdict = "ok"
    needs_font = False
    if verdict == "garbled" or (verdict == "scan" and _CJK_RE.search(text) is not None):
        needs_font = _uses_non_embedded_font(page)
    rules = _path_objects(page) if verdict == "ok" else 0
    return PageProbe(number, text, verdict, needs_font, rules)


def _path_objects(page, stop_at: int = pdf_tables.MIN_RULE_PATHS) -> int:
    """How many path objects the page draws (counting stops at `stop_at`: only the threshold matters)."""
    import pypdfium2.raw as pdfium_c

    n = 0
    for obj in page.get_objects(max_depth=3):
        if obj.type == pdfium_c.FPDF_PAGEOBJ_PATH:
            n += 1
            if n >= stop_at:
                break
    return n


# --- header / footer ---------------------------------------------------------------------------------

_DIGITS_RE = re.compile(r"\d+")
_WS_RE = re.compile(r"\s+")


def _line_key(line: str) -> str:
    return _DIGITS_RE.sub("#", _WS_RE.sub("", line))


def strip_repeated_lines(texts: list[str], edge: int = 2) -> list[str]:
    """Removes header/footer lines: among the first/last `edge` lines of each page, lines that (digits
    ignored) repeat on ≥ 60% of the pages (at least 3). Only documents with ≥ 3 pages of text."""
    pages = [t.split("\n") for t in texts]
    with_text = [p for p in pages if any(x.strip() for x in p)]
    if len(with_text) < 3:
        return texts
    counts: Counter[str] = Counter()
    for lines in pages:
        keys = {_line_key(x) for x in _edge_lines(lines, edge) if x.strip()}
        counts.update(keys)
    threshold = max(3, math.ceil(0.6 * len(with_text)))
    noisy = {k for k, c in counts.items() if c >= threshold}
    if not noisy:
        return texts
    out = []
    for lines in pages:
        edge_ids = set(_edge_indexes(lines, edge))
        kept = [x for i, x in enumerate(lines) if not (i in edge_ids and _line_key(x) in noisy)]
        # a page made only of "repeated" lines is content (e.g. a one-line page), not a header
        out.append("\n".join(kept).strip() if any(x.strip() for x in kept) else "\n".join(lines).strip())
    return out


def _edge_indexes(lines: list[str], edge: int) -> list[int]:
    idx = [i for i, x in enumerate(lines) if x.strip()]
    return idx[:edge] + idx[-edge:]


def _edge_lines(lines: list[str], edge: int) -> list[str]:
    return [lines[i] for i in _edge_indexes(lines, edge)]


# --- main entry ----------------------------------------------------------------------------------------

def _open(path: Path):
    import pypdfium2 as pdfium

    try:
        return pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == 4:  # FPDF_ERR_PASSWORD
            raise ParseError(R_PDF_ENCRYPTED) from exc
        raise ParseError(R_PDF_BROKEN) from exc
    except (OSError, ValueError) as exc:
        raise ParseError(R_PDF_BROKEN) from exc


def _merge_scan_text(layer: str, ocr_text: str) -> str:
    """Text layer of a low-text page + OCR lines not already in it."""
    if not layer:
        return ocr_text
    flat = _WS_RE.sub("", layer)
    extra = [ln for ln in ocr_text.split("\n") if ln.strip() and _WS_RE.sub("", ln) not in flat]
    return "\n".join([layer, *extra]).strip()


def parse_pdf(
    path: Path,
    *,
    ocr_enabled: bool = True,
    ocr_max_pages: int = 50,
    progress: Callable[[str], None] | None = None,
    warnings: list[str] | None = None,
) -> tuple[list[ParsedPage], int]:
    """Returns (pages with text, number of OCR'd pages). Empty pages are left out."""
    warnings = warnings if warnings is not None else []
    with PDFIUM_LOCK:
        pdf = _open(path)
        try:
            n_pages = len(pdf)
            if n_pages == 0:
                raise ParseError(R_PDF_NO_PAGES)
            if n_pages > MAX_PDF_PAGES:
                raise over_limit("PDF 页数", MAX_PDF_PAGES)
            probes: list[PageProbe] = []
            for i in range(n_pages):
                try:
                    page = pdf[i]
                except Exception as exc:
                    raise ParseError(R_PDF_BROKEN) from exc
                try:
                    probes.append(probe_page(page, i + 1))
                finally:
                    page.close()
        except BaseException:
            pdf.close()
            raise

    try:
        to_ocr = [p for p in probes if p.verdict in ("scan", "garbled")]
        results: dict[int, tuple[str, str]] = {}
        for p in probes:
            if p.verdict in ("ok", "scan") and p.text:
                results[p.number] = (p.text, "text")
        ocr_count = 0
        if to_ocr and not ocr_enabled:
            nums = "、".join(str(p.number) for p in to_ocr)
            warnings.append(f"第 {nums} 页需要 OCR（扫描页或文字层乱码），OCR 已关闭，未提取这些页的文字")
        elif to_ocr:
            if len(to_ocr) > ocr_max_pages:
                raise ParseError(f"需要 OCR 的页数 {len(to_ocr)} 超过上限 {ocr_max_pages}（ocr_max_pages）")
            if any(p.needs_cjk_font for p in to_ocr) and ocr.find_cjk_font() is None:
                raise ParseError(ocr.R_NO_CJK_FONT)
            total = len(to_ocr)
            for k, probe in enumerate(to_ocr, start=1):
                if progress is not None:
                    progress(Progress(f"OCR {k}/{total} 页", "ocr", k, total))
                with PDFIUM_LOCK:
                    page = pdf[probe.number - 1]
                    try:
                        image = ocr.render_page(page)
                    finally:
                        page.close()
                boxes = ocr.ocr_page_image(image)
                ocr_count += 1
                text = normalize_text(ocr.layout_text(boxes))
                if probe.verdict == "scan":
                    text = _merge_scan_text(probe.text, text)
                if text:
                    results[probe.number] = (text, "ocr")
                elif probe.verdict == "scan" and probe.text:
                    results[probe.number] = (probe.text, "text")
    finally:
        with PDFIUM_LOCK:
            pdf.close()

    # ruled tables on text pages (pipeline.ingestion.parsing.pdf_tables): those pages' text comes from pdfplumber
    ruled = [p.number for p in probes if p.rule_paths >= pdf_tables.MIN_RULE_PATHS and p.number in results]
    with_tables = pdf_tables.find_tables(path, ruled)
    for n, (text, _) in with_tables.items():
        results[n] = (text, "text")
    numbers = sorted(results)
    texts = strip_repeated_lines([results[n][0] for n in numbers])
    pages = [ParsedPage(text=t, page=n, source=results[n][1],
                        tables=pdf_tables.table_blocks(t, with_tables[n][1]) if n in with_tables else [])
             for n, t in zip(numbers, texts) if t.strip()]
    return pages, ocr_count
