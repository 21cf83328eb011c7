"""Conversation endpoints over real HTTP (the launched app, logins on): list, get, rename, export, delete, clear,
conversation_id on /api/qa/ask (SSE) and /ask/sync, another user's conversation refused, unknown id 3002."""
from __future__ import annotations

import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import live_with_doc
from tests.test_api import sse_events
from tests.test_ui_chat import QUESTION

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

ALICE, BOB = ("alice", "pw-a"), ("bob", "pw-b")


@pytest.fixture(scope="module")
def live(tmp_path_factory, make_deployment):  # embedded and team mode (tests/conftest.py)
    yield from live_with_doc(tmp_path_factory, "apiconv", AccessPolicy.from_args(["alice:pw-a", "bob:pw-b"]),
                             deployment=make_deployment())


def _ask_sse(http, auth, **body):
    with http.stream("POST", "/api/qa/ask", json=body, auth=auth) as r:
        assert r.status_code == 200
        return sse_events(r)


def test_conversation_lifecycle_over_http(http):
    events = _ask_sse(http, ALICE, question=QUESTION)
    done = events[-1]
    assert done[0] == "done" and done[1]["route"] in ("LIGHT", "STRONG")
    cid = done[1]["conversation_id"]
    # the follow-up through the sync endpoint, in the same conversation
    r = http.post("/api/qa/ask/sync", json={"question": "那服务时间呢？", "conversation_id": cid}, auth=ALICE).json()
    assert r["code"] == 0 and r["data"]["conversation_id"] == cid
    assert "客服电话" in r["data"]["rewritten_query"] and r["data"]["turn_id"] > done[1]["turn_id"]

    listing = http.get("/api/conversations", auth=ALICE).json()["data"]
    assert listing["items"][0]["conv_id"] == cid and listing["items"][0]["turn_count"] == 2
    conv = http.get(f"/api/conversations/{cid}", auth=ALICE).json()["data"]
    assert [t["question"] for t in conv["turns"]] == [QUESTION, "那服务时间呢？"]
    assert conv["turns"][0]["sources"] and conv["turns"][0]["trace"]["fused"]

    r = http.patch(f"/api/conversations/{cid}", json={"title": "客服问题"}, auth=ALICE).json()
    assert r["code"] == 0 and r["data"]["title"] == "客服问题"
    assert http.patch(f"/api/conversations/{cid}", json={"title": ""}, auth=ALICE).json()["code"] == 1001

    md = http.get(f"/api/conversations/{cid}/export", auth=ALICE)
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    assert md.text.startswith("# 客服问题") and "**问：** 那服务时间呢？" in md.text and "400-800-1234" in md.text
    assert "attachment" in md.headers["content-disposition"]

    r = http.delete(f"/api/conversations/{cid}", auth=ALICE).json()
    assert r["code"] == 0 and r["data"]["turns_removed"] == 2
    assert http.get(f"/api/conversations/{cid}", auth=ALICE).status_code == 404


def test_other_users_conversation_is_refused(http):
    cid = http.post("/api/qa/ask/sync", json={"question": QUESTION}, auth=ALICE).json()["data"]["conversation_id"]
    for method, path, body in (("GET", f"/api/conversations/{cid}", None),
                               ("GET", f"/api/conversations/{cid}/export", None),
                               ("PATCH", f"/api/conversations/{cid}", {"title": "偷看"}),
                               ("DELETE", f"/api/conversations/{cid}", None),
                               ("POST", "/api/qa/ask/sync", {"question": "那服务时间呢？", "conversation_id": cid})):
        r = http.request(method, path, json=body, auth=BOB)
        assert r.status_code == 403 and r.json()["code"] == 4003, (method, path, r.text)
    events = _ask_sse(http, BOB, question="那服务时间呢？", conversation_id=cid)
    assert events == [("error", {"code": 4003, "msg": "无权访问该会话：它属于其他用户"})]
    assert cid not in [c["conv_id"] for c in http.get("/api/conversations", auth=BOB).json()["data"]["items"]]
    # bob clearing his history leaves alice's alone
    assert http.delete("/api/conversations", auth=BOB).json()["code"] == 0
    assert http.get(f"/api/conversations/{cid}", auth=ALICE).json()["code"] == 0
    assert http.get("/api/conversations", auth=None).status_code == 401


def test_unknown_conversation_id_is_3002_never_a_new_conversation(http):
    before = http.get("/api/conversations", auth=ALICE).json()["data"]["total"]
    r = http.post("/api/qa/ask/sync", json={"question": QUESTION, "conversation_id": "a" * 32}, auth=ALICE)
    assert r.status_code == 404 and r.json()["code"] == 3002 and "会话不存在" in r.json()["msg"]
    events = _ask_sse(http, ALICE, question=QUESTION, conversation_id="nope")
    assert events[0][0] == "error" and events[0][1]["code"] == 3002
    assert http.get("/api/conversations/" + "b" * 32, auth=ALICE).json()["code"] == 3002
    assert http.get("/api/conversations", auth=ALICE).json()["data"]["total"] == before


def test_clear_all_and_knowledge_switch(http):
    d = http.post("/api/qa/ask/sync", json={"question": QUESTION, "use_kb": False}, auth=BOB).json()["data"]
    assert d["route"] == "DIRECT" and d["sources"] == [] and d["trace"]["route"]["kind"] == "kb_off"
    d = http.post("/api/qa/ask/sync", json={"question": "谢谢！"}, auth=BOB).json()["data"]
    assert d["route"] == "DIRECT" and d["mode"] == "fixed"
    assert http.get("/api/conversations", auth=BOB).json()["data"]["total"] >= 2
    r = http.delete("/api/conversations", auth=BOB).json()
    assert r["code"] == 0 and r["data"]["conversations_removed"] >= 2
    assert http.get("/api/conversations", auth=BOB).json()["data"]["total"] == 0
    assert http.post("/api/qa/ask/sync", json={"question": "x", "use_kb": "maybe"}, auth=BOB).json()["code"] == 1001
