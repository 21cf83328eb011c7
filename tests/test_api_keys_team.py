"""API keys and rate limits in team mode: two real app processes (`python app.py`, logins on) on one PostgreSQL
and one Chroma server. A key made on A works on B; revoked on A, B refuses it on the very next request; the
per-minute count of a key is shared (requests on A and B add up); neither process logs the secret."""
from __future__ import annotations

import pytest

from store.config_store import ConfigStore
from store.db import Database
from tests.live import AppProcess
from tests.servers import fresh_deployment
from tests.tiny_engine import tiny_model

pytestmark = pytest.mark.slow  # two app processes and the servers

BOSS = ("boss", "pw-b")


@pytest.fixture(scope="module")
def team(pg_server, chroma_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("keys-team")
    dep = fresh_deployment(pg_server, chroma_server, root / "files")
    db = Database(dep.database_url)  # the tiny model for both processes: settings live in the shared database
    ConfigStore(db).save({"embedding_model_path": str(tiny_model(root / "tiny")), "min_similarity": 0.0})
    db.close()
    args = ["--database-url", dep.database_url, "--chroma-url", dep.chroma_url, "--files-dir", str(dep.files_dir),
            "--auth", "boss:pw-b", "--admin", "boss"]
    apps = [AppProcess(root / name / "data", *args, log_path=root / f"{name}.log") for name in ("A", "B")]
    try:
        for app in apps:
            app.wait_ready()
        yield apps
    finally:
        for app in apps:
            app.stop()


def test_key_made_on_one_process_revoked_there_fails_at_once_on_the_other(team):
    a, b = team
    with a.http(auth=BOSS) as ha, b.http() as hb:
        made = ha.post("/api/keys", json={"name": "共享", "rate_limit": 3}).json()["data"]
        key = {"Authorization": f"Bearer {made['secret']}"}
        assert hb.get("/v1/models", headers=key).status_code == 200
        assert hb.get("/api/kbs", headers=key).status_code == 200  # 2 of 3 this minute, on B
        r = ha.get("/v1/models", headers=key, auth=None)  # auth=None: the key, not the client's Basic login
        if r.status_code == 200:  # 3 of 3 on A: the next one, on either process, is over the shared limit
            r = hb.get("/v1/models", headers=key)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        fresh = ha.post("/api/keys", json={"name": "吊销", "rate_limit": 0}).json()["data"]
        fkey = {"Authorization": f"Bearer {fresh['secret']}"}
        assert hb.get("/v1/models", headers=fkey).status_code == 200
        assert ha.delete(f"/api/keys/{fresh['key_id']}").json()["data"]["revoked"]
        assert hb.get("/v1/models", headers=fkey).status_code == 401  # no cache in the way
        assert hb.get("/api/kbs", headers=fkey).json()["code"] == 4001
    for app in team:
        log = app.log_tail(1_000_000)
        assert made["secret"] not in log and fresh["secret"] not in log
