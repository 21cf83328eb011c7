"""Tables and structure: Markdown sections + tables, .xlsx / .csv sheets, DOCX tables — rows never cut, every
table chunk repeats its header, the heading path / sheet name travels as context. Real files (written here with
openpyxl / csv, or from ../shared/docs), the real parsers and the real chunker; the engine test ingests them."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipeline.generation.articles import HEADING
from pipeline.ingestion.chunking import split_text
from pipeline.ingestion.parsing import ParseError, parse_file, sniff_content
from pipeline.ingestion.structured_chunking import chunk_page, indexed_text, split_prose
from tests.shared_data import DATA, DOCS, RULES, needs
from tests.table_files import COMPONENT_ROWS, SALES_HEADER, write_csv, write_readme, write_workbook

# Marked slow: the test on the `engine` fixture — the packaged e5 model (real quality, minutes on 2 cores).

pytestmark = needs(DOCS)
SIZE, OVERLAP = 300, 50


def pieces_of(path: Path, file_type: str, size: int = SIZE):
    doc = parse_file(path, file_type)
    return doc, [(page, pc) for page in doc.pages for pc in chunk_page(page, size, OVERLAP)]


def assert_rows_whole(page, pieces, size: int = SIZE):
    """Every table piece = the header rows + whole body rows of that table, in order, none twice. (A header
    wider than half a chunk opens only the first piece; a table of header rows only is plain text.)"""
    for table in page.tables:
        rows = [page.text[s:e] for s, e in table.rows]
        header = rows[: table.header_rows]
        body = rows[table.header_rows:]
        mine = [pc for pc in pieces if table.start <= pc.start < table.end]
        assert mine, "table produced no chunk"
        if not body:
            continue
        repeated = len("\n".join(header)) <= size // 2
        seen: list[str] = []
        for k, pc in enumerate(mine):
            lines = pc.text.split("\n")
            if repeated or k == 0:
                assert lines[: len(header)] == header, f"header not repeated: {pc.text[:80]!r}"
                lines = lines[len(header):]
            assert lines and all(line in body for line in lines), "a line of the chunk is not a whole row"
            seen += lines
        assert seen == body, "rows lost, reordered or repeated"


# --- Markdown -----------------------------------------------------------------------------------------------
def test_markdown_sections_and_table(tmp_path):
    doc, pieces = pieces_of(write_readme(tmp_path / "README.md"), "md")
    page = doc.pages[0]
    titles = [(h.level, h.title) for h in page.headings]
    assert titles == [(1, "星河网关 用户手册"), (2, "安装"), (3, "系统要求"), (3, "安装步骤"), (2, "配置"),
                      (3, "限流"), (2, "常见问题")]  # the '#' inside the code fence is no heading
    assert len(page.tables) == 1 and page.tables[0].header_rows == 2  # the fenced '|' line is no table
    assert_rows_whole(page, [pc for _, pc in pieces])
    table_pieces = [pc for _, pc in pieces if pc.text.startswith("| 组件 |")]
    assert len(table_pieces) >= 4  # 40 rows do not fit one chunk: the header is repeated on each
    assert all(pc.context == "星河网关 用户手册 › 安装 › 系统要求" for pc in table_pieces)
    assert all(len(pc.text) <= SIZE for pc in table_pieces)
    by_text = {pc.text.split("\n")[-1]: pc.context for _, pc in pieces}
    assert by_text["端口被占用时，修改 gateway.conf 中的 listen 项。"] == "星河网关 用户手册 › 常见问题"
    limit = next(pc for _, pc in pieces if "limits.yaml" in pc.text)
    assert limit.context == "星河网关 用户手册 › 配置 › 限流"
    assert "# 这一行在代码块里" in limit.text  # the code block stays with its section
    # a chunk never spans two sections, and the text a chunk shows is the text at its span
    for _, pc in pieces:
        if not pc.text.startswith("| 组件 |") or pc.start == page.tables[0].start:
            assert page.text[pc.start:pc.end] == pc.text
    assert not any(pc.text.strip() in ("## 安装", "### 系统要求") for _, pc in pieces)  # no title-only chunks


def test_markdown_context_is_indexed_with_the_text():
    assert indexed_text("正文", "第一章 › 第二节") == "第一章 › 第二节\n正文"
    assert indexed_text("正文", None) == "正文"


def test_real_markdown_file_follows_its_chapters():
    path = RULES
    doc, pieces = pieces_of(path, "md")
    contexts = {pc.context for _, pc in pieces}
    assert "人民检察院行政诉讼监督规则（试行） › 第二章 受 理" in contexts
    art5 = next(pc for _, pc in pieces if "第五条 有下列情形之一" in pc.text)
    assert art5.context.endswith("第二章 受 理")
    assert all(len(pc.text) <= SIZE for _, pc in pieces)


def test_plain_text_chunks_exactly_as_before(tmp_path):
    path = DOCS / "chatchat" / "test.txt"
    doc, pieces = pieces_of(path, "txt")
    text = doc.pages[0].text
    assert [(pc.start, pc.end) for _, pc in pieces] == split_text(text, SIZE, OVERLAP)
    assert all(pc.context is None for _, pc in pieces)


# --- articles (laws, regulations, contracts) ---------------------------------------------------------------
def _article_spans(text: str) -> list[tuple[int, int]]:
    starts = [m.start() for m in HEADING.finditer(text)]
    heads = [i for i in (text.find("\n#", a) for a in starts) if i >= 0]  # an article ends at the next heading too
    return [(a, min([b, *[h for h in heads if a < h < b]])) for a, b in zip(starts, starts[1:] + [len(text)])]


def _assert_short_articles_whole(text: str, pieces) -> None:
    """Every article shorter than a chunk (more than 20 of them) lies whole in exactly one chunk."""
    short = [(a, b) for a, b in _article_spans(text) if len(text[a:b].strip()) <= SIZE]
    assert len(short) > 20
    for a, b in short:
        body = text[a:b].strip()
        assert len([pc for _, pc in pieces if body in pc.text]) == 1, f"article split or repeated: {body[:30]!r}"


@pytest.mark.parametrize("path", [RULES, DATA / "regulations" / "人民币管理条例(2018-03-19).md"], ids=["rules", "rmb"])
def test_real_regulation_is_cut_between_articles(path):
    """Every article shorter than a chunk lies whole in one chunk; a chunk starts at an article, a heading or its
    section's first line — never inside a short article."""
    if not path.exists():
        pytest.skip(f"{path} not present")
    doc, pieces = pieces_of(path, "md")
    _assert_short_articles_whole(doc.pages[0].text, pieces)
    assert all(len(pc.text) <= SIZE for _, pc in pieces)


