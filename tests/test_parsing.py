"""pipeline.ingestion.parsing over the real fixtures in ../shared/docs (never copied into the repo) and over bad inputs.

Every fixture (except LICENSE/MANIFEST/SOURCE and the .jpg) has an expected outcome with OCR off and with
OCR on. Cases needing real OCR are cached per session (`parse_doc`), shared with tests/test_ocr.py; the
ones that take well over 10 s on 2 cores are marked slow.
"""
from __future__ import annotations

import functools
import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.ingestion.parsing import (
    ALLOWED_EXTS,
    MAX_BATCH_FILES,
    MAX_FILE_BYTES,
    ParsedDocument,
    ParseError,
    UploadRefused,
    check_upload,
    normalize_text,
    parse_file,
    sniff_content,
    validate,
)
from pipeline.ingestion.parsing import ocr as ocr_mod
from tests.shared_data import DOCS, needs

pytestmark = needs(DOCS)
NOT_DOCUMENTS = {"LICENSE", "LICENSE.md", "MANIFEST.tsv", "SOURCE.txt"}


# --- expected outcome per fixture ------------------------------------------------------------------
@dataclass(frozen=True)
class Ok:
    needles: tuple[str, ...]
    pages: tuple | None = None  # page numbers in order (None entries for txt/md/docx)
    sources: tuple | None = None  # "text"/"ocr" per page
    encoding: str | None = None
    absent: tuple[str, ...] = ()  # must not appear


@dataclass(frozen=True)
class Fail:
    reason: str


@dataclass(frozen=True)
class Case:
    file_type: str
    off: object  # outcome with ocr_enabled=False
    on: object = None  # outcome with ocr_enabled=True (None → same as off)
    on_slow: bool = False  # real OCR takes well over 10 s here
    refused_upload: str | None = None  # check_upload reason when the extension is not accepted
    notes: list = field(default_factory=list, compare=False, hash=False)


NO_TEXT = Fail("未解析到文本")
KANGXI_AND_RADICALS = tuple(chr(c) for c in range(0x2F00, 0x2FE0)) + tuple(chr(c) for c in range(0x2E80, 0x2F00))

