"""The audit log: one row per question through each door (page over Gradio's own client, REST sync and SSE, MCP)
with the right user and outcome, admin actions, filters, CSV / JSONL export that round-trips, retention."""
from __future__ import annotations

import csv
import io
import json
import time

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.errors import EngineError
from pipeline.services.audit_log import Actor
from tests.live import LiveApp
from tests.mcp_client import basic, over_http
from tests.shared_data import RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

pytestmark = needs(RULES)

ADMIN, BOB = ("root", "r-pw"), ("bob", "b-pw")
OFF_TOPIC = "火星上的第一座城市叫什么名字？"


def first_line() -> str:
    return next(line.strip() for line in RULES.read_text(encoding="utf-8").split("\n") if len(line.strip()) > 12)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("audit-log")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    assert all(r.ok for r in engine.upload([(RULES.name, RULES)]))
    wait_idle(engine)
    policy = AccessPolicy.from_args([":".join(ADMIN), ":".join(BOB)], [ADMIN[0]], [ADMIN[0]])
    app = LiveApp(engine, policy, owns_engine=True)
    yield app
    app.stop()


def rows(engine, **filters) -> list[dict]:
    return engine.audit_log(1, 500, **filters)["items"]


def newest(engine, **filters) -> dict:
    found = rows(engine, **filters)
    assert found, filters
    return found[0]


def test_each_door_writes_one_row_with_user_and_outcome(live):
    engine = live.engine
    q = first_line()
    before = rows(engine, kind="question")
    with live.http(auth=BOB) as http:
        sync = http.post("/api/qa/ask/sync", json={"question": q}).json()
        assert sync["code"] == 0
        with http.stream("POST", "/api/qa/ask", json={"question": OFF_TOPIC}) as r:
            body = "".join(r.iter_text())
        assert "event: done" in body

    asked = over_http(live.url, basic(*BOB), lambda session: session.call_tool("ask", {"question": q}))
    assert not asked.is_error
    page = live.client(auth=BOB)
    page.predict(api_name="/new_conversation")
    page.submit(q, True, api_name="/ask").result(timeout=180)

    new = rows(engine, kind="question")[: len(rows(engine, kind="question")) - len(before)]
    by_door = {}
    for r in new:
        by_door.setdefault(r["door"], []).append(r)
    assert sorted((d, len(v)) for d, v in by_door.items()) == [("mcp", 1), ("page", 1), ("rest", 2)]
    assert all(r["actor"] == "bob" and r["kb_ids"] == [1] and r["latency_ms"] >= 0 for r in new)
    rest_sync = next(r for r in by_door["rest"] if r["question"] == q)
    expected = "refuse" if sync["data"]["no_answer"] else "weak" if sync["data"]["weak"] else "answer"
    assert rest_sync["outcome"] == expected
    cited = {s["doc_name"] for s in sync["data"]["sources"] if s["cited"]}
    assert {c["doc_name"] for c in rest_sync["cited"]} == cited
    sse = next(r for r in by_door["rest"] if r["question"] == OFF_TOPIC)
    assert sse["outcome"] == "refuse" and sse["cited"] == []
    assert by_door["page"][0]["question"] == q and by_door["mcp"][0]["question"] == q


def test_errors_and_hang_ups_are_recorded_too(live):
    engine = live.engine
    with pytest.raises(EngineError):
        engine.ask_sync("x", kb_ids=[999], actor=Actor("carol", "rest"))
    row = newest(engine, actor="carol")
    assert row["outcome"] == "error" and row["detail"]["code"] == 3002 and row["kb_ids"] == [999]
    stream = engine.ask(first_line(), actor=Actor("dave", "rest"))
    next(stream)  # the first event, then the client goes away
    stream.close()
    assert newest(engine, actor="dave")["outcome"] == "aborted"


