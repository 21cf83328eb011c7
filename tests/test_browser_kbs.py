"""Knowledge bases, versions, progress and the viewer in a real browser (Debian Chromium via Playwright).

知识库 tab: create a knowledge base, upload into it; a long document shows its progress bar moving (two different
values read); 问答 scoped to that knowledge base never cites the other one; clicking [n] opens the viewer on the
cited passage (highlighted, in view); a new version replaces the old one in answers; 恢复 brings the old back.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.live import LiveApp
from tests.shared_data import NOVEL, needs
from tests.test_knowledge_bases import CONTRACT_V1, CONTRACT_V2, MANUAL
from tests.waiting import wait_until
from ui.kb_tab import REFRESH_SECONDS as REFRESH_S

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
QUESTION = "收到货物后多少天内支付全部货款？"

pytestmark = [pytest.mark.slow, needs(NOVEL),
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")]


def _pick_kb(page, name: str) -> None:
    page.locator("#kb-pick input").click()
    page.locator("ul[role=listbox] li", has_text=name).first.click()
    page.wait_for_function("([n]) => (document.querySelector('#kb-space-info')?.innerText || '').includes(n)",
                           arg=[name], timeout=20_000)


def _upload(page, path: Path, wait_ready: bool = True) -> None:
    page.locator("#kb-upload input[type=file]").first.set_input_files(str(path))
    if wait_ready:
        page.wait_for_function(
            "([n]) => [...document.querySelectorAll('#kb-table tr')].some(r => r.innerText.includes(n)"
            " && r.dataset.status === 'ready' && !r.innerText.includes('新版本'))", arg=[path.name], timeout=180_000)


def _ask(page, question: str) -> list[dict]:
    page.get_by_role("tab", name="问答").click()
    page.fill("#kb-question textarea", question)
    # the previous answer's panels are marked, so only this answer's can satisfy the waits below
    page.evaluate("() => document.querySelectorAll('#kb-stage .kb-stage, #kb-sources .kb-src')"
                  ".forEach(e => e.setAttribute('data-old', '1'))")
    page.click("#kb-send")
    page.wait_for_selector("#kb-stage .kb-stage-done:not([data-old])", timeout=180_000)
    try:
        page.wait_for_selector("#kb-sources .kb-src:not([data-old])", timeout=20_000)
    except Exception:
        raise AssertionError(f"no sources: {page.locator('#kb-stage').inner_text()!r} "
                             f"{page.locator('#kb-chatbot').inner_text()[-300:]!r} "
                             f"{page.locator('#kb-scope').inner_text()!r}") from None
    return page.evaluate("""() => [...document.querySelectorAll('#kb-sources .kb-src')].map(c => ({
        no: c.dataset.no, chunk: c.dataset.chunk, kb: c.querySelector('.kb-src-kb')?.innerText || '',
        doc: c.querySelector('.kb-src-doc')?.innerText || '', text: c.querySelector('.kb-src-full')?.textContent || ''}))""")


def test_browser_kbs_versions_progress_viewer(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    from pipeline.engine import Engine

    engine = Engine(tmp_path / "data")
    contract = tmp_path / "采购合同.txt"
    contract.write_text(CONTRACT_V1, encoding="utf-8")
    manual = tmp_path / "路由器手册.txt"
    manual.write_text(MANUAL + "\n本手册第九条：付款后 30 天内可以申请发票。", encoding="utf-8")
    assert engine.upload([(manual.name, manual)])[0].ok  # the default knowledge base holds the manual
    novel = NOVEL.read_bytes().decode("gb18030")
    long_doc = tmp_path / "三国演义节选.txt"
    long_doc.write_text(novel[:40_000], encoding="utf-8")
    live = LiveApp(engine)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="zh-CN")
            page.goto(live.url)
            page.wait_for_selector("#kb-question textarea", timeout=60_000)

            # --- a long document in the default knowledge base: the bar moves --------------------------------
            page.get_by_role("tab", name="知识库").click()
            page.wait_for_selector("#kb-table", timeout=20_000)
            # each embedding batch of the long document waits a little (the ingest's injected yield hook), so the
            # document stays in progress over several of the table's refreshes on a fast machine too
            ingest = engine.components.ingest
            yield_cpu = ingest.yield_cpu
            ingest.yield_cpu = lambda: time.sleep(REFRESH_S * 0.8)
            _upload(page, long_doc, wait_ready=False)
            seen: set[int] = set()

            def look() -> bool:  # note the bar's value; True once the row reads ready
                bar = page.locator("#kb-table .kbt-bar")
                if bar.count():
                    try:
                        seen.add(int(bar.first.get_attribute("data-done", timeout=1000)))
                    except Exception:
                        pass
                row = page.locator("#kb-table tr", has_text=long_doc.name)
                return bool(row.count() and row.first.get_attribute("data-status") == "ready")

            wait_until(look, 300, 0.4, "the long document's row to read ready")
            ingest.yield_cpu = yield_cpu
            assert len(seen) >= 2, f"progress values seen: {seen}"

            # --- a second knowledge base, created in the UI, with the contract -------------------------------
            page.click("#kb-space-new")
            page.fill("#kb-space-name textarea, #kb-space-name input", "合同")
            page.click("#kb-space-save")
            page.wait_for_function("() => (document.querySelector('#kb-space-msg')?.innerText || '')"
                                   ".includes('已新建知识库「合同」')", timeout=20_000)
            kb = next(k for k in engine.list_kbs() if k["name"] == "合同")
            _upload(page, contract)
            assert engine.list_documents(kb_id=kb["kb_id"])["total"] == 1
            assert engine.list_documents(kb_id=1, keyword=contract.name)["total"] == 0

            # --- scoped to 合同: never cites the default knowledge base --------------------------------------
            page.get_by_role("tab", name="问答").click()
            page.reload()  # the scope picker lists the new knowledge base
            page.wait_for_selector("#kb-question textarea", timeout=60_000)
            page.locator("#kb-scope .token", has_text="合同").wait_for(timeout=20_000)  # the page-load refresh
            page.locator("#kb-scope .token", has_text="默认知识库").locator(".token-remove").click()
            page.wait_for_function("() => !(document.querySelector('#kb-scope')?.innerText || '').includes('默认知识库')",
                                   timeout=10_000)
            sources = _ask(page, QUESTION)
            assert sources and {s["kb"] for s in sources} == {"合同"}, sources
            assert any("30 天" in s["text"] for s in sources)

            # --- [n] opens the viewer on that passage --------------------------------------------------------
            cite = page.locator("#kb-chatbot a.kb-cite").first
            n = re.search(r"\d+", cite.inner_text()).group(0)
            card = next(s for s in sources if s["no"] == n)
            cite.click()
            page.wait_for_selector("#kb-viewer mark.kbv-hl", timeout=20_000)
            mark = page.locator("#kb-viewer mark.kbv-hl")
            assert mark.get_attribute("data-chunk") == card["chunk"]
            assert " ".join(mark.inner_text().split()) == " ".join(card["text"].split())
            assert mark.evaluate("m => { const r = m.getBoundingClientRect(); "
                                 "return r.top >= 0 && r.bottom <= window.innerHeight && r.width > 0; }")
            assert contract.name in page.locator("#kb-viewer").inner_text()
            page.click("#kb-viewer-close")

            # --- a new version replaces the old one in answers ----------------------------------------------
            contract.write_text(CONTRACT_V2, encoding="utf-8")
            page.get_by_role("tab", name="知识库").click()
            _pick_kb(page, "合同")
            _upload(page, contract)
            sources = _ask(page, QUESTION)
            mine = [s for s in sources if contract.name in s["doc"]]
            assert mine and all("45 天" in s["text"] and "v2" in s["doc"] for s in mine), sources

            # --- 恢复 v1 from the 版本 panel: answers cite v1 again ---------------------------------------------
            page.get_by_role("tab", name="知识库").click()
            _pick_kb(page, "合同")
            page.locator("#kb-table button[data-act=versions]").first.click()
            page.wait_for_selector("#kb-versions button[data-act=restore]", timeout=20_000)
            page.locator("#kb-versions button[data-act=restore]").first.click()
            page.wait_for_function("() => (document.querySelector('#kb-versions-msg')?.innerText || '')"
                                   ".includes('已恢复为 v1')", timeout=20_000)
            sources = _ask(page, QUESTION)
            mine = [s for s in sources if contract.name in s["doc"]]
            assert mine and all("30 天" in s["text"] and "v2" not in s["doc"] for s in mine), sources
            browser.close()
    finally:
        live.stop(close_engine=True)
