"""Security headers on every response of the app: the REST API and the Gradio page mounted on it.

The Content-Security-Policy is the browser-side half of "answers render only what we allow" (the other half is
ui.safe_markdown): even if some Markdown or HTML slipped through, the page may load images, scripts, styles, fonts,
frames and fetches from its own origin only, so an answer cannot beacon data out to another host.

What Gradio 6 needs for itself (checked in Chromium, tests/test_browser_confidentiality.py): its page config and
our HEAD_JS are inline scripts and some components build functions at run time ('unsafe-inline' 'unsafe-eval'
for scripts); Svelte components set inline styles ('unsafe-inline' for styles); uploaded-file previews and
generated images are data:/blob: URLs. Nothing else: no CDN, no Google Fonts (offline anyway).

A pure ASGI middleware (not BaseHTTPMiddleware) so streamed answers (SSE) pass through unbuffered.
"""
from __future__ import annotations

from typing import Any

CSP = "; ".join((
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "media-src 'self' data: blob:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "frame-src 'self' blob:",
    "frame-ancestors 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
))

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


class SecurityHeaders:
    """ASGI middleware: add HEADERS to every HTTP response (a header the app set itself is kept)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers") or []}
                message["headers"] = [*(message.get("headers") or []),
                                      *((k, v) for k, v in HEADERS if k not in present)]
            await send(message)

        return await self.app(scope, receive, send_with_headers)


def install(app: Any) -> None:
    """Wire the headers into a FastAPI/Starlette app (one line in api.server.create_api)."""
    app.add_middleware(SecurityHeaders)
