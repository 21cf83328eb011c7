"""The chat's tag picker in a real browser (Debian Chromium via Playwright), over the tiny random embedding model.

The knowledge base of tests/test_filters.py: forty distractors repeat the question word for word, the tagged
target answers it once inside a longer text. Asked without a tag the sources are distractors; with the tag 古籍
picked beside the KB picker, every source is the target, and 检索过程 names the filter.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_browser_kbs import ARGS, CHROMIUM, _ask
from tests.test_filters import ASK, kb  # noqa: F401 — the module fixture

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")]


def test_browser_tag_picker_filters_the_answer(kb):  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="zh-CN")
            page.goto(kb.url)
            page.wait_for_selector("#kb-question textarea", timeout=60_000)
            unfiltered = _ask(page, ASK)
            assert unfiltered and not any("书院规定" in s["doc"] for s in unfiltered), unfiltered

            page.locator("#kb-tag-filter input").click()
            page.locator("ul[role=listbox] li", has_text="古籍").first.click()
            page.keyboard.press("Escape")
            filtered = _ask(page, ASK)
            assert filtered and all("书院规定" in s["doc"] for s in filtered), filtered
            assert any("七日内可以退货" in s["text"] for s in filtered), filtered
            page.locator("#kb-trace-acc").get_by_text("检索过程").first.click()  # the trace names the filter
            page.wait_for_selector("#kb-trace .kb-filter", timeout=20_000)
            assert "古籍" in page.locator("#kb-trace .kb-filter").inner_text()
        finally:
            browser.close()
