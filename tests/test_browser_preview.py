"""预览分块 in a real browser (Debian Chromium via Playwright) on a tiny-model engine: the panel shows the picked
knowledge base's chunking, a preview with another chunk size lists chunks of that size and stores nothing,
按此设置导入 saves the size for this knowledge base and the document lands in the table cut that way."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.live import LiveApp
from tests.shared_data import RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.slow, needs(RULES),
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")]


def _set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input").first
    box.fill(str(value))
    box.press("Tab")  # Gradio's Number commits its value on blur


def test_browser_preview_then_ingest(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    live = LiveApp(engine, owns_engine=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="zh-CN")
            page.goto(live.url)
            page.wait_for_selector("#kb-question textarea", timeout=60_000)
            page.get_by_role("tab", name="知识库").click()
            page.wait_for_selector("#kb-table", timeout=20_000)
            page.locator("#kb-preview").get_by_text("预览分块 · 本知识库的切块参数").click()
            page.wait_for_function("() => (document.querySelector('#kb-ck-info')?.innerText || '').includes('沿用全局')",
                                   timeout=20_000)
            assert page.locator("#kb-ck-size input").first.input_value() == "300"

            page.locator("#kb-preview-file input[type=file]").first.set_input_files(str(RULES))
            page.wait_for_function(f"() => (document.querySelector('#kb-preview-file')?.innerText || '')"
                                   f".includes({RULES.name[:6]!r})", timeout=20_000)
            _set_number(page, "kb-ck-size", 120)
            page.click("#kb-preview-run")
            page.wait_for_selector("#kb-preview-result .kbp", timeout=60_000)
            lens = [int(x) for x in page.eval_on_selector_all("#kb-preview-result .kbp", "els => els.map(e => e.dataset.len)")]
            assert lens and max(lens) <= 120, lens
            assert "尚未保存任何内容" in page.locator("#kb-preview-result").inner_text()
            assert engine.list_documents()["total"] == 0 and engine.kb_chunking(1)["overrides"] == {}

            page.click("#kb-preview-ingest")
            page.wait_for_function(
                "([n]) => [...document.querySelectorAll('#kb-table tr')].some(r => r.innerText.includes(n)"
                " && r.dataset.status === 'ready')", arg=[RULES.name[:6]], timeout=180_000)
            assert engine.kb_chunking(1)["overrides"] == {"chunk_size": 120}
            doc = engine.list_documents()["items"][0]
            assert max(len(c["text"]) for c in engine.document_chunks(doc["doc_id"])) <= 120
            assert "块大小(字符) 120（本库设置）" in page.locator("#kb-ck-info").inner_text()
            assert "已保存本知识库的切块参数" in page.locator("#kb-ck-msg").inner_text()
            browser.close()
    finally:
        live.stop()
