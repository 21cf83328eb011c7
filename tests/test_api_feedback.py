"""Feedback and verified Q&A endpoints over real HTTP (logins on): POST /api/feedback (own answers only),
GET /api/feedback and /api/feedback/export (KB admins), POST/GET/DELETE /api/verified (KB admins)."""
from __future__ import annotations

import json

import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import live_with_doc
from tests.test_ui_chat import QUESTION
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

ADMIN, USER = ("root", "pw-r"), ("bob", "pw-b")


@pytest.fixture(scope="module")
def live(tmp_path_factory, make_deployment):  # embedded and team mode (tests/conftest.py)
    yield from live_with_doc(tmp_path_factory, "apifb",
                             AccessPolicy.from_args(["root:pw-r", "bob:pw-b"], kb_admins=["root"]),
                             deployment=make_deployment())


def _ask(http, auth, q):
    return http.post("/api/qa/ask/sync", json={"question": q}, auth=auth).json()["data"]


def test_feedback_endpoints(http):
    d = _ask(http, USER, QUESTION)
    r = http.post("/api/feedback", json={"turn_id": d["turn_id"], "rating": "down", "reason": "不准确",
                                         "comment": "电话号码写错了"}, auth=USER).json()
    assert r["code"] == 0 and r["data"]["reason"] == "不准确"
    # someone else's answer
    other = _ask(http, ADMIN, QUESTION)
    r = http.post("/api/feedback", json={"turn_id": other["turn_id"], "rating": "up"}, auth=USER)
    assert r.status_code == 403 and r.json()["code"] == 4003
    r = http.post("/api/feedback", json={"turn_id": d["turn_id"], "rating": "down", "reason": "太差"}, auth=USER)
    assert r.status_code == 400 and r.json()["code"] == 1001
    assert http.post("/api/feedback", json={"turn_id": 10 ** 9, "rating": "up"}, auth=USER).json()["code"] == 3002
    # the admin view: KB admins only
    assert http.get("/api/feedback", auth=USER).status_code == 403
    items = http.get("/api/feedback", params={"rating": "down"}, auth=ADMIN).json()["data"]["items"]
    assert items[0]["comment"] == "电话号码写错了" and items[0]["user"] == "bob" and items[0]["sources"]
    exp = http.get("/api/feedback/export", params={"rating": "down"}, auth=ADMIN)
    assert exp.status_code == 200 and exp.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(x) for x in exp.text.splitlines()]
    assert rows and rows[-1]["question"] == QUESTION and rows[-1]["reason"] == "不准确"
    assert http.get("/api/feedback/export", auth=USER).status_code == 403


def test_verified_endpoints(http, live):
    d = _ask(http, USER, QUESTION)
    fb = http.post("/api/feedback", json={"turn_id": d["turn_id"], "rating": "up"}, auth=USER).json()["data"]
    q, a = "星河电子的售后热线是什么？", "售后热线 400-800-1234，每天 9 点到 21 点。"
    body = {"question": q, "answer": a, "feedback_id": fb["fb_id"]}
    assert http.post("/api/verified", json=body, auth=USER).status_code == 403
    r = http.post("/api/verified", json=body, auth=ADMIN).json()
    assert r["code"] == 0 and r["data"]["cited"]
    qa_id = r["data"]["qa_id"]
    wait_until(lambda: http.get("/api/verified", auth=ADMIN).json()["data"][0]["status"] == "ready", 120, 0.3,
               "the verified answer to be indexed (ready)")
    ans = _ask(http, USER, q)
    assert ans["sources"][0]["verified"] and a in ans["answer"]
    r = http.delete(f"/api/verified/{qa_id}", auth=ADMIN).json()
    assert r["code"] == 0
    assert http.delete(f"/api/verified/{qa_id}", auth=ADMIN).json()["code"] == 3002
    assert not any(s["verified"] for s in _ask(http, USER, q)["sources"])
    assert http.post("/api/verified", json={"question": "", "answer": "x"}, auth=ADMIN).json()["code"] == 1001