def test_plain_text_law_is_cut_between_articles_too(tmp_path):
    """A .txt page has no headings: made of articles, it is cut between them as a Markdown section is."""
    src = DATA / "regulations" / "人民币管理条例(2018-03-19).md"
    if not src.exists():
        pytest.skip(f"{src} not present")
    path = tmp_path / "人民币管理条例.txt"
    path.write_text(src.read_text(encoding="utf-8").replace("#", ""), encoding="utf-8")
    doc, pieces = pieces_of(path, "txt")
    text = doc.pages[0].text
    assert not doc.pages[0].headings
    _assert_short_articles_whole(text, pieces)


def test_articles_packed_whole_and_a_long_one_cut_inside():
    arts = [f"第{n}条 " + "本条规定某一事项的具体办法。" * k
            for n, k in (("一", 3), ("二", 5), ("三", 30), ("四", 2), ("五", 2))]
    text = "总则说明。\n\n" + "\n\n".join(arts)
    pieces = [text[s:e] for s, e in split_prose(text, 120, 20)]
    assert pieces[0] == "总则说明。\n\n" + arts[0]     # what precedes the first article opens the first piece
    assert pieces[1] == arts[1]                        # 一 and 二 together pass 120 characters
    inside = pieces[2:-1]                              # 三 (424 characters) cut inside, as any prose
    assert len(inside) > 1 and inside[0].startswith("第三条") and all(p in arts[2] for p in inside)
    assert pieces[-1] == arts[3] + "\n\n" + arts[4]      # two short ones that fit together share a piece
    assert all(len(p) <= 120 for p in pieces)
    # one 「第…条」 line is a quotation, not a list of articles: cut as before
    quoted = "依照本法\n第五条 的规定办理。" + "其他说明。" * 40
    assert split_prose(quoted, 120, 20) == split_text(quoted, 120, 20)


