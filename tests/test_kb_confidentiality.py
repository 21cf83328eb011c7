"""Permissions everywhere (issue 27 #4, #5): health, rebuild progress, the 4003 text and Gradio's own event endpoints
show a knowledge base's data only to those who may read it.

Real app over real HTTP with logins (boss = KB admin, alice, bob); a knowledge base 薪酬 only alice may read. The
Gradio handlers are called the way an attacker would: by fn_index through /gradio_api/queue/join, logged in as
bob — Gradio's api_name=False / "private" hides a handler from the docs, not from that route.
"""
from __future__ import annotations

import base64
import json
import uuid

import httpx
import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import LiveApp
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

SECRET = "薪酬制度第三条：高级工程师的年度奖金为十二个月基本工资的百分之三十。"


def auth(user: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("confid")
    engine = tiny_engine(tmp / "data", tiny_model(tmp_path_factory.mktemp("tiny-model")))
    policy = AccessPolicy.from_args([f"{u}:pw-{u}" for u in ("boss", "alice", "bob")], kb_admins=["boss"])
    hr = engine.create_kb("薪酬", "人力资源部专用")
    src = tmp / "薪酬制度.txt"
    src.write_text(SECRET, encoding="utf-8")
    engine.upload([("薪酬制度.txt", src)], kb_id=hr["kb_id"])
    wait_idle(engine)
    app = LiveApp(engine, policy, owns_engine=True)
    # restricted after the page was built: the selector's build-time choices still hold it, so Gradio's own
    # Dropdown check lets its id through and only the handler's reader check stands between bob and the data
    engine.update_kb(hr["kb_id"], None, None, ["alice"])
    app.hr = hr["kb_id"]
    yield app
    app.stop()


def data(resp) -> dict:
    b = resp.json()
    assert b["code"] == 0, b
    return b["data"]


def test_anonymous_health_is_status_only(live):
    with live.http() as http:
        for params in ({}, {"kb_id": live.hr}):
            h = data(http.get("/api/health", params=params))
            assert set(h) == {"status", "engine", "state"}, h
    with live.http(headers=auth("bob")) as http:
        r = http.get("/api/health", params={"kb_id": live.hr}).json()
        assert r["code"] == 4003 and "薪酬" not in r["msg"], r  # no counts, and the 4003 does not name the KB
        h = data(http.get("/api/health"))
        assert h["docs"] == 0 and h["kbs"] == 1  # only what bob may read is counted
    with live.http(headers=auth("alice")) as http:
        assert data(http.get("/api/health", params={"kb_id": live.hr}))["docs"] == 1
        assert data(http.get("/api/health"))["kbs"] == 2


def test_forbidden_text_does_not_name_the_kb(live):
    with live.http(headers=auth("bob")) as http:
        for r in (http.get(f"/api/kbs/{live.hr}"), http.get("/api/kb/documents", params={"kb_id": live.hr})):
            b = r.json()
            assert b["code"] == 4003 and "薪酬" not in b["msg"], b


def test_rebuild_progress_names_files_only_to_readers(live):
    job = live.engine.documents.rebuild_job
    saved = dict(job._status)
    # the state a running rebuild is in while it processes alice's file (a real rebuild of one tiny file is over
    # before a request could see it)
    job._status.update(running=True, done=0, total=1, current="薪酬制度.txt", current_kb_id=live.hr, kb_id=None)
    try:
        with live.http(headers=auth("bob")) as http:
            assert data(http.get("/api/kb/rebuild"))["current"] == ""
            assert data(http.get("/api/health"))["rebuild"]["current"] == ""
        with live.http() as http:
            assert "rebuild" not in data(http.get("/api/health"))
        with live.http(headers=auth("alice")) as http:
            assert data(http.get("/api/kb/rebuild"))["current"] == "薪酬制度.txt"
    finally:
        job._status.clear()
        job._status.update(saved)


# --- Gradio's own protocol ------------------------------------------------------------------------------------
def _fn_index(blocks, name: str) -> int:
    return next(i for i, fn in blocks.fns.items() if getattr(fn.fn, "__name__", "") == name)


def _gradio_call(live, user: str, fn_name: str, args: list) -> dict:
    """Log in through Gradio's /login, join the queue by fn_index, read the SSE stream to the end."""
    with httpx.Client(base_url=live.url.rstrip("/"), timeout=60) as http:
        r = http.post("/login", data={"username": user, "password": f"pw-{user}"})
        assert r.status_code == 200, r.text
        session = uuid.uuid4().hex
        join = http.post("/gradio_api/queue/join", json={
            "data": args, "fn_index": _fn_index(live.blocks, fn_name), "session_hash": session,
            "event_data": None, "trigger_id": None})
        assert join.status_code == 200, join.text
        with http.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}) as s:
            for line in s.iter_lines():
                if line.startswith("data:"):
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_completed":
                        return msg
    raise AssertionError("no process_completed")


