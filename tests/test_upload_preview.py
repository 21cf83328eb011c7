"""预览分块 over real HTTP on a real engine (SQLite + embedded Chroma, the tiny embedding): a preview parses the file
in the parse worker and cuts it with the knowledge base's chunking, and stores nothing — every SQLite table, every
Chroma collection, the originals' folder and the BM25 folders are the same after it; the chunks it shows are the
chunks the ingest of the same file stores; values tried in the preview are not saved; only KB admins may preview."""
from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from pipeline.access.policy import AccessPolicy
from store.schema import metadata
from tests.live import LiveApp, backgrounds_measured
from tests.shared_data import DOCS, RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

DOCX = DOCS / "mineru" / "zh_procurement_contract_template.docx"  # headings and tables (MANIFEST.tsv)
pytestmark = needs(RULES, DOCX)


def auth(user: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


def ok(resp) -> dict:
    body = resp.json()
    assert body["code"] == 0, body
    return body["data"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preview")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    kb = engine.create_kb("合同", "")["kb_id"]
    note = tmp / "已有.txt"
    note.write_text("仓库的备用钥匙放在值班室。" * 40, encoding="utf-8")
    assert all(r.ok for r in engine.upload([(note.name, note)], kb_id=kb))  # the stores are not empty
    wait_idle(engine)
    backgrounds_measured(engine, (kb,))  # the no-answer gate's background, measured after an ingest, is stored now
    policy = AccessPolicy.from_args([f"{u}:pw-{u}" for u in ("boss", "bob")], kb_admins=["boss"])
    app = LiveApp(engine, policy, owns_engine=True)
    app.kb, app.policy = kb, policy
    yield app
    app.stop()


def snapshot(engine) -> dict:
    """Everything an ingest would touch: row counts of every table, each collection's count, and the files
    (with sizes and modification times) under the originals' folder and the BM25 folders."""
    c = engine.components
    with c.db.connect() as conn:
        rows = {t.name: conn.execute(select(func.count()).select_from(t)).scalar() for t in metadata.sorted_tables}
    vectors = {kb.kb_id: kb.vectors.count() for kb in c.kbs.all()}

    def listing(root: Path) -> dict:
        return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
                for p in sorted(root.rglob("*")) if p.is_file()}

    files = listing(Path(c.files.root)) if Path(c.files.root).exists() else {}
    bm25 = {name: listing(c.data_dir / name) for name in os.listdir(c.data_dir)
            if (c.data_dir / name).is_dir() and name.startswith("bm25")}
    return {"rows": rows, "vectors": vectors, "files": files, "bm25": bm25}


def preview(http, kb: int, path: Path, **tried):
    return http.post(f"/api/kbs/{kb}/preview", files={"file": (path.name, path.read_bytes())},
                     data={k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in tried.items()})


def test_preview_stores_nothing(live):
    before = snapshot(live.engine)
    assert before["rows"]["kb_document"] == 1 and sum(before["vectors"].values()) > 0
    with live.http(headers=auth("boss")) as http:
        shown = ok(preview(http, live.kb, RULES))
        tried = ok(preview(http, live.kb, DOCX, chunk_size=120, chunk_overlap=10, chunk_structure=False))
        settings = ok(http.get(f"/api/kbs/{live.kb}/chunking"))
    assert shown["count"] > 5 and shown["file_type"] == "md" and shown["existing"] is None
    assert all(ch["length"] == len(ch["text"]) <= 300 for ch in shown["chunks"])
    assert any(ch["context"] for ch in shown["chunks"])  # the regulation's headings travel as context
    assert tried["chunking"] == {"chunk_size": 120, "chunk_overlap": 10, "chunk_structure": False}
    assert all(len(ch["text"]) <= 120 and ch["context"] is None for ch in tried["chunks"])
    assert settings["overrides"] == {}  # values tried in a preview are not saved
    assert snapshot(live.engine) == before


def test_preview_is_what_the_ingest_stores(live):
    with live.http(headers=auth("boss")) as http:
        shown = {p.name: ok(preview(http, live.kb, p)) for p in (RULES, DOCX)}
        up = ok(http.post("/api/kb/documents", params={"kb_id": live.kb},
                          files=[("file", (p.name, p.read_bytes())) for p in (RULES, DOCX)]))
    wait_idle(live.engine)
    for res in up:
        stored = live.engine.document_chunks(res["doc_id"])
        want = shown[res["file_name"]]
        assert want["count"] == len(stored) > 0
        assert [(c["text"], c["context"], c["page"]) for c in stored] == \
            [(c["text"], c["context"], c["page"]) for c in want["chunks"]]
    with live.http(headers=auth("boss")) as http:
        again = ok(preview(http, live.kb, RULES))
    assert again["existing"] == next(r["doc_id"] for r in up if r["file_name"] == RULES.name)


def test_preview_refusals_and_permissions(live, tmp_path):
    bad = tmp_path / "程序.exe"
    bad.write_bytes(b"MZ" + b"\0" * 100)
    with live.http(headers=auth("boss")) as http:
        r = preview(http, live.kb, bad).json()
        assert r["code"] == 1001 and r["data"]["field"] == "file"
        r = preview(http, live.kb, RULES, chunk_size=10).json()
        assert r["code"] == 1001 and "50–2000" in r["msg"]
        assert preview(http, 9999, RULES).json()["code"] == 3002
    before = snapshot(live.engine)
    with live.http(headers=auth("bob")) as http:  # a reader, not a KB admin
        r = preview(http, live.kb, RULES)
        assert r.status_code == 403 and r.json()["code"] == 4003
    with live.http() as http:
        assert preview(http, live.kb, RULES).status_code == 401
    assert snapshot(live.engine) == before


def test_preview_parses_in_the_worker_under_its_budget(live, tmp_path):
    """A file whose parse would run away (tests/test_parse_budget.py's bomb, in the namespace the byte scan does
    not know) is stopped by parse_timeout_s in the parse worker: 3001 「解析超时」, the service goes on."""
    import time

    from tests.test_parse_budget import element_bomb

    bomb = element_bomb(tmp_path / "无前缀炸弹.docx", paragraphs=1_000_000, prefix="")
    live.engine.update_settings({"parsing": {"parse_timeout_s": 1}})
    try:
        before = snapshot(live.engine)
        with live.http(headers=auth("boss")) as http:
            t0 = time.monotonic()
            r = preview(http, live.kb, bomb).json()
            assert r["code"] == 3001 and "解析超时" in r["msg"] and time.monotonic() - t0 < 30, r
            assert ok(preview(http, live.kb, RULES))["count"] > 5  # the next preview works
        assert snapshot(live.engine) == before
    finally:
        live.engine.update_settings({"parsing": {"parse_timeout_s": 120}})


class FakeRequest:
    def __init__(self, username):
        self.username = username


def test_page_preview_then_ingest_with_this_kbs_chunking(live, tmp_path):
    """The 预览分块 panel's handlers (as the page calls them): refused to non-admins, a preview with the fields'
    values stores nothing, 按此设置导入 saves them as this KB's chunking, asks to rebuild it, ingests the file."""
    import gradio as gr

    from ui.kb_tab import build_kb_tab

    with gr.Blocks():
        tab = build_kb_tab(live.engine, None, policy=live.policy)
    h = tab["preview"].handlers
    boss = FakeRequest("boss")
    for req in (FakeRequest("bob"), FakeRequest(None)):
        for call in (lambda r: h["kb_preview"](str(RULES), live.kb, 120, 10, True, r),
                     lambda r: h["kb_preview_ingest"](str(RULES), live.kb, 120, 10, True, r),
                     lambda r: h["kb_chunking_save"](live.kb, 120, 10, True, r)):
            with pytest.raises(gr.Error):
                call(req)
    size, overlap, structure, info = h["kb_chunking_load"](live.kb, boss)
    assert (size, overlap, structure) == (300, 50, True) and "沿用全局" in info
    before = snapshot(live.engine)
    html = h["kb_preview"](str(RULES), live.kb, 120, 10, False, boss)
    lens = [int(x) for x in re.findall(r'data-len="(\d+)"', html)]
    assert lens and max(lens) <= 120 and "尚未保存任何内容" in html
    assert "块大小 120 · 重叠 10 · 只按句子" in html
    assert snapshot(live.engine) == before
    assert live.engine.kb_chunking(live.kb)["overrides"] == {}
    note = tmp_path / "新规定.txt"
    note.write_text("\n".join(p for p in RULES.read_text(encoding="utf-8").splitlines() if len(p) > 30),
                    encoding="utf-8")
    out = h["kb_preview_ingest"]({"path": str(note), "orig_name": note.name}, live.kb, 150.0, 10.0, True, boss)
    assert out[0] is None and "已保存" in out[2] and out[3]["visible"] is True and "仅重建本知识库" in out[4]
    assert "已接收" in out[5] and "块大小(字符) 150（本库设置）" in out[6]
    assert live.engine.kb_chunking(live.kb)["overrides"] == {"chunk_size": 150, "chunk_overlap": 10}
    wait_idle(live.engine)
    doc = next(d for d in live.engine.components.docs.all_docs(live.kb) if d["file_name"] == note.name)
    got = [len(c["text"]) for c in live.engine.document_chunks(doc["doc_id"])]
    assert got and max(got) <= 150 and max(got) > 100