# --- spreadsheets -------------------------------------------------------------------------------------------
def test_xlsx_sheets_header_repeated_formulas_as_values(tmp_path):
    path = tmp_path / "订单.xlsx"
    values = write_workbook(path)
    doc, pieces = pieces_of(path, "xlsx")
    assert [p.context for p in doc.pages] == ["工作表「销售」", "工作表「说明」"]  # 空表 skipped …
    assert any("工作表「空表」为空，已跳过" in w for w in doc.warnings)  # … with a note
    assert any("1 个公式单元格没有保存计算结果" in w for w in doc.warnings)  # =SUM never calculated
    sales = doc.pages[0]
    header = " | ".join(SALES_HEADER)
    assert sales.text.split("\n")[0] == header
    assert "SO-1000 | 客户0公司 | 路由器 | 100 | 1 | 100" in sales.text  # cached value, not "=D2*E2"
    assert "=D" not in sales.text and str(values["F61"]) in sales.text
    sales_pieces = [pc for page, pc in pieces if page is sales]
    assert len(sales_pieces) >= 4
    assert_rows_whole(sales, sales_pieces)
    assert all(pc.context == "工作表「销售」" for pc in sales_pieces)
    notes = doc.pages[1]
    assert notes.text == "项目 | 内容\n统计口径 | 含税金额\n合计"  # the uncalculated formula shows empty


def test_csv_delimiter_and_encoding_sniffed(tmp_path):
    path = write_csv(tmp_path / "门店.csv")
    sniff_content(path, "csv")
    doc, pieces = pieces_of(path, "csv")
    assert doc.encoding == "gb18030"
    page = doc.pages[0]
    assert page.text.startswith("城市 | 门店 | 地址 | 电话\n城市0 | 第0号门店 | 人民路0号；靠近地铁0号线 | 0571-88880000")
    assert len(pieces) >= 3
    assert_rows_whole(page, [pc for _, pc in pieces])


def test_long_row_stays_whole(tmp_path):
    path = tmp_path / "长行.csv"
    long_cell = "很长的备注" * 80  # 400 characters: longer than a chunk
    path.write_text(f"编号,备注\n1,短\n2,{long_cell}\n3,短\n", encoding="utf-8")
    doc, pieces = pieces_of(path, "csv")
    assert_rows_whole(doc.pages[0], [pc for _, pc in pieces])
    big = [pc for _, pc in pieces if long_cell in pc.text]
    assert len(big) == 1 and big[0].text == f"编号 | 备注\n2 | {long_cell}"


@pytest.mark.parametrize("name,data,reason", [
    ("broken.xlsx", b"PK\x03\x04" + b"\0" * 200, "XLSX 文件无效（不是 zip 压缩包）"),
    ("old.xlsx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 200, "旧版 Excel .xls"),
    ("text.xlsx", "不是表格".encode() * 20, "XLSX 文件无效（不是 zip 压缩包）"),
])
def test_bad_workbooks_fail_with_reason(tmp_path, name, data, reason):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ParseError) as ei:
        parse_file(path, "xlsx")
    assert reason in ei.value.reason


def test_corrupt_workbook_parts_fail_with_reason(tmp_path):
    good = tmp_path / "good.xlsx"
    write_workbook(good, n=3)
    no_wb = tmp_path / "no_workbook.xlsx"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(no_wb, "w") as zout:
        for info in zin.infolist():
            if info.filename != "xl/workbook.xml":
                zout.writestr(info, zin.read(info.filename))
    with pytest.raises(ParseError) as ei:
        parse_file(no_wb, "xlsx")
    assert ei.value.reason == "XLSX 文件无效（缺少 xl/workbook.xml）"
    garbled = tmp_path / "garbled.xlsx"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(garbled, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, b"<worksheet><sheetData><row" if info.filename.endswith("sheet1.xml") else data)
    with pytest.raises(ParseError) as ei:
        parse_file(garbled, "xlsx")
    assert ei.value.reason.startswith("XLSX 文件已损坏或无法读取")


def test_workbook_with_only_empty_sheets(tmp_path):
    import openpyxl

    path = tmp_path / "empty.xlsx"
    wb = openpyxl.Workbook()
    wb.create_sheet("第二页")
    wb.save(path)
    with pytest.raises(ParseError) as ei:
        parse_file(path, "xlsx")
    assert ei.value.reason == "工作簿中没有非空的工作表"


# --- DOCX ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["zh_en_complex_features_8tables.docx", "zh_procurement_contract_template.docx"])
def test_docx_tables_rows_whole(name):
    doc, pieces = pieces_of(DOCS / "mineru" / name, "docx")
    page = doc.pages[0]
    assert page.tables, "tables not recorded"
    assert_rows_whole(page, [pc for _, pc in pieces])


