"""The official `mcp` SDK's client over streamable HTTP, as the tests drive the app's /mcp."""
from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import anyio


def basic(user: str, pw: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}


def over_http(app_url: str, headers: dict, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """Open an initialized MCP session on `app_url` + "mcp" with these HTTP headers and return `work(session)`."""
    async def run():
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers=headers, timeout=120) as client, \
                streamable_http_client(app_url + "mcp", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)
    return anyio.run(run)
