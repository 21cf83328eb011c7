"""Document viewer over HTTP: the parsed text in parts with each chunk's span, the part holding a cited chunk,
PDF page numbers, OCR pages marked, old versions marked, the original file for download (login checked)."""
from __future__ import annotations

import base64

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.engine import Engine
from tests.live import LiveApp
from tests.shared_data import DOCS, NOVEL, needs

# Marked slow: tests on the `live` app — the packaged e5 model (real quality, minutes on 2 cores).

REPORT = DOCS / "mineru" / "zh_broker_research_report_tables_4p.pdf"
SCAN = DOCS / "mineru" / "zh_scanned_book_2p.pdf"
needs_docs = needs(NOVEL, REPORT, SCAN)  # the tests that read the `docs` fixture

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    policy = AccessPolicy.from_args(["admin:pw", "reader:pw2"], ["admin"])
    app = LiveApp(Engine(tmp_path_factory.mktemp("viewer") / "data"), policy)
    yield app
    app.stop(close_engine=True)


def auth(user: str, pw: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}


@pytest.fixture(scope="module")
def docs(live, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("viewer-src")
    novel = NOVEL.read_bytes().decode("gb18030")[:45_000]
    long_txt = tmp / "三国演义节选.txt"
    long_txt.write_text(novel, encoding="utf-8")
    files = [long_txt, REPORT, SCAN]
    with live.http(headers=auth("admin", "pw")) as http:
        res = http.post("/api/kb/documents", files=[("file", (p.name, p.read_bytes())) for p in files]).json()
    assert res["code"] == 0, res
    assert live.engine.wait_idle(600)
    ids = {r["file_name"]: r["doc_id"] for r in res["data"]}
    for i in ids.values():
        assert live.engine.get_document(i)["status"] == "ready", live.engine.get_document(i)
    return {"txt": ids[long_txt.name], "pdf": ids["zh_broker_research_report_tables_4p.pdf"],
            "scan": ids["zh_scanned_book_2p.pdf"], "paths": files}


def get(live, path, user=("reader", "pw2"), **params):
    with live.http(headers=auth(*user) if user else {}) as http:
        return http.get(path, params=params)


@needs_docs
@pytest.mark.slow
def test_long_text_in_parts_with_chunk_spans(live, docs):
    doc = docs["txt"]
    first = get(live, f"/api/kb/documents/{doc}/text").json()["data"]
    assert first["parts"] >= 3 and first["part"] == 1 and first["page"] is None and first["source"] == "text"
    assert len(first["text"]) <= 20_000
    whole = "".join(get(live, f"/api/kb/documents/{doc}/text", part=k).json()["data"]["text"]
                    for k in range(1, first["parts"] + 1))
    chunks = live.engine.document_chunks(doc)
    assert len(whole) >= chunks[-1]["char_end"]
    for c in chunks:  # every chunk sits in the text exactly where its offsets say
        assert whole[c["char_start"]:c["char_end"]] == c["text"]
    late = chunks[len(chunks) * 3 // 4]
    view = get(live, f"/api/kb/documents/{doc}/text", chunk_id=late["chunk_id"]).json()["data"]
    assert view["part"] > 1 and view["highlight"] == late["chunk_id"]
    span = next(s for s in view["chunks"] if s["chunk_id"] == late["chunk_id"])
    assert view["text"][span["start"]:span["end"]] == late["text"]
    bad = get(live, f"/api/kb/documents/{doc}/text", part=99).json()
    assert bad["code"] == 1001 and bad["data"]["field"] == "part"
    other = docs["pdf"]
    foreign = live.engine.document_chunks(other)[0]["chunk_id"]
    assert get(live, f"/api/kb/documents/{doc}/text", chunk_id=foreign).json()["code"] == 3002
    assert get(live, "/api/kb/documents/99999/text").json()["code"] == 3002


@needs_docs
@pytest.mark.slow
def test_pdf_pages_and_ocr_pages(live, docs):
    chunks = live.engine.document_chunks(docs["pdf"])
    on_p3 = next(c for c in chunks if c["page"] == 3)
    view = get(live, f"/api/kb/documents/{docs['pdf']}/text", chunk_id=on_p3["chunk_id"]).json()["data"]
    assert view["page"] == 3 and view["parts"] >= 4 and view["source"] == "text"
    scan = get(live, f"/api/kb/documents/{docs['scan']}/text").json()["data"]
    assert scan["source"] == "ocr" and scan["page"] == 1 and scan["text"].strip()


@needs_docs
@pytest.mark.slow
def test_viewer_html_marks_passage_page_and_ocr(live, docs):
    from ui.viewer import viewer_html

    c = live.engine.document_chunks(docs["pdf"])[-1]
    html = viewer_html(live.engine.document_text(docs["pdf"], chunk_id=c["chunk_id"]))
    assert f'<mark class="kbv-hl" data-chunk="{c["chunk_id"]}">' in html and f"第 {c['page']} 页" in html
    scan = live.engine.document_chunks(docs["scan"])[0]
    html = viewer_html(live.engine.document_text(docs["scan"], chunk_id=scan["chunk_id"]))
    assert "本页文字由 OCR 识别" in html


@needs_docs
@pytest.mark.slow
def test_file_download_is_login_checked(live, docs):
    path = docs["paths"][1]
    r = get(live, f"/api/kb/documents/{docs['pdf']}/file")
    assert r.status_code == 200 and r.content == path.read_bytes()
    assert r.headers["content-type"] == "application/pdf"
    assert "zh_broker_research_report_tables_4p.pdf" in r.headers["content-disposition"]
    anon = get(live, f"/api/kb/documents/{docs['pdf']}/file", user=None)
    assert anon.status_code == 401 and anon.json()["code"] == 4001
    assert get(live, f"/api/kb/documents/{docs['pdf']}/text", user=None).status_code == 401
    wrong = get(live, f"/api/kb/documents/{docs['pdf']}/file", user=("reader", "nope"))
    assert wrong.status_code == 401
    assert get(live, "/api/kb/documents/99999/file").json()["code"] == 3002


@needs_docs
@pytest.mark.slow
def test_pdf_page_rendered_with_the_passage_boxed(live, docs):
    from PIL import Image

    c = next(c for c in live.engine.document_chunks(docs["pdf"]) if c["page"] == 3)
    r = get(live, f"/api/kb/documents/{docs['pdf']}/page", chunk_id=c["chunk_id"])
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    assert r.headers["x-passage-boxed"] == "1"
    import io

    img = Image.open(io.BytesIO(r.content))
    assert img.width > 500 and img.height > img.width  # a portrait page
    # where the passage is boxed the page has the box's amber pixels; a plain render of the page has none
    plain = Image.open(io.BytesIO(get(live, f"/api/kb/documents/{docs['pdf']}/page", page=3).content))

    def amber(im):  # the pixels as an array: Image.getdata is deprecated (gone in Pillow 14)
        import numpy as np

        r, g, b = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int).T
        return int(((r > 220) & (g > 130) & (g < 190) & (b < 60)).sum())

    assert amber(img) > 200 and amber(plain) < amber(img) / 10
    ocr = live.engine.document_chunks(docs["scan"])[0]
    r = get(live, f"/api/kb/documents/{docs['scan']}/page", chunk_id=ocr["chunk_id"])
    assert r.status_code == 200 and r.headers["x-passage-boxed"] == "0"  # OCR page: no text layer to box from
    assert get(live, f"/api/kb/documents/{docs['txt']}/page").json()["code"] == 1001
    assert get(live, f"/api/kb/documents/{docs['pdf']}/page", page=99).json()["code"] == 1001


def test_passage_found_through_normalization():
    from pipeline.services.page_image import passage_range

    layer = "第一行 ⽤ 于测试\r\n全角 ＡＢＣ 与半角\n结尾"
    assert passage_range(layer, "用于测试 全角ABC与半角") == (layer.index("第") + 4, layer.index("角\n"))
    assert passage_range(layer, "不在这一页") is None
