"""The chunk editor in a real browser (Debian Chromium via Playwright), over the tiny random embedding model.

知识库 → 查看块 → 编辑分块: pick a chunk, change its text (the list marks it 已修改, BM25 finds the new words),
switch another one off (marked 已停用; 问答 never cites it), and add a chunk by hand.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.live import LiveApp
from tests.test_browser_kbs import ARGS, CHROMIUM, _ask
from tests.test_chunk_editing import PARAS, SETTINGS, bm25_ids, chunk_with, write_doc
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")]


def _pick(page, chunk_id: int) -> None:
    page.locator("#kb-chunk-pick input").click()
    page.locator("ul[role=listbox] li", has_text=f"块 {chunk_id} ").first.click()
    page.wait_for_function("() => (document.querySelector('#kb-chunk-info')?.innerText || '').includes('块 ')",
                           timeout=20_000)


def _message(page, text: str) -> None:
    page.wait_for_function("([t]) => (document.querySelector('#kb-chunk-msg')?.innerText || '').includes(t)",
                           arg=[text], timeout=60_000)


def test_browser_edit_disable_and_add_a_chunk(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"), **SETTINGS)
    assert engine.upload([("手册.txt", write_doc(tmp_path / "手册.txt", PARAS))])[0].ok
    wait_idle(engine)
    blue, leaf = chunk_with(engine, "蓝莓果酱"), chunk_with(engine, "银杏叶")
    live = LiveApp(engine)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="zh-CN")
            page.goto(live.url)
            page.wait_for_selector("#kb-question textarea", timeout=60_000)
            page.get_by_role("tab", name="知识库").click()
            page.wait_for_selector("#kb-table button[data-act=view]", timeout=30_000)
            page.locator("#kb-table button[data-act=view]").first.click()
            page.wait_for_selector(f"#kb-chunks .kbc[data-chunk='{blue['chunk_id']}']", timeout=20_000)
            page.get_by_text("编辑分块（修改 / 恢复原文 / 停用 / 启用 / 添加）").click()
            assert "新版本从它自己的解析结果开始" in page.locator("#kb-chunk-note").inner_text()

            # --- edit: the list marks it, BM25 finds the new words and not the old ones ---------------------
            _pick(page, blue["chunk_id"])
            assert page.locator("#kb-chunk-text textarea").input_value() == blue["text"]
            page.fill("#kb-chunk-text textarea", "樱桃酱的保存方法：樱桃酱开封后冷藏，十天之内吃完。")
            page.click("#kb-chunk-save")
            _message(page, "已保存")
            card = page.locator(f"#kb-chunks .kbc[data-chunk='{blue['chunk_id']}']")
            assert "已修改" in card.inner_text() and "樱桃酱" in card.inner_text()
            assert blue["chunk_id"] in bm25_ids(engine, "樱桃酱")
            assert blue["chunk_id"] not in bm25_ids(engine, "蓝莓果酱")

            # --- disable another chunk: marked, never cited in 问答 ------------------------------------------
            _pick(page, leaf["chunk_id"])
            page.click("#kb-chunk-disable")
            _message(page, "已停用")
            assert "已停用" in page.locator(f"#kb-chunks .kbc[data-chunk='{leaf['chunk_id']}']").inner_text()

            # --- a chunk by hand ------------------------------------------------------------------------------
            page.fill("#kb-chunk-new-text textarea", "手写块：茉莉花茶要用八十度的水冲泡三分钟。")
            page.click("#kb-chunk-add")
            _message(page, "已添加块")
            assert "手动添加" in page.locator("#kb-chunks").inner_text()
            assert bm25_ids(engine, "茉莉花茶")

            sources = _ask(page, "银杏叶标本怎么制作？茉莉花茶怎么冲泡？")  # the hand-made chunk answers, the leaf never
            assert any("茉莉花茶" in s["text"] for s in sources), sources
            assert str(leaf["chunk_id"]) not in {s["chunk"] for s in sources}, sources
            assert "银杏叶夹在旧书里" not in page.locator("#kb-chatbot").inner_text()
            browser.close()
    finally:
        live.stop(close_engine=True)