CASES: dict[str, Case] = {
    # chatchat
    "chatchat/ocr_test.docx": Case("docx", Ok(("我是文字", "我是表格1 | 我是表格2", "我是表格3 | 我是表格4"), (None,))),
    "chatchat/ocr_test.pdf": Case(
        "pdf",
        Ok(("我是文字",), (1,), ("text",), absent=("竖向文本框",)),
        Ok(("我是文字", "竖向文本框", "横向文本框"), (1,), ("ocr",)),
    ),
    "chatchat/test.txt": Case("txt", Ok(("ChatGPT是OpenAI开发的一个大型语言模型", "# 如何向 ChatGPT 提问"), (None,),
                                        encoding="utf-8")),
    "chatchat/人民检察院行政诉讼监督规则（试行）(2016-04-15).md": Case(
        "md", Ok(("# 人民检察院行政诉讼监督规则（试行）", "第一条"), (None,), encoding="utf-8")),
    # gbk
    "gbk/chardet_GB2312__ude_1.txt": Case("txt", Ok(("維基大典（Wikipedia）者",), (None,), encoding="gb18030")),
    "gbk/chardet_GB2312_cnblog.org.xml": Case(
        "txt", Ok(("CNBlog:Blog On Blog", "开放图书项目"), (None,), encoding="gb18030"),
        refused_upload="不支持的文件类型 .xml，仅支持 txt / md / pdf / docx / xlsx / csv"),
    "gbk/chardet_GB2312_lily.blogsome.com.xml": Case(
        "txt", Ok(("午后红茶", "十面埋伏"), (None,), encoding="gb18030"),
        refused_upload="不支持的文件类型 .xml，仅支持 txt / md / pdf / docx / xlsx / csv"),
    "gbk/chardet_GB2312_softsea.net.xml": Case(
        "txt", Ok(("系统工具", "免费下载"), (None,), encoding="gb18030"),
        refused_upload="不支持的文件类型 .xml，仅支持 txt / md / pdf / docx / xlsx / csv"),
    "gbk/hongloumeng_gb18030_userdefined_bytes.txt": Case(
        "txt", Ok(("宝玉", "黛玉", "更多TXT电子书下载"), (None,), encoding="gb18030")),
    "gbk/iconv-lite_gbkFile_baidu_html.txt": Case("txt", Ok(("百度一下，你就知道",), (None,), encoding="gb18030",
                                                           absent=("\r",))),
    "gbk/sanguoyanyi_gbk.txt": Case("txt", Ok(("宴桃园豪杰三结义", "滚滚长江东逝水", "刘备"), (None,),
                                              encoding="gb18030")),
    # mineru
    "mineru/zh_broker_research_report_tables_4p.pdf": Case(
        "pdf", Ok(("高测股份(688556.SH)", "金刚线", "信息披露"), (1, 2, 3, 4), ("text",) * 4)),
    "mineru/zh_ccs_ship_rules_table_1p.pdf": Case("pdf", Ok(("智能船舶附加标志", "CCS"), (1,), ("text",))),
    "mineru/zh_chem_symbols_kangxi_radicals_1p.pdf": Case(
        "pdf", Ok(("化学学科常用符号公式", "是用化学式来描述"), (1,), ("text",), absent=KANGXI_AND_RADICALS)),
    "mineru/zh_en_complex_features_8tables.docx": Case(
        "docx", Ok(("MinerU支持docx解析了", "姓名 | MinerU | 曾用名 | 性别 | 一寸照片（不超过50MB）",
                    "Leaves | Ash, Elm, Maple | 50"), (None,))),
    "mineru/zh_garbled_textlayer_gbk_bytes_1p.pdf": Case(
        "pdf", NO_TEXT, Ok(("基因外显子", "FHIT", "琼脂糖电泳图"), (1,), ("ocr",), absent=("!\"#$", ">./?2/"))),
    "mineru/zh_mineru_feature_test.docx": Case(
        "docx", Ok(("mineru测试文档", "操作系统 | Linux 22.04 | Windows10/11 | MacOS 11+"), (None,))),
    "mineru/zh_procurement_contract_template.docx": Case(
        "docx", Ok(("采购合同", "货物 品名 | 规格 型号 | 单位 | 数量", "二、合同总价"), (None,))),
    "mineru/zh_scanned_book_2p.pdf": Case("pdf", NO_TEXT, Ok(("使用价值", "商品"), (1, 2), ("ocr", "ocr"))),
    "mineru/zh_scanned_book_8p.pdf": Case("pdf", NO_TEXT, Ok(("使用价值", "交换价值"), tuple(range(1, 9)), ("ocr",) * 8),
                                          on_slow=True),
    "mineru/zh_union_rules_table_1p.pdf": Case("pdf", Ok(("工会经费审查委员会", "党委【2017】010", "工会主席 | 1 | 全面负责工会工作"), (1,), ("text",))),
    # rapidocrpdf (English)
    "rapidocrpdf/direct_and_image.pdf": Case(
        "pdf", Ok(("ABCNet", "Bezier"), (1,), ("text",)), Ok(("ABCNet",), (1, 2), ("text", "ocr")), on_slow=True),
    "rapidocrpdf/direct_extract.pdf": Case("pdf", Ok(("Offensive Cyberattacks",), (1,), ("text",))),
    "rapidocrpdf/image.pdf": Case("pdf", NO_TEXT, Ok(("Proteomics",), (1,), ("ocr",)), on_slow=True),
}


@functools.cache
def parse_doc(rel: str, ocr_enabled: bool, ocr_max_pages: int = 50):
    """Parses a fixture once per session: ("ok", ParsedDocument, progress messages) or ("err", reason, msgs)."""
    case = CASES[rel]
    msgs: list[str] = []
    try:
        doc = parse_file(DOCS / rel, case.file_type, ocr_enabled=ocr_enabled, ocr_max_pages=ocr_max_pages,
                         progress=msgs.append)
    except ParseError as exc:
        return "err", exc.reason, tuple(msgs)
    return "ok", doc, tuple(msgs)


