"""In the browser: a scripted LLM (real HTTP, tests/fake_llm.py) cites the wrong source on purpose; the chat marks that
citation ⚠, the sources panel flags the source, 检索过程 counts it. Headless Debian Chromium via Playwright.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.live import engine_with_texts
from tests.test_browser_e2e import CHROMIUM, _open_app
from tests.test_support import DOCS, QUESTION
from tests.test_ui_chat import LiveUI

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")
def test_unsupported_citation_marked_in_the_chat(tmp_path, fake_llm):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    engine = engine_with_texts(tmp_path, DOCS)
    engine.update_settings({"llm_api_url": fake_llm.base_url, "llm_model": "fake-model", "llm_api_key": "sk-t-01"})
    engine.reload()
    numbers = {n.node.metadata["doc_name"]: i for i, n in enumerate(engine.retrieve(QUESTION).final, 1)}
    right, wrong = numbers["售后政策.txt"], numbers["员工手册.txt"]
    fake_llm.reply = f"退货期限为签收后 7 天[{right}]。退货运费由买家承担[{wrong}]。"
    live = LiveUI(engine)
    profile = tmp_path / "profile"
    try:
        with sync_api.sync_playwright() as pw:
            ctx, page = _open_app(pw, profile, live.url)
            page.fill("#kb-question textarea", QUESTION)
            page.click("#kb-send")
            page.wait_for_selector("#kb-stage .kb-stage-done", timeout=180_000)
            bad = page.locator("#kb-chatbot a.kb-cite-unsupported")
            bad.first.wait_for(timeout=10_000)
            # (the chat's sanitiser keeps classes, not data-* attributes: read the number from the link text)
            assert bad.count() == 1 and bad.first.inner_text() == f"[{wrong}]⚠"
            cites = page.locator("#kb-chatbot a.kb-cite")
            good = [cites.nth(i) for i in range(cites.count()) if cites.nth(i).inner_text() == f"[{right}]"]
            assert len(good) == 1 and "kb-cite-unsupported" not in (good[0].get_attribute("class") or "")
            card = page.locator(f"#kb-src-{wrong}")
            assert "引用与内容不符" in card.text_content()
            assert "引用与内容不符" not in page.locator(f"#kb-src-{right}").text_content()
            page.locator("#kb-trace-acc").get_by_text("检索过程").first.click()
            page.wait_for_selector("#kb-trace .kb-support", state="visible", timeout=10_000)
            assert "1 处与所引来源不符" in page.locator("#kb-trace .kb-support").inner_text()
            ctx.close()
    finally:
        live.stop()
        engine.close()
        shutil.rmtree(profile, ignore_errors=True)
