"""配置 → 开放接口 in a real browser (Debian Chromium via Playwright): an admin creates a key, sees its secret once
(gone after a reload, never in the list), the key works on /v1 at once; revoking it from the page stops it."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.live import LiveApp
from tests.tiny_engine import tiny_engine, tiny_model

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing (apt-get install chromium)")]


def test_create_show_once_and_revoke(tmp_path):
    from playwright import sync_api

    live = LiveApp(tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny")), owns_engine=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1440, "height": 1000}, locale="zh-CN")
            page.goto(live.url)
            page.get_by_role("tab", name="配置").click()
            page.fill("#keys-name textarea, #keys-name input", "浏览器里建的")
            page.click("#keys-create")
            page.wait_for_function("() => (document.querySelector('#keys-secret textarea, #keys-secret input')"
                                   "?.value || '').startsWith('kbqa-')", timeout=60_000)
            secret = page.locator("#keys-secret textarea, #keys-secret input").first.input_value()
            page.wait_for_function("() => (document.querySelector('#keys-list')?.innerText || '')"
                                   ".includes('浏览器里建的')", timeout=30_000)
            listing = page.locator("#keys-list").inner_text()
            assert secret[:12] in listing and secret not in listing  # the prefix, never the secret
            models = httpx.get(live.url + "v1/models", headers={"Authorization": f"Bearer {secret}"})
            assert models.status_code == 200 and models.json()["data"][0]["id"] == "kb-all"

            page.reload()  # shown once: a fresh page does not have it
            page.get_by_role("tab", name="配置").click()
            page.wait_for_function("() => (document.querySelector('#keys-list')?.innerText || '')"
                                   ".includes('浏览器里建的')", timeout=30_000)
            assert secret not in page.content()

            key_id = live.engine.list_api_keys()[0]["key_id"]
            page.fill("#keys-revoke-id input", str(key_id))
            page.click("#keys-revoke")
            page.wait_for_function("() => (document.querySelector('#keys-status')?.innerText || '')"
                                   ".includes('已吊销')", timeout=30_000)
            assert httpx.get(live.url + "v1/models",
                             headers={"Authorization": f"Bearer {secret}"}).status_code == 401
            browser.close()
    finally:
        live.stop()