def assert_outcome(rel: str, outcome, result) -> None:
    status, value, _msgs = result
    if isinstance(outcome, Fail):
        assert status == "err", f"{rel}: expected failure {outcome.reason!r}, parsed {value!r:.200}"
        assert value == outcome.reason
        return
    assert status == "ok", f"{rel}: expected text, failed with {value!r}"
    doc: ParsedDocument = value
    assert doc.file_type == CASES[rel].file_type
    text = "\n".join(p.text for p in doc.pages)
    for needle in outcome.needles:
        assert needle in text, f"{rel}: {needle!r} missing"
    for bad in outcome.absent:
        assert bad not in text, f"{rel}: {bad!r} should not be there"
    if outcome.pages is not None:
        assert tuple(p.page for p in doc.pages) == outcome.pages
    if outcome.sources is not None:
        assert tuple(p.source for p in doc.pages) == outcome.sources
        assert doc.ocr_pages == sum(1 for s in outcome.sources if s == "ocr")
    if outcome.encoding is not None:
        assert doc.encoding == outcome.encoding
    for p in doc.pages:
        assert p.text.strip()
        assert "\r" not in p.text


def _params(ocr_on: bool):
    out = []
    for rel in sorted(CASES):
        marks = [pytest.mark.slow] if ocr_on else []  # OCR on: the real rapidocr engine (loads in seconds, pages take more)
        out.append(pytest.param(rel, marks=marks, id=rel))
    return out


def test_every_fixture_has_an_expected_outcome():
    found = sorted(
        str(p.relative_to(DOCS)) for p in DOCS.rglob("*")
        if p.is_file() and p.name not in NOT_DOCUMENTS and p.suffix.lower() != ".jpg"
    )
    assert found, f"no fixtures under {DOCS}"
    assert found == sorted(CASES), "fixtures and CASES differ"


@pytest.mark.parametrize("rel", _params(False))
def test_fixture_with_ocr_off(rel):
    assert_outcome(rel, CASES[rel].off, parse_doc(rel, False))
    status, _value, msgs = parse_doc(rel, False)
    assert not any(m.startswith("OCR") for m in msgs)


@pytest.mark.parametrize("rel", _params(True))
def test_fixture_with_ocr_on(rel):
    case = CASES[rel]
    assert_outcome(rel, case.on if case.on is not None else case.off, parse_doc(rel, True))


@pytest.mark.parametrize("rel", [r for r, c in sorted(CASES.items()) if c.refused_upload])
def test_non_allowed_extension_fixtures_are_refused_at_upload(rel):
    path = DOCS / rel
    with pytest.raises(UploadRefused) as ei:
        check_upload(path.name, path.stat().st_size)
    assert ei.value.reason == CASES[rel].refused_upload


@pytest.mark.parametrize("rel", [r for r, c in sorted(CASES.items()) if not c.refused_upload])
def test_allowed_fixtures_pass_upload_checks_and_sniffing(rel):
    path = DOCS / rel
    assert check_upload(path.name, path.stat().st_size) == CASES[rel].file_type
    sniff_content(path, CASES[rel].file_type)


# --- details on real files -------------------------------------------------------------------------
def test_kangxi_radicals_are_normalized_to_ordinary_characters():
    import pypdf

    # The fixture's ToUnicode maps 161 glyphs to Kangxi/CJK radicals (pypdf shows them; pdfium happens to
    # return the ordinary ideographs already). Whatever the extractor, the parsed text has none left.
    layer = pypdf.PdfReader(str(DOCS / "mineru/zh_chem_symbols_kangxi_radicals_1p.pdf")).pages[0].extract_text()
    assert "\u2f64" in layer
    assert normalize_text(layer).count("\u2f64") == 0
    _, doc, _ = parse_doc("mineru/zh_chem_symbols_kangxi_radicals_1p.pdf", False)
    parsed = doc.pages[0].text
    assert not any(c in parsed for c in KANGXI_AND_RADICALS) and "常用" in parsed
    # NFKC of pypdf's layer and our page agree on the ideographs
    assert "化学学科常用符号公式" in normalize_text(layer)


def test_gb18030_user_defined_bytes_decode_to_pua():
    data = (DOCS / "gbk/hongloumeng_gb18030_userdefined_bytes.txt").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        data.decode("gbk")
    _, doc, _ = parse_doc("gbk/hongloumeng_gb18030_userdefined_bytes.txt", False)
    assert sum(1 for c in doc.pages[0].text if "\ue000" <= c <= "\uf8ff") == 29


