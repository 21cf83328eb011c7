"""知识库 tab + 双路检索调试 through gradio_client against a launched app on a temp data dir.

Real files from ../shared/docs; the engine is the real one (packaged embedding model, no LLM).
"""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import gradio as gr  # noqa: E402
import pytest  # noqa: E402

from pipeline.access.policy import AccessPolicy  # noqa: E402
from tests.live import launched_ui  # noqa: E402
from tests.shared_data import DOCS, needs  # noqa: E402

TEST_TXT = DOCS / "chatchat" / "test.txt"
CARD = re.compile(r'class="kbd-card" data-chunk="(\d+)" data-rank="(\d+)" data-hue="(\d+)"')

pytestmark = [pytest.mark.slow, needs(TEST_TXT)]  # the packaged e5 model: the module's engine loads it


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from pipeline.engine import Engine

    data = tmp_path_factory.mktemp("kbui") / "data"
    engine = Engine(data, load_async=False)
    with launched_ui(engine) as ui:
        yield SimpleNamespace(engine=engine, demo=ui.demo, client=ui.client, tmp=data.parent)
    engine.close()


def upload(live, paths):
    from gradio_client import handle_file

    return live.client.predict(files=[handle_file(str(p)) for p in paths], pg=1, kw="", api_name="/kb_upload")


def kb_list(live, page=1, kw=""):
    return live.client.predict(pg=page, kw=kw, api_name="/kb_list")


def updates(values, key):
    return [v for v in values if isinstance(v, dict) and v.get("__type__") == "update" and key in v]


def doc_ids(table_html):
    return [int(x) for x in re.findall(r'<tr data-doc="(\d+)"', table_html)]


def badge_chunks(values):
    for v in values:
        if isinstance(v, str) and "kb-badges" in v:
            m = re.search(r"知识库: (\d+) 块", v)
            return int(m.group(1))
    raise AssertionError("badge not among the outputs")


@pytest.fixture(scope="module")
def test_doc(live):
    """test.txt uploaded (with an .exe alongside that must be refused) and processed to 就绪."""
    exe = live.tmp / "setup.exe"
    exe.write_bytes(b"MZ" + b"\0" * 200)
    out = upload(live, [TEST_TXT, exe])
    assert live.engine.wait_idle(300)
    return SimpleNamespace(report=out[0], upload_outputs=out)


def test_upload_reports_each_file_and_table_turns_ready(live, test_doc):
    report = test_doc.report
    assert re.search(r'data-result="accepted">✓ test\.txt', report)
    assert re.search(r'data-result="refused">✗ setup\.exe：已拒绝 — 不支持的文件类型 \.exe', report)
    out = test_doc.upload_outputs
    if 'data-status="processing"' in out[1]:  # still processing when the upload returned: auto-refresh on
        assert any(u.get("active") is True for u in updates(out, "active"))
        assert "kbt-spin" in out[1]
    table, info = kb_list(live)[:2]
    assert "test.txt" in table and "就绪" in table and 'data-status="ready"' in table
    assert "setup.exe" not in table
    assert "共 1 个文档" in info
    values = kb_list(live)
    # nothing 处理中 → the 3 s timer is switched off; badge shows the engine's chunk count
    assert [u["active"] for u in updates(values, "active")] == [False]
    chunks = live.engine.health()["chunks"]
    assert chunks > 0 and badge_chunks(values) == chunks
    # columns of the table
    for col in ("文件名", "类型", "大小", "块数", "状态", "原因", "上传时间", "操作", "查看块", "删除"):
        assert col in table


def test_server_side_refusals_size_and_count(live, test_doc):
    big = live.tmp / "big.txt"
    with open(big, "wb") as f:  # 21 MB of text
        f.write(("大" * 1000 + "\n").encode() * 7200)
    assert big.stat().st_size > 20 * 1024 * 1024
    out = upload(live, [big])
    assert "big.txt：已拒绝 — 文件超过 20 MB" in out[0]

    many = []
    for i in range(11):
        p = live.tmp / f"many_{i:02d}.txt"
        p.write_text(f"第 {i} 号测试文件，内容编号 {i * 7919}。", encoding="utf-8")
        many.append(p)
    out = upload(live, many)
    assert out[0].count('data-result="accepted"') == 10
    assert re.search(r"many_10\.txt：已拒绝 — 单次最多上传 10 个文件", out[0])
    assert live.engine.wait_idle(120)
    # clean up the ten small documents (through the UI's delete route)
    ids = [d["doc_id"] for d in live.engine.list_documents(1, 50, "many_")["items"]]
    assert len(ids) == 10
    for did in ids:
        live.client.predict(doc_id=did, pg=1, kw="", api_name="/kb_delete")
    assert live.engine.list_documents(1, 50, "many_")["total"] == 0