def test_admin_actions_go_to_the_same_log_without_secrets(live):
    engine = live.engine
    with live.http(auth=ADMIN) as http:
        assert http.put("/api/config", json={"llm": {"llm_api_key": "sk-very-secret-1234"}}).json()["code"] == 0
        kb = http.post("/api/kbs", json={"name": "合同", "description": "x"}).json()["data"]
        assert http.put(f"/api/kbs/{kb['kb_id']}", json={"readers": [BOB[0]]}).json()["code"] == 0
        assert http.delete(f"/api/kbs/{kb['kb_id']}", params={"confirm": "true"}).json()["code"] == 0
        export = http.get("/api/audit-log/export", params={"format": "jsonl", "kind": "admin"}).text
    actions = [r["action"] for r in rows(engine, kind="admin", actor=ADMIN[0])]
    assert actions[:4] == ["kb.delete", "kb.readers", "kb.create", "settings.update"]
    readers = newest(engine, actor=ADMIN[0], kind="admin", kb_id=kb["kb_id"])  # newest of that KB: the delete
    assert readers["door"] == "rest"
    change = next(r for r in rows(engine, kind="admin") if r["action"] == "kb.readers")
    assert change["detail"]["before"] is None and change["detail"]["after"] == [BOB[0]]
    assert next(r for r in rows(engine, kind="admin") if r["action"] == "settings.update")["detail"] == {
        "changed": ["llm_api_key"]}
    assert "sk-very-secret" not in export and "llm_api_key" in export


def test_filters_and_both_exports_round_trip(live):
    engine = live.engine
    engine.ask_sync(OFF_TOPIC, actor=Actor("erin", "openai"))
    assert [r["actor"] for r in rows(engine, door="openai")] == ["erin"]
    assert all(r["outcome"] == "refuse" for r in rows(engine, outcome="refuse"))
    today = time.strftime("%Y-%m-%d")
    assert rows(engine, since=today, until=today) == rows(engine)
    assert rows(engine, until="2000-01-01") == []
    with live.http(auth=ADMIN) as http:
        listed = http.get("/api/audit-log", params={"size": 500}).json()["data"]["items"]
        jsonl = http.get("/api/audit-log/export", params={"format": "jsonl"}).text
        csv_text = http.get("/api/audit-log/export", params={"format": "csv"}).text
        bad = http.get("/api/audit-log", params={"since": "昨天"}).json()
    assert bad["code"] == 1001 and "since" in bad["msg"]
    from_jsonl = [json.loads(line) for line in jsonl.splitlines()]
    assert from_jsonl == list(reversed(listed))  # oldest first, every field
    table = list(csv.DictReader(io.StringIO(csv_text.lstrip("\ufeff"))))
    assert [int(r["entry_id"]) for r in table] == [r["entry_id"] for r in from_jsonl]
    assert [r["question"] for r in table] == [r["question"] or "" for r in from_jsonl]
    assert [json.loads(r["cited"]) for r in table] == [r["cited"] for r in from_jsonl]


def test_only_admins_read_the_log(live):
    with live.http(auth=BOB) as http:
        assert http.get("/api/audit-log").json()["code"] == 4003
        assert http.get("/api/audit-log/export").json()["code"] == 4003


def test_retention_deletes_old_rows(tmp_path):
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"), audit_retention_days=30)
    try:
        log = engine.audit_log_service
        now = time.time()  # the log's clock is a component: set to fixed days
        log.clock = lambda: now - 40 * 86400  # a row written 40 days ago …
        engine.ask_sync("你好", actor=Actor("old", "rest"))
        log.clock = lambda: now - 10 * 86400  # … one 10 days ago …
        engine.ask_sync("你好", actor=Actor("recent", "rest"))
        log.clock = lambda: now
        assert {r["actor"] for r in rows(engine)} == {"old", "recent"}
        assert log.purge_expired() == 1  # … the app keeps 30 days
        assert [r["actor"] for r in rows(engine)] == ["recent"]
        engine.update_settings({"audit_retention_days": 0})  # 0 = keep forever
        log.clock = lambda: now + 1000 * 86400
        assert log.purge_expired() == 0 and len(rows(engine)) == 2  # the recent one and the settings change
    finally:
        engine.close()