def test_short_gb2312_file_is_not_misdetected():
    data = (DOCS / "gbk/chardet_GB2312__ude_1.txt").read_bytes()
    assert len(data) == 743
    _, doc, _ = parse_doc("gbk/chardet_GB2312__ude_1.txt", False)
    assert doc.pages[0].text.startswith("維基大典")


def test_docx_merged_cells_emitted_once():
    _, doc, _ = parse_doc("mineru/zh_en_complex_features_8tables.docx", False)
    text = doc.pages[0].text
    assert text.count("主申请人-基本情况") == 1  # spans 25 grid columns
    assert text.count("一寸照片（不超过50MB）") == 1  # spans columns and rows
    assert text.count("MinerU | 曾用名") == 1


def test_docx_paragraphs_and_tables_in_document_order():
    _, doc, _ = parse_doc("chatchat/ocr_test.docx", False)
    lines = doc.pages[0].text.split("\n")
    assert lines == ["我是文字", "我是表格1 | 我是表格2", "我是表格3 | 我是表格4"]


def test_pdf_repeated_header_footer_stripped_but_body_kept():
    _, doc, _ = parse_doc("mineru/zh_broker_research_report_tables_4p.pdf", False)
    for p in doc.pages[1:]:
        head = p.text.split("\n")[:2]
        assert not any("请务必阅读正文之后的信息披露和法律声明" in h for h in head), head
        assert not any(h.replace(" ", "").startswith("公司点评高测股份") for h in head), head
    assert "请务必阅读正文之后的信息披露和法律声明" in doc.pages[0].text  # page 1 has it once: kept


def test_full_width_punctuation_kept_and_compat_chars_folded():
    assert normalize_text("⽤（试行）：你好！ＡＢＣ１２３……\r\nx") == "用（试行）：你好！ABC123……\nx"


def test_scanned_page_off_reports_warning():
    _, doc, _ = parse_doc("rapidocrpdf/direct_and_image.pdf", False)
    assert any("第 2 页" in w for w in doc.warnings)


def test_garbled_detection_is_cheap_and_specific():
    import pypdfium2 as pdfium

    from pipeline.ingestion.parsing.pdf import garbled_ascii_share, is_garbled

    for rel in [r for r, c in CASES.items() if r.endswith(".pdf")]:
        pdf = pdfium.PdfDocument(str(DOCS / rel))
        for i in range(len(pdf)):
            t = normalize_text(pdf[i].get_textpage().get_text_range())
            expect = "garbled" in rel
            assert is_garbled(t) == expect, (rel, i + 1, garbled_ascii_share(t))
        pdf.close()
    # GBK bytes read as Latin-1 (what pypdf extracts from the garbled fixture)
    assert is_garbled("Í¼ ! !\"#$ »ùÒòÍâÏÔ×Ó %¡¢&¡¢’¡¢( ºÍÎ¢ÎÀÐÇÔîµÄ )*+ À©Ôö²úÎïÇíÖ¬ÌÇµçÓ¾Í¼")
    assert not is_garbled("Le cœur a ses raisons que la raison ne connaît point. Élève, déjà, façade, où.")


# --- upload checks ---------------------------------------------------------------------------------
def test_constants():
    assert ALLOWED_EXTS == {".txt", ".md", ".pdf", ".docx", ".xlsx", ".csv"}
    assert MAX_FILE_BYTES == 20 * 1024 * 1024
    assert MAX_BATCH_FILES == 10


@pytest.mark.parametrize("name,expected", [
    ("a.txt", "txt"), ("B.MD", "md"), ("报告.PDF", "pdf"), ("x.y.docx", "docx"),
])
def test_check_upload_accepts(name, expected):
    assert check_upload(name, 10) == expected


@pytest.mark.parametrize("name,size,reason", [
    ("virus.exe", 100, "不支持的文件类型 .exe，仅支持 txt / md / pdf / docx / xlsx / csv"),
    ("old.doc", 100, "不支持的文件类型 .doc，仅支持 txt / md / pdf / docx / xlsx / csv"),
    ("noext", 100, "不支持的文件类型 （无扩展名），仅支持 txt / md / pdf / docx / xlsx / csv"),
    ("big.pdf", MAX_FILE_BYTES + 1, "文件超过 20 MB"),
    ("empty.txt", 0, "文件为空"),
])
def test_check_upload_refuses(name, size, reason):
    with pytest.raises(UploadRefused) as ei:
        check_upload(name, size)
    assert ei.value.reason == reason
    assert str(ei.value) == reason