def test_gradio_handlers_refuse_a_kb_the_caller_may_not_read(live):
    for fn_name in ("picked", "open_rename"):
        res = _gradio_call(live, "bob", fn_name, [live.hr])
        text = json.dumps(res, ensure_ascii=False)
        assert "薪酬" not in text and "人力资源部专用" not in text and "alice" not in text, (fn_name, text[:600])
    ok = _gradio_call(live, "alice", "picked", [live.hr])
    assert "薪酬" in json.dumps(ok, ensure_ascii=False)  # a reader still gets it
    boss = _gradio_call(live, "boss", "open_rename", [live.hr])
    assert "alice" in json.dumps(boss, ensure_ascii=False)


def test_verified_entry_stays_in_its_sources_kb(live):
    """An entry made from an answer whose sources sit in alice's KB goes there by default, and is refused in the
    open default KB (bob would then retrieve its text)."""
    with live.http(headers=auth("alice")) as http:
        r = data(http.post("/api/qa/ask/sync", json={"question": "高级工程师的年度奖金是多少？", "kb_ids": [live.hr]}))
        assert r["sources"] and {s["kb_id"] for s in r["sources"]} == {live.hr}, r
        fb = data(http.post("/api/feedback", json={"turn_id": r["turn_id"], "rating": "up"}))
    with live.http(headers=auth("boss")) as http:
        body = {"question": "高级工程师奖金怎么算？", "answer": "十二个月基本工资的百分之三十。", "feedback_id": fb["fb_id"]}
        refused = http.post("/api/verified", json={**body, "kb_id": 1}).json()
        assert refused["code"] == 4003 and "只对部分用户开放" in refused["msg"], refused
        entry = data(http.post("/api/verified", json=body))
        doc = live.engine.get_document(entry["doc_id"])
        assert doc["kb_id"] == live.hr
        assert data(http.post("/api/verified", json={"question": "开门时间？", "answer": "九点。"}))  # no sources
    assert live.engine.wait_idle(120)
    with live.http(headers=auth("bob")) as http:
        found = data(http.post("/api/kb/search", json={"query": "高级工程师奖金怎么算", "top_k": 10}))
        assert "百分之三十" not in json.dumps(found, ensure_ascii=False)


def test_gradio_api_describes_only_ask_and_search(live):
    """Gradio's API description (what gradio_client and the page's "Use via API" read) holds the two events meant
    for programs; the page's plumbing (uploads, deletes, settings, keys…) is left out of it."""
    with httpx.Client(base_url=live.url.rstrip("/"), timeout=60) as http:
        assert http.post("/login", data={"username": "boss", "password": "pw-boss"}).status_code == 200
        info = http.get("/gradio_api/info").json()
        assert set(info["named_endpoints"]) == {"/ask", "/debug_search"}
        assert not info.get("unnamed_endpoints")
        everything = http.get("/gradio_api/info", params={"all_endpoints": "True"}).json()["named_endpoints"]
        assert {"/kb_delete", "/kb_upload", "/settings_save", "/keys_create"} <= set(everything)


def test_documented_events_apply_the_kb_permissions(live):
    """Called by the standard gradio_client, logged in: bob (not a reader of 薪酬) gets nothing of it from
    either documented event, alice does."""
    from gradio_client import Client

    def client(user):
        return Client(live.url, auth=(user, f"pw-{user}"), analytics_enabled=False, verbose=False)

    bob, alice = client("bob"), client("alice")
    for who, sees in ((bob, False), (alice, True)):
        status, *cols = who.predict(query="高级工程师的年度奖金", top_k=5, kbs=[live.hr], api_name="/debug_search")
        assert ("年度奖金" in "".join(cols)) is sees, (status, cols)
        out = who.predict(question_text="高级工程师的年度奖金是多少？", use_kb_value=True, kb_value=[live.hr],
                          api_name="/ask")
        assert ("十二个月基本工资" in json.dumps(out, ensure_ascii=False)) is sees