def test_search_and_paging(live, test_doc):
    table, info = kb_list(live, kw="test")[:2]
    assert "test.txt" in table
    table, info = kb_list(live, kw="不存在的文件名")[:2]
    assert doc_ids(table) == [] and "没有文件名包含" in table
    # a page past the end is clamped to the last page
    out = kb_list(live, page=99)
    assert "test.txt" in out[0] and out[2] == 1


def test_view_chunks(live, test_doc):
    doc = live.engine.list_documents(1, 10, "test.txt")["items"][0]
    title, body = live.client.predict(doc_id=doc["doc_id"], api_name="/kb_chunks")
    assert "test.txt" in title and f"共 {doc['chunk_count']} 块" in title
    assert body.count('class="kbc"') == min(doc["chunk_count"], 300)
    assert "ChatGPT" in body


def test_debug_search_three_columns_same_chunk_same_colour(live, test_doc):
    status, bm25, vec, rrf = live.client.predict(query="什么是 Prompt 工程", top_k=8, api_name="/debug_search")
    assert 'data-col="bm25"' in bm25 and 'data-col="vector"' in vec and 'data-col="fused"' in rrf
    cols = {name: CARD.findall(html) for name, html in (("bm25", bm25), ("vector", vec), ("rrf", rrf))}
    assert all(cols.values()), status
    assert all(len(c) <= 8 for c in cols.values())
    hue_of: dict[str, str] = {}
    for cards in cols.values():
        for cid, _rank, hue in cards:
            assert hue_of.setdefault(cid, hue) == hue, f"chunk {cid} has two colours"
    assert len(set(hue_of.values())) == len(hue_of), "two chunks share a colour"
    shared = {c for c, _, _ in cols["rrf"]} & ({c for c, _, _ in cols["bm25"]} | {c for c, _, _ in cols["vector"]})
    assert shared, "RRF shows chunks found by the routes"
    # fused cards name both routes' real rank and score (full information); route cards say where the chunk
    # landed after fusion; the column title names the fusion mode and the BM25 weight of this query
    assert re.search(r"BM25 (第 \d+ 名|未召回)（得分 [\d.]+） · 向量 (第 \d+ 名|未召回)（相似度 [\d.]+）", rrf)
    assert "→ 融合第 1 名" in bm25 + vec
    assert "BM25 占比" in rrf or "BM25 权重" in rrf
    # consistent with the engine's own result
    direct = live.engine.search("什么是 Prompt 工程", 8)
    assert [str(r["chunk_id"]) for r in direct["fused"]] == [c for c, _, _ in cols["rrf"]]


def test_debug_search_validation(live):
    status, *cols = live.client.predict(query="  ", top_k=5, api_name="/debug_search")
    assert "不能为空" in status and cols == ["", "", ""]


def test_delete_updates_table_and_badge(live, test_doc):
    extra = live.tmp / "待删除.md"
    extra.write_text("# 待删除\n\n这是一份马上要删除的文档，讲的是海豚的睡眠方式：海豚睡觉时半个大脑保持清醒。\n",
                     encoding="utf-8")
    upload(live, [extra])
    assert live.engine.wait_idle(120)
    before = live.engine.health()["chunks"]
    did = live.engine.list_documents(1, 10, "待删除")["items"][0]["doc_id"]
    out = live.client.predict(doc_id=did, pg=1, kw="", api_name="/kb_delete")
    msg, table = out[0], out[2]
    assert "已删除「待删除.md」" in msg
    assert did not in doc_ids(table) and "test.txt" in table
    after = live.engine.health()["chunks"]
    assert after < before and badge_chunks(out) == after
    # deleting it again reports the engine's error instead of crashing
    out = live.client.predict(doc_id=did, pg=1, kw="", api_name="/kb_delete")
    assert "删除失败" in out[0] and "不存在" in out[0]