def test_check_upload_limit_is_inclusive():
    assert check_upload("a.pdf", MAX_FILE_BYTES) == "pdf"


# --- bad contents ----------------------------------------------------------------------------------
ELF = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("name,file_type,data,reason", [
    ("elf.txt", "txt", ELF, "文件内容与扩展名不符"),
    ("png.md", "md", PNG, "文件内容与扩展名不符"),
    ("nul.txt", "txt", "正文".encode() + b"\x00\x00\x01\x02" * 50, "文件内容与扩展名不符"),
    ("random.pdf", "pdf", bytes((i * 7919 + 13) % 251 for i in range(4096)), "PDF 文件已损坏或无法读取"),
    ("png.pdf", "pdf", PNG, "文件内容与扩展名不符"),
    ("header_only.pdf", "pdf", b"%PDF-1.7\n" + bytes((i * 31 + 7) % 256 for i in range(5000)),
     "PDF 文件已损坏或无法读取"),
    ("text.docx", "docx", "这不是一个 docx 文件".encode() * 50, "DOCX 文件无效（不是 zip 压缩包）"),
    ("elf.docx", "docx", ELF, "文件内容与扩展名不符"),
    ("ole.docx", "docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(500),
     "文件内容与扩展名不符（这是旧版 Word .doc 文件，请另存为 .docx）"),
    ("empty.txt", "txt", b"", "文件为空"),
    ("empty.pdf", "pdf", b"", "文件为空"),
    ("blank.txt", "txt", b" \r\n\t\n  ", "未解析到文本"),
    ("blank.md", "md", "\ufeff\n\n".encode(), "未解析到文本"),
])
def test_bad_inputs_fail_with_reason(tmp_path, name, file_type, data, reason):
    p = _write(tmp_path, name, data)
    with pytest.raises(ParseError) as ei:
        parse_file(p, file_type)
    assert ei.value.reason == reason


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_truncated_pdf(tmp_path, fraction):
    src = (DOCS / "mineru/zh_union_rules_table_1p.pdf").read_bytes()
    p = _write(tmp_path, "cut.pdf", src[: int(len(src) * fraction)])
    with pytest.raises(ParseError) as ei:
        parse_file(p, "pdf", ocr_enabled=False)
    assert ei.value.reason == "PDF 文件已损坏或无法读取"


def test_encrypted_pdf(tmp_path):
    import pypdf

    w = pypdf.PdfWriter(clone_from=str(DOCS / "mineru/zh_union_rules_table_1p.pdf"))
    w.encrypt("secret", algorithm="RC4-128")
    p = tmp_path / "locked.pdf"
    w.write(str(p))
    with pytest.raises(ParseError) as ei:
        parse_file(p, "pdf")
    assert ei.value.reason == "PDF 文件已加密，无法读取"


def _minimal_docx_members() -> dict[str, bytes]:
    with zipfile.ZipFile(DOCS / "chatchat/ocr_test.docx") as z:
        return {n: z.read(n) for n in z.namelist()}


def test_zip_bomb_docx_ratio(tmp_path):
    p = tmp_path / "bomb.docx"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in _minimal_docx_members().items():
            z.writestr(name, data)
        with z.open("word/media/zeros.bin", "w") as fh:  # 64 MB of zeros → ~64 KB compressed
            chunk = bytes(1024 * 1024)
            for _ in range(64):
                fh.write(chunk)
    assert p.stat().st_size < 1024 * 1024
    with pytest.raises(ParseError) as ei:
        sniff_content(p, "docx")
    assert ei.value.reason == "DOCX 文件解压后体积异常（疑似压缩炸弹）"
    with pytest.raises(ParseError):
        parse_file(p, "docx")


