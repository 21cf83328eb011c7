"""One real-browser end-to-end test: headless Debian Chromium driven by Playwright for Python.

upload (through the 知识库 tab's file input when it has one, else through the engine) → 就绪 → ask → click [n]
highlights and scrolls to source n → follow up (「那服务时间呢？」, rewritten query in the trace) → reload → the
conversation comes back with both turns, citations and trace → 新对话, then the 历史 list replays it → browser
restart (same profile) → the history (kept on the server) is still there → 👎 with a reason → the 反馈 tab lists
it → a verified Q&A entry made from it answers the same question afterwards, cited as 「已核实问答」.

Needs `apt-get install chromium` and `pip install playwright` (never `playwright install`: its browser
download does not work offline; we only use /usr/bin/chromium). Set KBQA_SCREENSHOTS_DIR to also save
chat.png / kb.png there (docs/screenshots in the repo).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.test_ui_chat import KB_NAME, KB_TEXT, QUESTION, LiveUI, make_engine

FOLLOW_UP = "那服务时间呢？"
REASON_TEXT = "服务时间没有单独列出"
VERIFIED_Q = "星河电子客服几点上班？"
VERIFIED_A = "星河电子客服每天 9 点到 21 点在线，电话 400-800-1234。"

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.slow

# A few chunks' worth (chunk_size 300), so the answer cites several sources.
E2E_TEXT = KB_TEXT + (
    "\n配送说明：星河电子在全国范围内提供包邮服务，订单一般在付款后 48 小时内从杭州仓库发出，"
    "江浙沪地区通常次日送达，偏远地区需要三到五天。大件商品由合作物流送货上门，签收前请当面检查外包装是否完好，"
    "如有破损可以直接拒收，并拨打客服电话登记，客服会在二十四小时内安排补发。\n"
    "发票说明：所有订单均可开具电子普通发票，企业客户可以申请增值税专用发票。申请专用发票需要在下单后三十天内"
    "通过官网的“我的订单”页面提交开票信息，财务部门会在七个工作日内寄出纸质发票。发票抬头一经开具不能修改，"
    "如需重开请先退回原发票。\n"
    "会员积分：注册会员每消费一元积一分，积分可以在下次购物时抵扣现金，一百积分抵扣一元。积分有效期为两年，"
    "过期自动清零。会员生日当月购物享受双倍积分，金卡会员还可以享受延长保修六个月的权益。"
    "积分不能兑换现金，也不能转让给其他账户。\n"
    "售后网点：星河电子在全国二十个城市设有授权售后网点，北京、上海、广州、深圳、成都和杭州的网点提供当天取件"
    "维修服务。送修前请备份设备中的数据，并携带购买凭证和保修卡。维修完成后网点会短信通知取件，"
    "超过三十天未取的设备将收取保管费。\n")


def _launch(pw, profile: Path):
    return pw.chromium.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, args=ARGS, headless=True, viewport={"width": 1440, "height": 1000},
        locale="zh-CN")


def _open_app(pw, profile: Path, url: str):
    """(context, page) of the app loaded in a browser on `profile`, the question box ready."""
    ctx = _launch(pw, profile)
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    page.goto(url)
    page.wait_for_selector("#kb-question textarea", timeout=60_000)
    return ctx, page


def _open_tab(page, name: str):
    page.get_by_role("tab", name=name).click()


def _upload(page, live, tmp_path) -> str:
    """Upload through the KB tab if it offers a file input; return how it was done."""
    f = tmp_path / KB_NAME
    f.write_text(E2E_TEXT, encoding="utf-8")
    _open_tab(page, "知识库")
    page.wait_for_timeout(800)
    inputs = page.locator("#tab-kb input[type=file]")
    if inputs.count() > 0:
        inputs.first.set_input_files(str(f))
        # some UIs need an explicit 上传 button after choosing files
        btn = page.locator("#tab-kb button", has_text=re.compile(r"^\s*(上传|开始上传|上传并入库)\s*$"))
        if btn.count() > 0 and btn.first.is_visible():
            btn.first.click()
        page.wait_for_function(
            "([name]) => { const t = document.querySelector('#kb-table')?.innerText || '';"
            " return t.includes(name) && t.includes('就绪'); }", arg=[KB_NAME], timeout=180_000)
        assert live.engine.wait_idle(60)
        how = "ui"
    else:
        res = live.engine.upload([(KB_NAME, f)])
        assert res[0].ok, res
        assert live.engine.wait_idle(120)
        how = "engine"
    assert live.engine.health()["chunks"] > 0
    # the header badge follows (KB tab update or the timer)
    page.wait_for_function("() => !/知识库: 0 块/.test(document.querySelector('#kb-badge')?.innerText || '')",
                           timeout=30_000)
    return how


def _panel_texts(page) -> dict:
    return {
        "answer": page.locator("#kb-chatbot .bot").last.inner_text(),
        # textContent: independent of which source cards are unfolded
        "sources": " ".join(page.locator("#kb-sources").text_content().split()),
        "trace": page.locator("#kb-trace").inner_text(),
    }


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")
def test_browser_upload_ask_cite_reload_replay(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    shots = os.environ.get("KBQA_SCREENSHOTS_DIR")
    engine = make_engine(tmp_path / "data", with_doc=False)
    live = LiveUI(engine)
    profile = tmp_path / "profile"
    try:
        with sync_api.sync_playwright() as pw:
            ctx, page = _open_app(pw, profile, live.url)
            assert "知识库" in page.locator("#kb-badge").inner_text()

            _upload(page, live, tmp_path)
            if shots:
                page.wait_for_timeout(500)
                page.screenshot(path=str(Path(shots) / "kb.png"), full_page=True)

            # ask
            _open_tab(page, "问答")
            page.fill("#kb-question textarea", QUESTION)
            page.click("#kb-send")
            page.wait_for_selector("#kb-stage .kb-stage-done", timeout=180_000)
            page.wait_for_selector("#kb-chatbot a.kb-cite", timeout=10_000)
            assert "400-800-1234" in page.locator("#kb-chatbot .bot").last.inner_text()
            assert KB_NAME in page.locator("#kb-sources").inner_text()
            assert page.locator("#kb-send").is_enabled()

            # click [n] → source n highlighted and scrolled into view
            cite = page.locator("#kb-chatbot a.kb-cite").first
            n = re.search(r"\d+", cite.inner_text()).group(0)
            cite.click()
            card = page.locator(f"#kb-src-{n}")
            page.wait_for_function(f"() => document.getElementById('kb-src-{n}')?.classList.contains('kb-hl')",
                                   timeout=5_000)
            assert page.locator(".kb-src.kb-hl").count() == 1
            assert card.evaluate("e => { const r = e.getBoundingClientRect(); "
                                 "return r.bottom > 0 && r.top < window.innerHeight; }")
            assert live.url.rstrip("/") in page.url  # the link did not navigate away

            if shots:
                page.wait_for_timeout(700)  # smooth scroll
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=str(Path(shots) / "chat.png"))

            # the citation click also opens the document viewer (issue 16) over the page: close it first
            page.wait_for_selector("#kb-viewer-drawer", state="visible", timeout=20_000)
            page.click("#kb-viewer-close")
            page.wait_for_selector("#kb-viewer-drawer", state="hidden", timeout=10_000)

            page.locator("#kb-trace-acc").get_by_text("检索过程").first.click()
            page.wait_for_selector("#kb-trace .kb-trace-sec[data-sec=rerank]", state="visible", timeout=10_000)
            assert "BM25" in _panel_texts(page)["trace"]

            # follow up in the same conversation: the rewritten query shows in the trace
            page.fill("#kb-question textarea", FOLLOW_UP)
            page.click("#kb-send")
            page.wait_for_function("() => document.querySelectorAll('#kb-chatbot .bot').length === 2 && "
                                   "!!document.querySelector('#kb-stage .kb-stage-done')", timeout=180_000)
            page.wait_for_selector("#kb-trace .kb-query", timeout=10_000)
            before = _panel_texts(page)
            assert "检索问题：" in before["trace"] and "服务时间" in before["trace"]
            assert "BM25" in before["trace"] and "RRF" in before["trace"]
            assert "9 点到 21 点" in before["answer"]

            # reload → the open conversation comes back with both turns, its citations and trace
            page.reload()
            page.wait_for_selector("#kb-question textarea", timeout=60_000)
            page.wait_for_function("() => document.querySelectorAll('#kb-chatbot .bot').length === 2",
                                   timeout=30_000)
            _open_trace(page)
            assert _panel_texts(page) == before
            assert QUESTION in page.locator("#kb-chatbot").inner_text()

            # a new conversation, then the 历史 list replays the old one
            page.click("#kb-new-conv")
            page.wait_for_function("() => document.querySelectorAll('#kb-chatbot .bot').length === 0",
                                   timeout=10_000)
            _replay_first(page)
            assert _panel_texts(page) == before

            # browser restart (same profile): the history is on the server, still there
            ctx.close()
            ctx, page = _open_app(pw, profile, live.url)
            _replay_first(page)
            assert _panel_texts(page)["answer"] == before["answer"]

            # 👎 with a reason on the answer on screen → the 反馈 tab lists it
            page.click("#kb-fb-down")
            page.locator("#kb-fb-reason label").filter(has_text="引用错误").click()
            page.fill("#kb-fb-text textarea", REASON_TEXT)
            page.click("#kb-fb-submit")
            page.wait_for_selector("#kb-fb-status .kb-fb-done[data-rating=down]", timeout=10_000)
            _open_tab(page, "反馈")
            page.locator("#kb-fba-filter label").filter(has_text="仅").first.click()
            page.wait_for_function("([t]) => (document.querySelector('#kb-fba-list')?.innerText || '').includes(t)",
                                   arg=[REASON_TEXT], timeout=10_000)
            row = page.locator("#kb-fba-table tr[data-rating=down]").first
            assert "引用错误" in row.inner_text() and FOLLOW_UP in row.inner_text()
            fb_id = row.get_attribute("data-fb")

            # a verified entry from it answers the same question afterwards, cited as 已核实问答
            page.fill("#kb-qa-pick input", fb_id)
            page.click("#kb-qa-load")
            page.wait_for_function("() => (document.querySelector('#kb-qa-question textarea')?.value || '')"
                                   ".length > 0", timeout=10_000)
            page.fill("#kb-qa-question textarea", VERIFIED_Q)
            page.fill("#kb-qa-answer textarea", VERIFIED_A)
            page.click("#kb-qa-create")
            page.wait_for_selector("#kb-qa-status .kb-qa-done", timeout=10_000)
            assert live.engine.wait_idle(120)
            _open_tab(page, "问答")
            page.click("#kb-new-conv")
            page.fill("#kb-question textarea", VERIFIED_Q)
            page.click("#kb-send")
            page.wait_for_function("() => document.querySelectorAll('#kb-chatbot .bot').length === 1 && "
                                   "!!document.querySelector('#kb-stage .kb-stage-done')", timeout=180_000)
            assert VERIFIED_A in page.locator("#kb-chatbot .bot").last.inner_text()
            assert "已核实问答" in page.locator("#kb-sources .kb-src").first.inner_text()
            ctx.close()
    finally:
        live.stop()
        engine.close()
        shutil.rmtree(profile, ignore_errors=True)


def _open_trace(page):
    if not page.locator("#kb-trace .kb-trace-sec[data-sec=rerank]").is_visible():
        page.locator("#kb-trace-acc").get_by_text("检索过程").first.click()
    page.wait_for_selector("#kb-trace .kb-trace-sec[data-sec=rerank]", state="visible", timeout=10_000)


def _replay_first(page):
    page.locator("#kb-history-acc").get_by_text("历史对话").first.click()
    item = page.locator("#kb-history-list label").filter(has_text=QUESTION[:10]).first
    item.wait_for(state="visible", timeout=20_000)
    item.click()
    page.wait_for_function("() => document.querySelectorAll('#kb-chatbot .bot').length === 2", timeout=20_000)
    page.wait_for_selector("#kb-chatbot a.kb-cite", timeout=10_000)
    _open_trace(page)
