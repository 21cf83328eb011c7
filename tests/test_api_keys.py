"""API keys and rate limits: the lifecycle over real HTTP with logins on (create as admin, use on /api and /v1,
list without secrets, revoke → refused at once, expiry, roles), what the database and the backups hold (the hash,
never the secret), and — on SQLite and PostgreSQL — revocation and rate counters shared between two `Database`s
on one database, as two app processes see it."""
from __future__ import annotations

import hashlib
import logging
import sqlite3
from pathlib import Path

import httpx
import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.errors import RateLimited
from pipeline.services.api_keys import ApiKeyService
from pipeline.services.audit_log import AuditLog
from pipeline.services.rate_limits import RateLimiter
from store.api_keys import ApiKeyStore, RateWindowStore
from store.audit_log import AuditLogStore
from store.db import Database
from tests.live import LiveApp
from tests.tiny_engine import tiny_engine, tiny_model
from tests.waiting import wait_until

USERS = AccessPolicy.from_args(["boss:pw-b", "alice:pw-a"], admins=["boss"])
BOSS, ALICE = ("boss", "pw-b"), ("alice", "pw-a")


# --- two processes on one database (store + service level, both dialects) ----------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def target(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "app.db"
    return request.getfixturevalue("pg_server").create_database()


def services(db: Database, limit: int = 3) -> tuple[ApiKeyService, RateLimiter]:
    audit = AuditLog(AuditLogStore(db), retention_days=lambda: 0)
    return (ApiKeyService(ApiKeyStore(db), lambda kb_id: int(kb_id), audit),
            RateLimiter(RateWindowStore(db), lambda: limit))


def test_revocation_and_counters_are_shared_between_processes(target):
    one, two = Database(target), Database(target)
    try:
        (keys1, limits1), (keys2, limits2) = services(one), services(two)
        made = keys1.create("脚本", "reader", [1], rate_limit=5, created_by="boss")
        secret = made.pop("secret")
        assert secret.startswith("kbqa-") and made["prefix"] == secret[:12] and made["kb_ids"] == [1]
        assert keys2.authenticate(secret)["key_id"] == made["key_id"] and keys2.any_active()
        assert keys2.authenticate(secret + "x") is None and keys2.authenticate("sk-other") is None
        keys1.revoke(made["key_id"])
        assert keys2.authenticate(secret) is None  # the other process refuses it on its very next check
        assert [k["revoked"] for k in keys2.list()] == [True]
        wait_until(lambda: not keys2.any_active(), 5, 0.1, "the one-second cache to expire")
        # one window for both: 2 + 1 requests fill a limit of 3, the 4th (in either) is refused
        limits1.check("key:7")
        limits1.check("key:7")
        limits2.check("key:7")
        with pytest.raises(RateLimited) as exc:
            limits2.check("key:7")
        assert exc.value.code == 4029 and 1 <= exc.value.retry_after <= 60
        limits1.check("user:alice")  # another bucket has its own count
        limits1.check("key:7", limit=0)  # 0 = no limit
    finally:
        one.close()
        two.close()


def test_key_validation(tmp_path):
    db = Database(tmp_path / "app.db")
    keys, _ = services(db)
    try:
        for kwargs, field in (({"name": ""}, "name"), ({"name": "k", "role": "root"}, "role"),
                              ({"name": "k", "kb_ids": []}, "kb_ids"), ({"name": "k", "rate_limit": -1}, "rate_limit"),
                              ({"name": "k", "expires_at": "2001-01-01T00:00:00"}, "expires_at"),
                              ({"name": "k", "expires_at": "明天"}, "expires_at")):
            with pytest.raises(Exception) as exc:
                keys.create(**kwargs)
            assert getattr(exc.value, "field", None) == field, kwargs
    finally:
        db.close()


# --- over HTTP, logins on --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    app = LiveApp(tiny_engine(tmp / "data", tiny_model(tmp_path_factory.getbasetemp() / "tiny-bert")), USERS)
    app.tmp = tmp
    yield app
    app.stop(close_engine=True)


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def data(r: httpx.Response):
    body = r.json()
    assert body["code"] == 0, body
    return body["data"]