def test_zip_bomb_guard_total_size():
    def info(name, size, csize):
        zi = zipfile.ZipInfo(name)
        zi.file_size, zi.compress_size = size, csize
        return zi

    ok = [info("word/document.xml", 300_000, 50_000), info("word/media/a.png", 5_000_000, 4_900_000)]
    validate.check_zip_bomb(ok)
    big = ok + [info("word/media/b.png", 199 * 1024 * 1024, 150 * 1024 * 1024)]
    with pytest.raises(ParseError):
        validate.check_zip_bomb(big)  # > 200 MB uncompressed in total, even at a sane ratio
    with pytest.raises(ParseError):
        validate.check_zip_bomb([info(f"f{i}", 10, 10) for i in range(validate.MAX_DOCX_ENTRIES + 1)])


def test_zip_without_document_xml(tmp_path):
    p = tmp_path / "x.docx"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ParseError) as ei:
        parse_file(p, "docx")
    assert ei.value.reason == "DOCX 文件无效（缺少 word/document.xml）"


def test_docx_with_broken_document_xml(tmp_path):
    p = tmp_path / "broken.docx"
    members = _minimal_docx_members()
    members["word/document.xml"] = b"<w:document><unclosed"
    with zipfile.ZipFile(p, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(ParseError) as ei:
        parse_file(p, "docx")
    assert ei.value.reason == "DOCX 文件已损坏或无法读取"


def test_docx_built_in_memory_with_merged_cells_and_textbox_free_body(tmp_path):
    import docx

    d = docx.Document()
    d.add_paragraph("第一段")
    t = d.add_table(rows=3, cols=3)
    t.cell(0, 0).merge(t.cell(0, 2)).text = "合并标题"
    t.cell(1, 0).merge(t.cell(2, 0)).text = "纵向合并"
    t.cell(1, 1).text, t.cell(1, 2).text = "甲", "乙"
    t.cell(2, 1).text, t.cell(2, 2).text = "丙", "丁"
    d.add_paragraph("⽤尾段")
    buf = io.BytesIO()
    d.save(buf)
    p = _write(tmp_path, "m.docx", buf.getvalue())
    doc = parse_file(p, "docx")
    assert doc.pages[0].page is None
    assert doc.pages[0].text.split("\n") == ["第一段", "合并标题", "纵向合并 | 甲 | 乙", "丙 | 丁", "用尾段"]


# --- text decoding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("data,encoding", [
    ("中文\r\n第二行\r第三行".encode(), "utf-8"),
    ("\ufeff中文\r\n第二行\r第三行".encode("utf-8"), "utf-8-sig"),
    ("中文\r\n第二行\r第三行".encode("gbk"), "gb18030"),
    ("中文\r\n第二行\r第三行".encode("utf-16"), "utf-16"),
])
def test_text_encodings_and_newlines(tmp_path, data, encoding):
    doc = parse_file(_write(tmp_path, "a.txt", data), "txt")
    assert doc.encoding == encoding
    assert doc.pages[0].text == "中文\n第二行\n第三行"
    assert doc.pages[0].page is None and doc.pages[0].source == "text"


def test_text_is_nfkc_normalized(tmp_path):
    doc = parse_file(_write(tmp_path, "a.md", "# ⽤户⼿册\n\nＡＰＩ 说明：见第①章。".encode()), "md")
    assert doc.pages[0].text == "# 用户手册\n\nAPI 说明：见第1章。"


# --- OCR decision hooks (no real OCR here) ---------------------------------------------------------
def _fake_ocr_factory(calls: list, text: str = "假文字"):
    def fake(image):
        calls.append(getattr(image, "shape", None))
        return [ocr_mod.OcrBox(text, 10, 10, 300, 40)]
    return fake


@pytest.mark.slow
def test_text_layer_pdfs_are_not_ocrd(monkeypatch):
    calls: list = []
    real = ocr_mod.ocr_page_image

    def counting(image):
        calls.append(1)
        return real(image)

    monkeypatch.setattr(ocr_mod, "ocr_page_image", counting)
    text_layer = [r for r, c in CASES.items() if r.endswith(".pdf") and isinstance(c.off, Ok) and c.on is None]
    assert len(text_layer) >= 5
    for rel in text_layer:
        doc = parse_file(DOCS / rel, "pdf", ocr_enabled=True)
        assert doc.ocr_pages == 0 and all(p.source == "text" for p in doc.pages)
    assert calls == []
    # control: the same counting hook does see calls on a scanned file (so the zero above means something)
    monkeypatch.setattr(ocr_mod, "ocr_page_image", _fake_ocr_factory(calls))
    doc = parse_file(DOCS / "mineru/zh_scanned_book_2p.pdf", "pdf")
    assert len(calls) == 2 and doc.ocr_pages == 2
    assert [(p.page, p.source, p.text) for p in doc.pages] == [(1, "ocr", "假文字"), (2, "ocr", "假文字")]


