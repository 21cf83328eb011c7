"""API keys on the doors of other tools, on the open local app (no --auth): once a key exists, /mcp (like /v1) needs
one; a key limited to one knowledge base never sees another's passages through any MCP tool; the OpenAI SDK and
the MCP SDK with that key are recorded in the audit log as key:<name>; creating and revoking it are admin entries."""
from __future__ import annotations

import httpx
import pytest

from tests.live import LiveApp
from tests.mcp_client import over_http
from tests.shared_data import RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

pytestmark = needs(RULES)
SECRET = "白鹭洲仓库的备用钥匙放在值班室第三个抽屉。"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys-doors")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    other = engine.create_kb("仓库", "")["kb_id"]
    note = tmp / "钥匙.txt"
    note.write_text(SECRET * 3, encoding="utf-8")
    assert all(r.ok for r in engine.upload([(RULES.name, RULES)]))
    assert all(r.ok for r in engine.upload([(note.name, note)], kb_id=other))
    wait_idle(engine)
    app = LiveApp(engine, owns_engine=True)
    app.other_kb = other
    yield app
    app.stop()


@pytest.fixture(scope="module")
def key(live):
    with live.http() as http:  # the open local tool: its user is the admin
        made = http.post("/api/keys", json={"name": "助手", "role": "reader", "kb_ids": [1], "rate_limit": 0}).json()
    assert made["code"] == 0, made
    return made["data"]


def mcp(live, headers: dict, work):
    return over_http(live.url, headers, work)


def test_mcp_needs_a_key_once_one_exists(live, key):
    r = httpx.post(live.url + "mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                   headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and "API Key" in r.json()["msg"]
    bad = httpx.post(live.url + "mcp", json={}, headers={"Authorization": "Bearer kbqa-wrong"})
    assert bad.status_code == 401


def test_a_key_for_one_kb_sees_nothing_of_another_through_any_tool(live, key):
    other = live.other_kb
    doc = next(d for d in live.engine.components.docs.all_docs() if d["kb_id"] == other)
    chunk = live.engine.components.docs.chunks_of(doc["doc_id"])[0]

    async def work(s):
        kbs = (await s.call_tool("list_knowledge_bases", {})).structured_content["result"]
        refused = [await s.call_tool("search", {"query": "备用钥匙", "kb_ids": [other]}),
                   await s.call_tool("ask", {"question": "备用钥匙放在哪里？", "kb_ids": [other]}),
                   await s.call_tool("read_document", {"doc_id": doc["doc_id"], "chunk_id": chunk["chunk_id"]})]
        hits = (await s.call_tool("search", {"query": "备用钥匙 值班室", "top_k": 20})).structured_content["result"]
        asked = (await s.call_tool("ask", {"question": "备用钥匙放在哪里？"})).structured_content
        return kbs, refused, hits, asked

    kbs, refused, hits, asked = mcp(live, {"Authorization": f"Bearer {key['secret']}"}, work)
    assert [k["kb_id"] for k in kbs] == [1]
    for r in refused:
        assert r.is_error and "4003" in r.content[0].text and "仓库" not in r.content[0].text
    assert hits and all("白鹭洲" not in h["text"] and h["kb_id"] == 1 for h in hits)
    assert all("白鹭洲" not in s["text"] for s in asked["sources"]) and "白鹭洲" not in asked["answer"]
    rows = live.engine.audit_log(1, 50, door="mcp")["items"]
    assert rows and all(r["actor"] == "key:助手" for r in rows)
    assert {r["outcome"] for r in rows} <= {"error", "answer", "weak", "refuse"}


def test_openai_door_and_key_lifecycle_in_the_audit_log(live, key):
    import openai

    client = openai.OpenAI(base_url=live.url + "v1", api_key=key["secret"])
    reply = client.chat.completions.create(model="kb-1", messages=[{"role": "user", "content": "火星上有城市吗？"}])
    row = live.engine.audit_log(1, 5, door="openai")["items"][0]
    assert row["actor"] == "key:助手" and row["question"] == "火星上有城市吗？" and row["kb_ids"] == [1]
    assert row["outcome"] == reply.model_extra["kbqa"]["outcome"]
    with live.http() as http:
        assert http.delete(f"/api/keys/{key['key_id']}").json()["code"] == 0
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="kb-1", messages=[{"role": "user", "content": "你好"}])
    admin = [(r["action"], r["detail"]) for r in live.engine.audit_log(1, 50, kind="admin")["items"]]
    actions = [a for a, _ in admin]
    assert actions.index("key.revoke") < actions.index("key.create")  # newest first
    created = next(d for a, d in admin if a == "key.create")
    assert created["name"] == "助手" and created["prefix"] == key["prefix"]
    export = live.engine.export_audit_log("jsonl")
    assert key["secret"] not in export  # the prefix only, never the secret