def test_key_lifecycle(live, caplog):
    caplog.set_level(logging.DEBUG)
    with live.http() as http:
        assert http.post("/api/keys", json={"name": "x"}, auth=ALICE).json()["code"] == 4003  # admins only
        assert http.post("/api/keys", json={"name": "x"}).status_code == 401
        made = data(http.post("/api/keys", json={"name": "报表机器人", "role": "reader"}, auth=BOSS))
        secret = made["secret"]
        assert made["created_by"] == "boss" and made["active"] and made["role"] == "reader"
        # the key works on /api and /v1; a login keeps working beside it
        assert [k["kb_id"] for k in data(http.get("/api/kbs", headers=bearer(secret)))] == [1]
        assert http.get("/v1/models", headers=bearer(secret)).status_code == 200
        assert http.get("/v1/models", auth=ALICE).status_code == 200
        assert http.get("/v1/models").status_code == 401 and http.get("/api/kbs").status_code == 401
        assert http.get("/api/kbs", auth=("alice", "wrong")).status_code == 401
        # its role is the key's: a reader key cannot create keys or read the settings
        assert http.post("/api/keys", json={"name": "y"}, headers=bearer(secret)).status_code == 403
        assert http.get("/api/config", headers=bearer(secret)).status_code == 403
        listed = data(http.get("/api/keys", auth=BOSS))
        assert [k["prefix"] for k in listed] == [secret[:12]] and listed[0]["last_used_at"]
        assert secret not in http.get("/api/keys", auth=BOSS).text
        assert secret not in http.get("/api/health").text
        # revoked: refused from the next request on
        assert data(http.delete(f"/api/keys/{made['key_id']}", auth=BOSS))["revoked"] is True
        r = http.get("/api/kbs", headers=bearer(secret))
        assert r.status_code == 401 and r.json()["code"] == 4001
        assert http.get("/v1/models", headers=bearer(secret)).json()["error"]["code"] == "invalid_api_key"
        assert http.delete("/api/keys/999", auth=BOSS).json()["code"] == 3002
        # an admin key may manage keys; a key that expires stops working by itself
        admin = data(http.post("/api/keys", json={"name": "运维", "role": "admin"}, auth=BOSS))["secret"]
        short = data(http.post("/api/keys", json={"name": "临时", "expires_in_days": 2 / 86400},
                               headers=bearer(admin)))
        assert short["created_by"] == "key:运维"
        assert http.get("/api/kbs", headers=bearer(short["secret"])).status_code == 200
        wait_until(lambda: http.get("/api/kbs", headers=bearer(short["secret"])).status_code == 401, 10, 0.2,
                   "the key to expire")
        assert [k["expired"] for k in data(http.get("/api/keys", headers=bearer(admin)))] == [False, False, True]
        # the database holds the hash and the prefix, never the secret; a backup neither
        rows = sqlite3.connect(live.engine.data_dir / "app.db").execute("SELECT * FROM api_key").fetchall()
        dumped = repr(rows)
        assert secret not in dumped and admin not in dumped and hashlib.sha256(secret.encode()).hexdigest() in dumped
        dest = live.tmp / "backup"
        manifest = data(http.post("/api/kb/backup", json={"dest": str(dest)}, auth=BOSS))
        assert secret not in repr(manifest)
        for f in Path(dest).rglob("*"):
            if f.is_file():
                assert secret.encode() not in f.read_bytes() and admin.encode() not in f.read_bytes(), f
    assert secret not in caplog.text and admin not in caplog.text


def test_per_login_rate_limit(live):
    with live.http() as http:
        data(http.put("/api/config", json={"api": {"login_rate_limit_per_min": 3}}, auth=BOSS))
        try:
            statuses = [http.get("/api/kbs", auth=ALICE).status_code for _ in range(4)]
            # a minute that rolls over in between restarts the count: then the 4th passed, try four more
            if statuses[-1] != 429:
                statuses = [http.get("/api/kbs", auth=ALICE).status_code for _ in range(4)]
            assert statuses[-1] == 429
            r = http.get("/api/kbs", auth=ALICE)
            assert r.status_code == 429 and r.json()["code"] == 4029 and 1 <= int(r.headers["Retry-After"]) <= 60
        finally:  # not over HTTP: boss's own count may be spent this minute too
            live.engine.update_settings({"api": {"login_rate_limit_per_min": 0}})
