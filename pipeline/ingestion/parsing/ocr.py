"""OCR of PDF pages: rendering (pypdfium2), recognition (rapidocr on onnxruntime), reading order.

- The engine is created lazily on first use and reused (`get_engine`, an lru_cache'd factory); nothing
  downloads — the rapidocr wheel carries the PP-OCR det/rec models.
- `ocr_page_image` is the single call into the engine. pdf.py calls it as `ocr.ocr_page_image(...)` (module
  attribute lookup), so tests can wrap it with monkeypatch to count or fake OCR calls.
- The orientation classifier is off (`use_cls`): it flipped footnote lines starting with "（3）" and lost them.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

import numpy as np

from .errors import ParseError

OCR_LONG_SIDE_PX = 2000  # both rapidocr and PP-OCR downscale to a 2000 px long side anyway
OCR_MAX_SCALE = 300 / 72  # never render small pages above 300 DPI
R_NO_CJK_FONT = "缺少中文字体，无法渲染该页用于 OCR（请安装 fonts-wqy-microhei）"
R_OCR_UNAVAILABLE = "OCR 组件不可用（需要 rapidocr 与 onnxruntime）"

_ENGINE_LOCK = threading.Lock()  # one OCR at a time: 2 cores, and rapidocr's __call__ mutates its state


@dataclass
class OcrBox:
    text: str
    x0: float
    y0: float
    x1: float
    y1: float
    score: float = 1.0

    @property
    def h(self) -> float:
        return max(self.y1 - self.y0, 1.0)

    @property
    def w(self) -> float:
        return max(self.x1 - self.x0, 1.0)

    @property
    def yc(self) -> float:
        return (self.y0 + self.y1) / 2


def ocr_threads() -> int:
    try:
        return max(1, int(os.environ.get("RAG_OCR_THREADS", "2")))
    except ValueError:
        return 2


@functools.lru_cache(maxsize=1)
def get_engine():
    """The shared RapidOCR instance (created on first use; models load on its first call)."""
    try:
        from rapidocr import RapidOCR
    except Exception as exc:  # ImportError, or onnxruntime/cv2 failing to load
        raise ParseError(R_OCR_UNAVAILABLE) from exc
    threads = ocr_threads()
    return RapidOCR(
        params={
            "Global.use_cls": False,
            "Global.log_level": "warning",
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
    )


def ocr_page_image(image: np.ndarray) -> list[OcrBox]:
    """Runs OCR on one rendered page (H×W×3 BGR uint8). Returns boxes in image pixel coordinates."""
    engine = get_engine()
    try:
        with _ENGINE_LOCK:
            result = engine(image)
    except ParseError:
        raise
    except Exception as exc:
        raise ParseError(f"OCR 失败：{type(exc).__name__}") from exc
    boxes = getattr(result, "boxes", None)
    txts = getattr(result, "txts", None)
    if boxes is None or txts is None:
        return []
    scores = getattr(result, "scores", None) or [1.0] * len(txts)
    out: list[OcrBox] = []
    for quad, text, score in zip(boxes, txts, scores):
        if not text or not str(text).strip():
            continue
        pts = np.asarray(quad, dtype=float).reshape(-1, 2)
        out.append(OcrBox(str(text), float(pts[:, 0].min()), float(pts[:, 1].min()),
                          float(pts[:, 0].max()), float(pts[:, 1].max()), float(score)))
    return out


# --- rendering --------------------------------------------------------------------------------------

def render_scale(width_pt: float, height_pt: float) -> float:
    long_side = max(width_pt, height_pt, 1.0)
    return min(OCR_LONG_SIDE_PX / long_side, OCR_MAX_SCALE)


def render_page(page) -> np.ndarray:
    """Renders a pypdfium2 page to a BGR uint8 array with the long side ≈ 2000 px (caller holds the pdfium lock)."""
    w, h = page.get_size()
    bitmap = page.render(scale=render_scale(w, h), may_draw_forms=True)
    arr = bitmap.to_numpy()
    mode = getattr(bitmap, "mode", "BGR")
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]  # BGRA/BGRX → BGR
    if mode.startswith("RGB"):
        arr = arr[:, :, ::-1]
    return np.ascontiguousarray(arr)


# --- CJK fonts for non-embedded Chinese fonts ---------------------------------------------------------

# Where pdfium's Linux font mapper looks (CFX_LinuxFontInfo / fx_ge_linux.cpp).
PDFIUM_FONT_DIRS = [
    "/usr/share/fonts",
    "/usr/share/X11/fonts/Type1",
    "/usr/share/X11/fonts/TTF",
    "/usr/local/share/fonts",
]
_CJK_FONT_FILE_RE = re.compile(
    r"(wqy|wenquanyi|noto\w*cjk|notosans(sc|tc|hk|jp|kr)|notoserif(sc|tc|hk|jp|kr)|sourcehan|source-han|"
    r"droidsansfallback|ukai|uming|arphic|simsun|simhei|simkai|simfang|msyh|msjh|mingliu|pingfang|stheiti|"
    r"stsong|fzhei|fzsong|hanazono|ipag|ipam|takao|unifont|cwtex|zenhei|microhei|lxgw|sarasa)",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=1)
def find_cjk_font() -> str | None:
    """Path of a CJK-capable font file in a directory pdfium scans, or None.

    pdfium maps non-embedded fonts (e.g. a PDF naming 宋体 without embedding it) onto system fonts by
    charset; with no CJK font installed, CJK glyphs render blank and OCR reads nothing."""
    for d in PDFIUM_FONT_DIRS:
        for path in glob.glob(os.path.join(d, "**", "*"), recursive=True):
            name = os.path.basename(path)
            if name.lower().endswith((".ttf", ".ttc", ".otf", ".otc")) and _CJK_FONT_FILE_RE.search(name):
                return path
    # Any other font fontconfig knows to cover Chinese, as long as it lives where pdfium looks.
    if shutil.which("fc-list"):
        try:
            out = subprocess.run(["fc-list", ":lang=zh", "file"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            path = line.split(":", 1)[0].strip()
            if any(path.startswith(d + "/") for d in PDFIUM_FONT_DIRS):
                return path
    return None


# --- reading order ------------------------------------------------------------------------------------

_CJK_RE = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")


def _join_pieces(left: str, right: str) -> str:
    if not left:
        return right
    if _CJK_RE.match(left[-1]) and _CJK_RE.match(right[0]):
        return left + right
    return left + " " + right


def _group_lines(boxes: list[OcrBox]) -> list[list[OcrBox]]:
    """Groups boxes into text lines (vertical overlap ≥ half the smaller height), top to bottom."""
    lines: list[list[OcrBox]] = []
    for b in sorted(boxes, key=lambda b: (b.yc, b.x0)):
        placed = False
        for line in reversed(lines[-3:]):
            ly0 = min(x.y0 for x in line)
            ly1 = max(x.y1 for x in line)
            overlap = min(ly1, b.y1) - max(ly0, b.y0)
            if overlap >= 0.5 * min(b.h, ly1 - ly0):
                line.append(b)
                placed = True
                break
        if not placed:
            lines.append([b])
    for line in lines:
        line.sort(key=lambda b: b.x0)
    lines.sort(key=lambda ln: min(b.yc for b in ln))
    return lines


def _lines_text(boxes: list[OcrBox]) -> list[str]:
    out = []
    for line in _group_lines(boxes):
        text = ""
        for b in line:
            text = _join_pieces(text, b.text.strip())
        if text:
            out.append(text)
    return out


def _find_gutter(boxes: list[OcrBox]) -> float | None:
    """x of a vertical gap splitting the page into two columns, or None for a single-column layout."""
    if len(boxes) < 8:
        return None
    x_min = min(b.x0 for b in boxes)
    x_max = max(b.x1 for b in boxes)
    width = x_max - x_min
    if width <= 0:
        return None
    steps = 60
    xs = [x_min + width * (0.25 + 0.5 * i / steps) for i in range(steps + 1)]
    crossings = [sum(1 for b in boxes if b.x0 < x < b.x1) for x in xs]
    best_cross = min(crossings)
    # middle of the longest run of positions with the fewest crossings = the middle of the gap
    runs: list[list[int]] = []
    for i, c in enumerate(crossings):
        if c == best_cross:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    run = max(runs, key=len)
    best_x = xs[run[len(run) // 2]]
    left = [b for b in boxes if b.x1 <= best_x]
    right = [b for b in boxes if b.x0 >= best_x]
    if len(left) < 4 or len(right) < 4 or best_cross > 0.15 * len(boxes):
        return None
    # the two sides must really sit side by side (vertical extents overlap substantially)
    l0, l1 = min(b.y0 for b in left), max(b.y1 for b in left)
    r0, r1 = min(b.y0 for b in right), max(b.y1 for b in right)
    overlap = min(l1, r1) - max(l0, r0)
    if overlap < 0.3 * min(l1 - l0, r1 - r0):
        return None
    # Tables: cells on both sides share rows and do not fill their side. Two text columns fill their width
    # (their lines may share a baseline grid too, so alignment alone does not decide).
    def fill(side: list[OcrBox], lo: float, hi: float) -> float:
        widths = sorted(b.w for b in side)
        return widths[len(widths) // 2] / max(hi - lo, 1.0)

    def aligned(a: list[OcrBox], b: list[OcrBox]) -> float:
        hits = sum(1 for x in a if any(min(x.y1, y.y1) - max(x.y0, y.y0) >= 0.5 * min(x.h, y.h) for y in b))
        return hits / len(a)

    if (aligned(left, right) > 0.6 and aligned(right, left) > 0.6
            and fill(left, x_min, best_x) < 0.6 and fill(right, best_x, x_max) < 0.6):
        return None
    return best_x


def layout_text(boxes: list[OcrBox]) -> str:
    """Joins OCR boxes into text in reading order. Two-column pages (e.g. a broker report's sidebar + body)
    are read column by column; full-width lines (titles, spanning paragraphs) split the page into bands."""
    if not boxes:
        return ""
    gutter = _find_gutter(boxes)
    if gutter is None:
        return "\n".join(_lines_text(boxes))
    spanning = sorted((b for b in boxes if b.x0 < gutter < b.x1), key=lambda b: b.yc)
    rest = [b for b in boxes if not (b.x0 < gutter < b.x1)]
    out: list[str] = []
    band_top = float("-inf")
    for cut in [*spanning, None]:
        band_bottom = cut.yc if cut is not None else float("inf")
        band = [b for b in rest if band_top <= b.yc < band_bottom]
        out.extend(_lines_text([b for b in band if b.x1 <= gutter or (b.x0 + b.x1) / 2 < gutter]))
        out.extend(_lines_text([b for b in band if not (b.x1 <= gutter or (b.x0 + b.x1) / 2 < gutter)]))
        if cut is not None:
            out.extend(_lines_text([cut]))
        band_top = band_bottom
    return "\n".join(out)
