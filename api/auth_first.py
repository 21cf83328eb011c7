"""Who calls is decided before the body is read: an unauthenticated request to a route that takes a body is
answered 401 (or 429 while its login is locked) at once, instead of after FastAPI has parsed a JSON body or spooled
a multipart upload to disk (issue 27: a 200 MB upload was read in full before its 401).

A pure ASGI middleware over /api, /v1 and /mcp for the methods that carry a body. It resolves the caller from the
headers alone — the same `resolve` the routes use — and leaves it in the request's state, so the route does not
resolve (and count against the rate limit) a second time. Routes without a body keep resolving in their
dependency, as before (health must answer without credentials).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request

BODY_METHODS = {"POST", "PUT", "PATCH"}
PREFIXES = ("/api/", "/v1/", "/mcp")


class AuthBeforeBody:
    def __init__(self, app, resolve: Callable[[Request], object], refuse: Callable[[Request, Exception], object]):
        self.app, self.resolve, self.refuse = app, resolve, refuse

    async def __call__(self, scope, receive, send) -> Awaitable[None] | None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or not scope["path"].startswith(PREFIXES):
            return await self.app(scope, receive, send)
        request = Request(scope)  # headers only: nothing is received here
        try:
            self.resolve(request)  # leaves request.state.caller for the route
        except Exception as exc:  # the resolver's refusal (no / bad credentials, locked, rate-limited)
            response = self.refuse(request, exc)
            if response is None:
                raise
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)
