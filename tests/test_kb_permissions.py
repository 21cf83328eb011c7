"""Per-KB readers over real HTTP with logins: a knowledge base open to every user (the default) or restricted to
listed users (KB admins always read). Refused reads answer 4003 with a Chinese message; unscoped questions use
only readable knowledge bases; the chat's KB picker offers only readable ones; replayed conversations hide the
text of sources a user may no longer read."""
from __future__ import annotations

import base64
import json

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.engine import Engine
from tests.live import LiveApp

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

SECRET = ("薪酬制度第三条：高级工程师的年度奖金为十二个月基本工资的百分之三十，"
          "于每年一月随工资发放。本制度仅限人力资源部查阅。")
PUBLIC = ("员工手册：办公室每天早上九点开门，晚上七点锁门；访客需要在前台登记并佩戴访客证。"
          "年度奖金的发放时间以人力资源部通知为准。")
QUESTION = "高级工程师的年度奖金是多少？"


def auth(user: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


def body(resp) -> dict:
    return resp.json()


def ok(resp):
    b = resp.json()
    assert b["code"] == 0, b
    return b["data"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    policy = AccessPolicy.from_args([f"{u}:pw-{u}" for u in ("boss", "alice", "bob")], kb_admins=["boss"])
    app = LiveApp(Engine(tmp_path_factory.mktemp("perm") / "data"), policy)
    yield app
    app.stop(close_engine=True)


@pytest.fixture(scope="module")
def kbs(live, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("perm-src")
    with live.http(headers=auth("boss")) as http:
        bad = body(http.post("/api/kbs", json={"name": "薪酬", "readers": ["alice", "nobody"]}))
        assert bad["code"] == 1001 and "nobody" in bad["msg"]
        hr = ok(http.post("/api/kbs", json={"name": "薪酬", "readers": ["alice"]}))
        assert hr["readers"] == ["alice"]
        ids = {}
        for name, text, kb_id in (("薪酬制度.txt", SECRET, hr["kb_id"]), ("员工手册.txt", PUBLIC, 1)):
            (tmp / name).write_text(text, encoding="utf-8")
            res = ok(http.post("/api/kb/documents", params={"kb_id": kb_id},
                               files=[("file", (name, (tmp / name).read_bytes()))]))
            ids[name] = res[0]["doc_id"]
    assert live.engine.wait_idle(300)
    secret_chunk = live.engine.document_chunks(ids["薪酬制度.txt"])[0]["chunk_id"]
    return {"hr": hr["kb_id"], "secret": ids["薪酬制度.txt"], "public": ids["员工手册.txt"], "chunk": secret_chunk}


def test_kb_list_and_management(live, kbs):
    with live.http(headers=auth("bob")) as http:
        assert [k["name"] for k in ok(http.get("/api/kbs"))] == ["默认知识库"]
        r = body(http.get(f"/api/kbs/{kbs['hr']}"))
        assert r["code"] == 4003 and "无权访问该知识库" in r["msg"] and "薪酬" not in r["msg"]  # no name (issue 27)
        assert body(http.put(f"/api/kbs/{kbs['hr']}", json={"readers": None}))["code"] == 4003  # not a KB admin
    with live.http(headers=auth("alice")) as http:
        assert {k["name"] for k in ok(http.get("/api/kbs"))} == {"默认知识库", "薪酬"}
    with live.http(headers=auth("boss")) as http:
        listed = {k["name"]: k for k in ok(http.get("/api/kbs"))}
        assert listed["默认知识库"]["readers"] is None and listed["薪酬"]["readers"] == ["alice"]
        renamed = ok(http.put(f"/api/kbs/{kbs['hr']}", json={"description": "人力资源"}))  # readers unchanged
        assert renamed["readers"] == ["alice"] and renamed["description"] == "人力资源"


@pytest.mark.parametrize("path", ["/api/kb/documents/{doc}/text", "/api/kb/documents/{doc}/file",
                                  "/api/kb/documents/{doc}/chunks", "/api/kb/documents/{doc}/versions",
                                  "/api/kb/documents/{doc}/page", "/api/kb/documents?kb_id={kb}"])
def test_document_reads_refused(live, kbs, path):
    url = path.format(doc=kbs["secret"], kb=kbs["hr"])
    with live.http(headers=auth("bob")) as http:
        r = body(http.get(url))
        assert r["code"] == 4003 and "薪酬" not in r["msg"], r  # the 4003 names no KB (issue 27)
    with live.http(headers=auth("alice")) as http:
        resp = http.get(url)
        if "/file" in url:
            assert resp.content.decode("utf-8") == SECRET
        else:  # a .txt has no page image (1001): anything but a refusal
            assert resp.json()["code"] == (1001 if "/page" in url else 0), resp.json()


def test_questions_scoped_to_readable_kbs(live, kbs):
    with live.http(headers=auth("bob")) as http:
        r = body(http.post("/api/qa/ask/sync", json={"question": QUESTION, "kb_ids": [1, kbs["hr"]]}))
        assert r["code"] == 4003 and "薪酬" not in r["msg"]
        r = body(http.post("/api/kb/search", json={"query": QUESTION, "kb_id": kbs["hr"]}))
        assert r["code"] == 4003
        with http.stream("POST", "/api/qa/ask", json={"question": QUESTION, "kb_id": kbs["hr"]}) as resp:
            events = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
        assert events[-1].get("code") == 4003, events[-1]
        unscoped = ok(http.post("/api/qa/ask/sync", json={"question": QUESTION}))
        assert all(s["kb_id"] == 1 for s in unscoped["sources"])
        assert "百分之三十" not in unscoped["answer"]
    with live.http(headers=auth("alice")) as http:
        scoped = ok(http.post("/api/qa/ask/sync", json={"question": QUESTION, "kb_id": kbs["hr"]}))
        assert scoped["sources"] and scoped["sources"][0]["doc_id"] == kbs["secret"]
        conv = scoped["conversation_id"]
    # readers changed: alice loses the knowledge base; her stored conversation no longer shows its text
    with live.http(headers=auth("boss")) as http:
        assert ok(http.put(f"/api/kbs/{kbs['hr']}", json={"readers": ["bob"]}))["readers"] == ["bob"]
    try:
        with live.http(headers=auth("alice")) as http:
            turns = ok(http.get(f"/api/conversations/{conv}"))["turns"]
            src = turns[0]["sources"][0]
            assert src["restricted"] and "百分之三十" not in src["text"] and turns[0]["trace"] is None
            assert "百分之三十" not in http.get(f"/api/conversations/{conv}/export").text.split("**答：**")[0]
            assert body(http.get(f"/api/kb/documents/{kbs['secret']}/text"))["code"] == 4003
        with live.http(headers=auth("bob")) as http:
            assert ok(http.get(f"/api/kb/documents/{kbs['secret']}/text"))["text"].startswith("薪酬制度")
    finally:
        with live.http(headers=auth("boss")) as http:
            ok(http.put(f"/api/kbs/{kbs['hr']}", json={"readers": ["alice"]}))


def test_restricted_default_kb_unscoped_uses_readable_ones(live, kbs):
    with live.http(headers=auth("boss")) as http:
        ok(http.put("/api/kbs/1", json={"readers": ["boss"]}))
    try:
        with live.http(headers=auth("bob")) as http:  # reads nothing now
            r = body(http.post("/api/qa/ask/sync", json={"question": QUESTION}))
            assert r["code"] == 4003 and "没有可以访问的知识库" in r["msg"]
            assert ok(http.get("/api/kbs")) == []
        with live.http(headers=auth("alice")) as http:  # the default is closed to her: her readable one is used
            res = ok(http.post("/api/qa/ask/sync", json={"question": QUESTION}))
            assert res["sources"] and {s["kb_id"] for s in res["sources"]} == {kbs["hr"]}
    finally:
        with live.http(headers=auth("boss")) as http:
            assert ok(http.put("/api/kbs/1", json={"readers": None}))["readers"] is None


def test_chat_picker_offers_readable_kbs(live, kbs):
    """The 问答 tab's KB picker, as the page load fills it for each logged-in user (Gradio over HTTP)."""
    from ui.guard import reader_of
    from ui.kb_spaces import refresh_scope

    policy = AccessPolicy.from_args([f"{u}:pw-{u}" for u in ("boss", "alice", "bob")], kb_admins=["boss"])

    class Req:  # what Gradio hands a handler: the logged-in user
        def __init__(self, username):
            self.username = username

    for user, names in (("bob", ["默认知识库"]), ("alice", ["默认知识库", "薪酬"]), ("boss", ["默认知识库", "薪酬"])):
        dd = refresh_scope(live.engine, reader_of(policy, Req(user)))
        assert [c[0] for c in dd.choices] == names and dd.value == [c[1] for c in dd.choices]