@pytest.mark.slow
def test_rebuild_disables_buttons_and_reports(live, test_doc):
    job = live.client.submit(pg=1, kw="", api_name="/kb_rebuild")
    final = job.result(timeout=600)
    outs = job.outputs()
    assert any("全量重建" in str(o[0]) for o in outs)
    first = outs[0]
    assert any(u.get("interactive") is False for u in updates(first, "interactive")), first
    assert "全量重建完成" in final[0], final[0]
    assert all(u.get("interactive") is True for u in updates(final, "interactive"))
    assert "就绪" in final[1]
    assert live.engine.rebuild_status()["running"] is False


# ---------------------------------------------------------------------------------------------- roles
class FakeRequest:
    def __init__(self, username):
        self.username = username


def test_kb_actions_are_checked_server_side(live, test_doc):
    from ui.kb_tab import build_kb_tab

    policy = AccessPolicy(users={"a": "x", "u": "y"}, admins={"a"}, kb_admins={"a"})
    with gr.Blocks():
        tab = build_kb_tab(live.engine, None, policy=policy)
    h = tab["handlers"]
    did = live.engine.list_documents(1, 10, "test.txt")["items"][0]["doc_id"]
    for call in (lambda r: h["kb_delete"](did, 1, "", r), lambda r: h["kb_chunks"](did, r),
                 lambda r: h["kb_upload"]([str(TEST_TXT)], 1, "", r), lambda r: list(h["kb_rebuild"](1, "", r))):
        for req in (FakeRequest("u"), FakeRequest(None), None):
            with pytest.raises(gr.Error):
                call(req)
    assert live.engine.get_document(did)["status"] == "ready"  # nothing happened
    assert "无权限" in h["kb_list"](1, "", FakeRequest("u"))[0]
    title, body = h["kb_chunks"](did, FakeRequest("a"))[1:]
    assert "test.txt" in title and 'class="kbc"' in body
    assert "test.txt" in h["kb_list"](1, "", FakeRequest("a"))[0]


# ---------------------------------------------------------------------------------------------- browser
CHROMIUM = "/usr/bin/chromium"


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing")
def test_browser_row_buttons_and_client_side_refusal(live, test_doc):
    """The table's 查看块 / 删除 buttons are plain HTML wired through js_on_load → trigger('click'): check them in
    a real browser, plus the browser-side refusal of a .exe by gr.File(file_types=...)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    extra = live.tmp / "浏览器删除.txt"
    extra.write_text("浏览器测试文档：长颈鹿每天只睡大约两个小时，而且常常站着睡觉。\n", encoding="utf-8")
    bad = live.tmp / "tool.exe"
    bad.write_bytes(b"MZ" + b"\0" * 64)
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, locale="zh-CN")
            page.goto(live.demo.local_url)
            page.get_by_role("tab", name="知识库").click()
            file_input = page.locator("#kb-upload input[type=file]").first
            file_input.set_input_files(str(bad))
            page.wait_for_function("() => /Invalid file type: tool\\.exe/.test(document.body.innerText)",
                                   timeout=20_000)
            assert live.engine.list_documents(1, 10, "tool")["total"] == 0
            file_input.set_input_files(str(extra))
            page.wait_for_function(
                "() => /浏览器删除\\.txt[\\s\\S]*就绪/.test(document.querySelector('#kb-table')?.innerText || '')",
                timeout=120_000)
            did = live.engine.list_documents(1, 10, "浏览器删除")["items"][0]["doc_id"]
            page.locator(f'#kb-table button[data-act="view"][data-id="{did}"]').click()
            page.wait_for_function("() => (document.querySelector('#kb-chunks')?.innerText || '').includes('长颈鹿')",
                                   timeout=20_000)
            page.locator(f'#kb-table button[data-act="delete"][data-id="{did}"]').click()
            page.locator("#kb-del-yes").wait_for(state="visible", timeout=20_000)
            assert live.engine.get_document(did)  # asking is not deleting
            page.locator("#kb-del-yes").click()
            page.wait_for_function("() => (document.querySelector('#kb-del-msg')?.innerText || '').includes('已删除')",
                                   timeout=20_000)
            assert live.engine.list_documents(1, 10, "浏览器删除")["total"] == 0
            assert f'data-doc="{did}"' not in page.locator("#kb-table").inner_html()
        finally:
            browser.close()