def test_mixed_pdf_only_image_page_goes_to_ocr(monkeypatch):
    calls: list = []
    monkeypatch.setattr(ocr_mod, "ocr_page_image", _fake_ocr_factory(calls, "second page words"))
    msgs: list[str] = []
    doc = parse_file(DOCS / "rapidocrpdf/direct_and_image.pdf", "pdf", progress=msgs.append)
    assert len(calls) == 1
    h, w = calls[0][:2]
    assert max(h, w) == pytest.approx(2000, abs=2)  # rendered with the long side ≈ 2000 px
    assert [(p.page, p.source) for p in doc.pages] == [(1, "text"), (2, "ocr")]
    assert "ABCNet" in doc.pages[0].text and doc.pages[1].text == "second page words"
    assert msgs == ["OCR 1/1 页"]


def test_ocr_progress_and_budget(monkeypatch):
    calls: list = []
    monkeypatch.setattr(ocr_mod, "ocr_page_image", _fake_ocr_factory(calls))
    msgs: list[str] = []
    doc = parse_file(DOCS / "mineru/zh_scanned_book_8p.pdf", "pdf", ocr_max_pages=8, progress=msgs.append)
    assert msgs == [f"OCR {i}/8 页" for i in range(1, 9)]
    assert [p.page for p in doc.pages] == list(range(1, 9))
    calls.clear()
    with pytest.raises(ParseError) as ei:
        parse_file(DOCS / "mineru/zh_scanned_book_8p.pdf", "pdf", ocr_max_pages=7)
    assert ei.value.reason == "需要 OCR 的页数 8 超过上限 7（ocr_max_pages）"
    assert calls == []  # refused before any OCR


def test_ocr_disabled_means_no_ocr_call(monkeypatch):
    calls: list = []
    monkeypatch.setattr(ocr_mod, "ocr_page_image", _fake_ocr_factory(calls))
    with pytest.raises(ParseError) as ei:
        parse_file(DOCS / "mineru/zh_scanned_book_2p.pdf", "pdf", ocr_enabled=False)
    assert ei.value.reason == "未解析到文本" and calls == []


def test_missing_cjk_font_is_reported_not_indexed(monkeypatch):
    calls: list = []
    monkeypatch.setattr(ocr_mod, "ocr_page_image", _fake_ocr_factory(calls))
    monkeypatch.setattr(ocr_mod, "find_cjk_font", lambda: None)
    with pytest.raises(ParseError) as ei:
        parse_file(DOCS / "mineru/zh_garbled_textlayer_gbk_bytes_1p.pdf", "pdf")
    assert ei.value.reason == "缺少中文字体，无法渲染该页用于 OCR（请安装 fonts-wqy-microhei）"
    assert calls == []
    # image-only scans need no font: still OCR'd
    doc = parse_file(DOCS / "mineru/zh_scanned_book_2p.pdf", "pdf")
    assert doc.ocr_pages == 2


def test_low_text_page_keeps_text_layer_and_drops_duplicate_ocr_lines(monkeypatch):
    def fake(image):
        return [ocr_mod.OcrBox("我是文字", 10, 10, 200, 40), ocr_mod.OcrBox("竖向文本框", 10, 60, 200, 90)]

    monkeypatch.setattr(ocr_mod, "ocr_page_image", fake)
    doc = parse_file(DOCS / "chatchat/ocr_test.pdf", "pdf")
    assert doc.pages[0].text == "我是文字\n竖向文本框" and doc.pages[0].source == "ocr"


def test_cjk_font_found():
    assert ocr_mod.find_cjk_font(), "no CJK font for pdfium: apt-get install fonts-wqy-microhei"


def test_text_starting_with_short_ascii_magic_is_still_text(tmp_path):
    doc = parse_file(_write(tmp_path, "mz.txt", "MZ 是某型号的简称。RIFF 也是。".encode()), "txt")
    assert doc.pages[0].text.startswith("MZ 是某型号")
