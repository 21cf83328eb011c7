"""The knowledge base as an MCP server, driven by the official `mcp` SDK's client: over streamable HTTP at /mcp of
a live app with logins and a KB only alice may read, and over stdio (`python app.py --mcp-stdio`)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import LiveApp
from tests.mcp_client import basic
from tests.mcp_client import over_http as mcp_session
from tests.shared_data import RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

pytestmark = needs(RULES)

REPO = Path(__file__).resolve().parents[1]
SECRET = "青龙湖实验室的门禁密码每季度由安保处更换一次。"
TOOLS = {"list_knowledge_bases", "search", "ask", "read_document"}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mcp")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    secret_kb = engine.create_kb("安保", "只有 alice 可读", readers=["alice"])["kb_id"]
    note = tmp / "门禁.txt"
    note.write_text(SECRET * 3, encoding="utf-8")
    assert all(r.ok for r in engine.upload([(RULES.name, RULES)]))
    assert all(r.ok for r in engine.upload([(note.name, note)], kb_id=secret_kb))
    wait_idle(engine)
    policy = AccessPolicy.from_args(["alice:a-pw", "bob:b-pw"], None, None)
    app = LiveApp(engine, policy, owns_engine=True)
    app.secret_kb = secret_kb
    yield app
    app.stop()


def over_http(live, user: str, pw: str, work):
    return mcp_session(live.url, basic(user, pw), work)


def payload(result):
    """A tool result's structured content (the SDK wraps a list return as {"result": [...]})."""
    assert not result.is_error, result.content
    data = result.structured_content
    return data["result"] if isinstance(data, dict) and set(data) == {"result"} else data


def test_tools_have_typed_schemas_and_bilingual_descriptions(live):
    tools = over_http(live, "bob", "b-pw", lambda s: s.list_tools())
    by_name = {t.name: t for t in tools.tools}
    assert set(by_name) == TOOLS
    for t in by_name.values():
        assert any("\u4e00" <= ch <= "\u9fff" for ch in t.description) and " / " in t.description
    search = by_name["search"].input_schema
    assert search["required"] == ["query"]
    assert search["properties"]["top_k"]["maximum"] == 50 and search["properties"]["top_k"]["type"] == "integer"
    assert by_name["read_document"].input_schema["required"] == ["doc_id"]


def test_search_ask_and_read_through_http(live):
    query = RULES.read_text(encoding="utf-8").split("\n")[0][:20] or "规定"

    async def work(s):
        kbs = payload(await s.call_tool("list_knowledge_bases", {}))
        hits = payload(await s.call_tool("search", {"query": query, "top_k": 3}))
        answer = payload(await s.call_tool("ask", {"question": query}))
        first = hits[0]
        passage = payload(await s.call_tool("read_document", {"doc_id": first["doc_id"],
                                                              "chunk_id": first["chunk_id"]}))
        return kbs, hits, answer, passage

    kbs, hits, answer, passage = over_http(live, "bob", "b-pw", work)
    assert [kb["name"] for kb in kbs] == ["默认知识库"] and kbs[0]["documents"] == 1
    assert 1 <= len(hits) <= 3 and all(h["document"] == RULES.name for h in hits)
    assert {"fused", "bm25", "similarity"} <= set(hits[0]["scores"]) and hits[0]["scores"]["fused"] is not None
    assert answer["outcome"] in ("answer", "weak", "refuse")
    if answer["outcome"] != "refuse":
        cited = [int(n) for n in re.findall(r"\[(\d+)\]", answer["answer"])]
        assert cited and all(1 <= n <= len(answer["sources"]) for n in cited)
        assert [s["n"] for s in answer["sources"]] == list(range(1, len(answer["sources"]) + 1))
    assert passage["chunk_id"] == hits[0]["chunk_id"] and passage["text"] == hits[0]["text"]
    assert passage["document"] == RULES.name


def test_a_reader_never_sees_another_kbs_passages_through_any_tool(live):
    kb = live.secret_kb
    secret_doc = next(d for d in live.engine.components.docs.all_docs() if d["kb_id"] == kb)
    chunk = live.engine.components.docs.chunks_of(secret_doc["doc_id"])[0]

    async def work(s):
        kbs = payload(await s.call_tool("list_knowledge_bases", {}))
        refused = [await s.call_tool("search", {"query": "门禁密码", "kb_ids": [kb]}),
                   await s.call_tool("ask", {"question": "门禁密码多久更换一次？", "kb_ids": [kb]}),
                   await s.call_tool("read_document", {"doc_id": secret_doc["doc_id"], "chunk_id": chunk["chunk_id"]})]
        default = payload(await s.call_tool("search", {"query": "门禁密码 安保处", "top_k": 10}))
        return kbs, refused, default

    kbs, refused, default = over_http(live, "bob", "b-pw", work)
    assert kb not in [k["kb_id"] for k in kbs]
    for r in refused:
        assert r.is_error
        text = " ".join(c.text for c in r.content)
        assert "4003" in text and "门禁" not in text and "青龙湖" not in text
    assert all("青龙湖" not in h["text"] for h in default)
    # alice may read it: the same calls succeed
    hits = over_http(live, "alice", "a-pw",
                     lambda s: s.call_tool("search", {"query": "门禁密码", "kb_ids": [kb], "top_k": 3}))
    assert any("青龙湖" in h["text"] for h in payload(hits))


def test_wrong_credentials_get_401_before_any_tool(live):
    r = httpx.post(live.url + "mcp", headers={**basic("bob", "nope"), "Accept": "application/json, text/event-stream"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401 and r.json()["code"] == 4001 and "WWW-Authenticate" in r.headers
    assert httpx.post(live.url + "mcp", json={}).status_code == 401  # no credentials at all


@pytest.fixture(scope="module")
def stdio_data_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mcp-stdio")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    assert all(r.ok for r in engine.upload([(RULES.name, RULES)]))
    wait_idle(engine)
    engine.close()
    return tmp / "data"


def readme_block(marker: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    m = re.search(re.escape(f"<!-- connect-example:{marker} -->") + r"\s*```\w+\n(.*?)```", text, re.S)
    assert m, f"README has no {marker} example"
    return m.group(1)


@pytest.mark.slow  # a second interpreter loads the engine (~30 s)
def test_stdio_server_for_desktop_assistants(stdio_data_dir):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    # the desktop-assistant entry of the README, as written there ("python" is this interpreter, "data" the test's)
    entry = json.loads(readme_block("mcp-stdio"))["mcpServers"]["kbqa"]
    assert entry["command"] == "python" and entry["args"][-2:] == ["--data-dir", "data"]
    params = StdioServerParameters(command=sys.executable, args=[*entry["args"][:-1], str(stdio_data_dir)],
                                   cwd=str(REPO), env={**os.environ, "PYTHONUNBUFFERED": "1"})

    async def run():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            kbs = payload(await s.call_tool("list_knowledge_bases", {}))
            hits = payload(await s.call_tool("search", {"query": "规定", "top_k": 2}))
            return tools, kbs, hits

    tools, kbs, hits = anyio.run(run)
    assert tools == TOOLS
    assert kbs[0]["name"] == "默认知识库" and kbs[0]["documents"] == 1
    assert hits and hits[0]["document"] == RULES.name
    json.dumps(hits, ensure_ascii=False)  # plain JSON all the way