# --- PDF (pdfplumber finds ruled tables on text-layer pages) --------------------------------------------------
def test_pdf_ruled_table_rows_whole_header_repeated():
    """A real text-layer PDF with a ruled 3-column table: its rows become a TableBlock; cut at a small chunk
    size, every chunk starts with the header row and holds only whole rows."""
    doc, pieces = pieces_of(DOCS / "mineru" / "zh_union_rules_table_1p.pdf", "pdf", size=70)
    page = doc.pages[0]
    assert len(page.tables) == 1 and len(page.tables[0].rows) == 8
    rows = [page.text[s:e] for s, e in page.tables[0].rows]
    assert rows[0] == "职位 | 人数 | 工作职责" and rows[1] == "工会主席 | 1 | 全面负责工会工作"
    table_pieces = [pc for _, pc in pieces if page.tables[0].start <= pc.start < page.tables[0].end]
    assert len(table_pieces) >= 3  # small chunks: the header really is repeated, not just present once
    assert_rows_whole(page, [pc for _, pc in pieces], size=70)
    assert any("第一条" in pc.text or "工会" in pc.text for _, pc in pieces if pc not in table_pieces)  # prose kept


def test_pdf_merged_cells_and_layout_frames():
    """A rating table whose row labels span several rows repeats the label on each row; the page frames of a
    research report (boxes drawn around text blocks) are not tables, and a page without rulings keeps pdfium's
    text exactly."""
    doc = parse_file(DOCS / "mineru" / "zh_broker_research_report_tables_4p.pdf", "pdf")
    tables = {p.page: p for p in doc.pages if p.tables}
    assert set(tables) == {4}
    rows = [tables[4].text[s:e] for s, e in tables[4].tables[0].rows]
    assert rows[:3] == ["类别 | 评级", "股票投资评级 | 买入", "股票投资评级 | 增持"]
    import pypdfium2 as pdfium

    from pipeline.ingestion.parsing.pdf import probe_page
    from pipeline.ingestion.parsing.pdf_tables import MIN_RULE_PATHS

    path = DOCS / "rapidocrpdf" / "direct_extract.pdf"
    pdf = pdfium.PdfDocument(str(path))
    probe = probe_page(pdf[0], 1)
    pdf.close()
    plain = parse_file(path, "pdf")
    assert probe.rule_paths < MIN_RULE_PATHS and not plain.pages[0].tables
    assert plain.pages[0].text == probe.text  # pdfium's text layer, untouched


# --- through the engine -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from pipeline.engine import Engine

    e = Engine(tmp_path_factory.mktemp("tables") / "data")
    yield e
    e.close()


@pytest.mark.slow
def test_engine_ingests_sheets_and_markdown_with_context(engine, tmp_path):
    xlsx = tmp_path / "订单.xlsx"
    write_workbook(xlsx)
    md = write_readme(tmp_path / "README.md")
    csv_path = write_csv(tmp_path / "门店.csv")
    res = engine.upload([(p.name, p) for p in (xlsx, md, csv_path)])
    assert all(r.ok and not r.existed for r in res), res
    assert engine.wait_idle(300)
    docs = {d["file_name"]: d for d in engine.list_documents(size=50)["items"]}
    assert {docs[n]["status"] for n in ("订单.xlsx", "README.md", "门店.csv")} == {"ready"}
    assert "工作表「空表」为空，已跳过" in docs["订单.xlsx"]["note"]
    chunks = engine.document_chunks(docs["订单.xlsx"]["doc_id"])
    assert {c["context"] for c in chunks} == {"工作表「销售」", "工作表「说明」"}
    assert all(c["text"].startswith(" | ".join(SALES_HEADER)) for c in chunks if c["context"] == "工作表「销售」")
    md_chunks = engine.document_chunks(docs["README.md"]["doc_id"])
    assert any(c["context"] == "星河网关 用户手册 › 安装 › 系统要求" and c["text"].startswith("| 组件 |")
               for c in md_chunks)
    # a row is found by its values, and the source carries the sheet / heading path
    hits = engine.search("SO-1042 交换机", 5)["bm25"]
    assert hits and "SO-1042" in hits[0]["text"] and hits[0]["text"].startswith("订单号 | 客户")
    res = engine.retrieve("组件17 的最低版本是多少")
    ctx = [n.node.metadata.get("context") for n in res.final]
    assert "星河网关 用户手册 › 安装 › 系统要求" in ctx
    assert COMPONENT_ROWS[17] in "".join(n.node.get_content() for n in res.final)
