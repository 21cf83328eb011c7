"""Real OCR (rapidocr + onnxruntime, pages rendered by pypdfium2) on the fixtures in ../shared/docs.

Parse results are cached per session by tests.test_parsing.parse_doc, so each fixture is OCR'd once.
"""
from __future__ import annotations

import os
import re

import pytest

from pipeline.ingestion.parsing import ParseError, parse_file
from pipeline.ingestion.parsing import ocr as ocr_mod
from tests.shared_data import DOCS, needs
from tests.test_parsing import parse_doc

pytestmark = needs(DOCS)
# Marked slow: the tests that run the real rapidocr engine on pages (seconds to a minute each on 2 cores).


def _ok(rel: str, **kw):
    status, doc, msgs = parse_doc(rel, True, **kw)
    assert status == "ok", doc
    return doc, msgs


def test_telemetry_disabled_before_onnxruntime_import():
    assert os.environ.get("ORT_DISABLE_TELEMETRY") == "1"


@pytest.mark.slow
def test_engine_is_lazy_singleton_without_cls_on_two_threads():
    e1 = ocr_mod.get_engine()
    assert ocr_mod.get_engine() is e1
    assert e1.cfg.Global.use_cls is False
    assert e1.cfg.EngineConfig.onnxruntime.intra_op_num_threads == ocr_mod.ocr_threads() == 2


@pytest.mark.slow
def test_scanned_book_2p():
    doc, msgs = _ok("mineru/zh_scanned_book_2p.pdf")
    assert [(p.page, p.source) for p in doc.pages] == [(1, "ocr"), (2, "ocr")]
    assert doc.ocr_pages == 2
    text = "\n".join(p.text for p in doc.pages)
    assert "使用价值" in text and "商品" in text
    assert "交换价值" in doc.pages[1].text
    # footnote lines starting with "（4）"/"(5)" survive (orientation classifier off)
    assert re.search(r"[（(]5[）)]\s*在资产阶级社会中", doc.pages[0].text)
    assert list(msgs) == ["OCR 1/2 页", "OCR 2/2 页"]


@pytest.mark.slow
def test_garbled_text_layer_is_replaced_by_ocr():
    assert ocr_mod.find_cjk_font(), "no CJK font for pdfium: apt-get install fonts-wqy-microhei"
    doc, msgs = _ok("mineru/zh_garbled_textlayer_gbk_bytes_1p.pdf")
    (page,) = doc.pages
    assert page.page == 1 and page.source == "ocr"
    assert "基因外显子" in page.text
    assert re.search(r"图\s*1\s*FHIT\s*基因外显子", page.text)
    assert '!"#$' not in page.text  # mojibake layer discarded
    # two-column reading order: left column (图 2 + its English caption) before right column (图 3, 图 4)
    i2 = re.search(r"图\s*2\s*FHIT", page.text).start()
    i3 = re.search(r"图\s*3\s*FHIT", page.text).start()
    i4 = re.search(r"图\s*4\s*FHIT", page.text).start()
    assert i2 < page.text.index("Fig 2") < page.text.index("node tissue") < i3 < i4
    assert list(msgs) == ["OCR 1/1 页"]


@pytest.mark.slow
def test_mixed_text_and_image_page():
    doc, _ = _ok("chatchat/ocr_test.pdf")
    (page,) = doc.pages
    assert page.source == "ocr"
    assert "我是文字" in page.text  # text layer kept
    assert "竖向文本框" in page.text and "横向文本框" in page.text
    assert page.text.count("我是文字") == 1  # OCR's copy of the text layer line is dropped


@pytest.mark.slow
def test_text_layer_pdf_not_ocrd_with_real_engine(monkeypatch):
    calls = []
    real = ocr_mod.ocr_page_image

    def counting(image):
        calls.append(1)
        return real(image)

    monkeypatch.setattr(ocr_mod, "ocr_page_image", counting)
    doc = parse_file(DOCS / "mineru/zh_union_rules_table_1p.pdf", "pdf", ocr_enabled=True)
    assert doc.ocr_pages == 0 and calls == []
    doc = parse_file(DOCS / "chatchat/ocr_test.pdf", "pdf", ocr_enabled=True)  # control
    assert doc.ocr_pages == 1 and calls == [1]


def test_ocr_budget_on_8_page_scan():
    status, reason, msgs = parse_doc("mineru/zh_scanned_book_8p.pdf", True, 1)
    assert status == "err"
    assert reason == "需要 OCR 的页数 8 超过上限 1（ocr_max_pages）"
    assert msgs == ()


@pytest.mark.slow
def test_scanned_book_8p_full():
    doc, msgs = _ok("mineru/zh_scanned_book_8p.pdf")
    assert [p.page for p in doc.pages] == list(range(1, 9))
    assert all(p.source == "ocr" for p in doc.pages)
    assert list(msgs) == [f"OCR {i}/8 页" for i in range(1, 9)]


@pytest.mark.slow
def test_english_scans():
    doc, _ = _ok("rapidocrpdf/image.pdf")
    assert "Proteomics" in doc.pages[0].text
    doc, _ = _ok("rapidocrpdf/direct_and_image.pdf")
    assert [(p.page, p.source) for p in doc.pages] == [(1, "text"), (2, "ocr")]
    assert len(doc.pages[1].text) > 1000


# --- reading order on synthetic boxes ------------------------------------------------------------------
def B(text, x0, y0, x1, y1):
    return ocr_mod.OcrBox(text, x0, y0, x1, y1)


def test_layout_single_column_and_same_line_pieces():
    boxes = [B("第一章 商", 500, 100, 680, 130), B("品", 750, 100, 790, 130), B("13", 1090, 100, 1130, 130),
             B("第二行文字很长很长", 150, 200, 1150, 235), B("第三行", 150, 260, 600, 295)]
    assert ocr_mod.layout_text(boxes) == "第一章 商品 13\n第二行文字很长很长\n第三行"


def test_layout_two_columns_with_spanning_title():
    boxes = [B("标题横跨两栏", 100, 50, 1300, 90)]
    for i in range(6):
        y = 150 + i * 60
        boxes.append(B(f"左栏第{i}行", 100, y, 650, y + 35))
        boxes.append(B(f"右栏第{i}行", 750, y + 20, 1300, y + 55))  # baselines offset from the left column
    text = ocr_mod.layout_text(boxes).split("\n")
    assert text == ["标题横跨两栏"] + [f"左栏第{i}行" for i in range(6)] + [f"右栏第{i}行" for i in range(6)]


def test_layout_table_rows_stay_rows():
    boxes = []
    for i in range(6):
        y = 100 + i * 50
        boxes += [B(f"项{i}", 100, y, 180, y + 30), B(f"值{i}", 900, y, 960, y + 30)]
    assert ocr_mod.layout_text(boxes).split("\n") == [f"项{i} 值{i}" for i in range(6)]


def test_missing_font_reason_is_a_parse_error(monkeypatch):
    monkeypatch.setattr(ocr_mod, "find_cjk_font", lambda: None)
    with pytest.raises(ParseError) as ei:
        parse_file(DOCS / "mineru/zh_garbled_textlayer_gbk_bytes_1p.pdf", "pdf")
    assert "缺少中文字体" in ei.value.reason and "fonts-wqy-microhei" in ei.value.reason
