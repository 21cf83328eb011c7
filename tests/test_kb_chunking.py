"""Chunking per knowledge base over real HTTP on a real engine (SQLite + embedded Chroma, the tiny embedding): a KB's
chunk size gives chunks of that size in that KB only (another KB keeps the global size); values are validated by
the settings' own bounds; changing a KB's chunking and rebuilding that KB re-chunks it from its stored originals
and leaves the other KB's chunks as they were; the change is in the audit log with who made it; only KB admins
may read or change it; a deleted KB's chunking goes with it."""
from __future__ import annotations

import base64

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.ingestion.kb_chunking import key_of
from tests.live import LiveApp
from tests.shared_data import RULES, needs
from tests.tiny_engine import real_paragraphs, tiny_engine, tiny_model, wait_idle

pytestmark = needs(RULES)
GLOBAL_SIZE = 300  # the chunk_size default


def auth(user: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


def ok(resp) -> dict:
    body = resp.json()
    assert body["code"] == 0, body
    return body["data"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kb-chunking")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    policy = AccessPolicy.from_args([f"{u}:pw-{u}" for u in ("boss", "bob")], kb_admins=["boss"])
    app = LiveApp(engine, policy, owns_engine=True)
    app.text = tmp / "规则.txt"  # prose without headings: every chunk is cut by size alone
    app.text.write_text("\n".join(real_paragraphs()), encoding="utf-8")
    yield app
    app.stop()


def upload(http, kb: int, path) -> int:
    res = ok(http.post("/api/kb/documents", params={"kb_id": kb}, files=[("file", (path.name, path.read_bytes()))]))
    assert res[0]["ok"], res
    return res[0]["doc_id"]


def lengths(engine, doc_id: int) -> list[int]:
    return [len(c["text"]) for c in engine.document_chunks(doc_id)]


def test_chunk_size_of_one_kb_only(live):
    with live.http(headers=auth("boss")) as http:
        small = ok(http.post("/api/kbs", json={"name": "小块"}))["kb_id"]
        other = ok(http.post("/api/kbs", json={"name": "默认块"}))["kb_id"]
        got = ok(http.put(f"/api/kbs/{small}/chunking", json={"chunk_size": 120, "chunk_overlap": 20}))
        assert got["chunking"] == {"chunk_size": 120, "chunk_overlap": 20, "chunk_structure": True}
        assert got["overrides"] == {"chunk_size": 120, "chunk_overlap": 20}
        assert got["need_rebuild"] is False and got["changed"] == ["chunk_size", "chunk_overlap"]  # no documents yet
        assert ok(http.get(f"/api/kbs/{other}/chunking"))["chunking"]["chunk_size"] == GLOBAL_SIZE
        a, b = upload(http, small, live.text), upload(http, other, live.text)
    wait_idle(live.engine)
    la, lb = lengths(live.engine, a), lengths(live.engine, b)
    assert max(la) <= 120 and max(la) > 80  # cut at this KB's size
    assert max(lb) <= GLOBAL_SIZE and max(lb) > 120 and len(la) > len(lb)  # the other KB keeps the global size
    live.small, live.other, live.docs = small, other, (a, b)


def test_values_are_checked_by_the_settings_bounds(live):
    with live.http(headers=auth("boss")) as http:
        info = ok(http.get(f"/api/kbs/{live.small}/chunking"))
        assert info["fields"]["chunk_size"]["ge"] == 50 and info["fields"]["chunk_size"]["le"] == 2000
        assert info["defaults"]["chunk_size"] == GLOBAL_SIZE
        for body, field, words in (({"chunk_size": 10}, "chunk_size", "50–2000"),
                                   ({"chunk_overlap": 200}, "chunk_overlap", "必须小于"),
                                   ({"chunk_size": "大"}, "chunk_size", "整数"),
                                   ({"chunk_sise": 100}, "chunk_sise", "未知"),
                                   ({"rebuild": "yes"}, "rebuild", "true/false")):
            r = http.put(f"/api/kbs/{live.small}/chunking", json=body).json()
            assert r["code"] == 1001 and r["data"]["field"] == field and words in r["msg"], (body, r)
        assert ok(http.get(f"/api/kbs/{live.small}/chunking"))["overrides"] == {"chunk_size": 120, "chunk_overlap": 20}


def test_change_and_rebuild_this_kb_only(live):
    a, b = live.docs
    before_b = live.engine.document_chunks(b)
    with live.http(headers=auth("boss")) as http:
        asked = ok(http.put(f"/api/kbs/{live.small}/chunking", json={"chunk_size": 200}))
        assert asked["need_rebuild"] is True and asked["rebuild"] is None  # the UI asks whether to rebuild
        assert max(lengths(live.engine, a)) <= 120  # nothing re-chunked until the rebuild
        done = ok(http.put(f"/api/kbs/{live.small}/chunking", json={"chunk_overlap": None, "rebuild": True}))
        assert done["rebuild"]["running"] is True and done["rebuild"]["kb_id"] == live.small
    status = live.engine.wait_rebuild(300)
    assert not status["running"] and status["error"] is None and status["total"] == 1
    la = lengths(live.engine, a)
    assert 120 < max(la) <= 200  # re-parsed from the stored original and cut at the new size
    assert live.engine.document_chunks(b) == before_b  # same chunk ids and texts: the other KB was not touched
    kb = live.engine.components.kbs.get(live.small)
    assert kb.vectors.count() == len(la)  # the old vectors went, one per new chunk
    new_ids = {c["chunk_id"] for c in live.engine.document_chunks(a)}
    found = live.engine.search(live.engine.document_chunks(a)[0]["text"][:40], kb_ids=[live.small])
    assert found["bm25"] and {h["chunk_id"] for h in found["bm25"]} <= new_ids  # BM25 holds the new chunks
    assert {h["chunk_id"] for h in found["vector"]} <= new_ids


def test_no_change_while_a_rebuild_runs(live):
    """Another process holds the rebuild lease: this KB's chunking stays as it is until the rebuild is over."""
    from pipeline.ingestion.rebuild import LEASE

    leases = live.engine.components.leases
    assert leases.acquire(LEASE, "another-process", 60)
    try:
        with live.http(headers=auth("boss")) as http:
            r = http.put(f"/api/kbs/{live.small}/chunking", json={"chunk_size": 400})
            assert r.status_code == 503 and r.json()["code"] == 2002 and "重建进行中" in r.json()["msg"]
    finally:
        leases.release(LEASE, "another-process")
    assert live.engine.kb_chunking(live.small)["chunking"]["chunk_size"] == 200


def test_audit_records_who_changed_it(live):
    rows = live.engine.audit_log(kind="admin", kb_id=live.small, size=100)["items"]
    changes = [r for r in rows if r["action"] == "kb.chunking"]
    assert len(changes) == 3 and {r["actor"] for r in changes} == {"boss"}
    last = changes[0]  # newest first
    assert last["detail"]["after"]["chunk_size"] == 200 and last["detail"]["after"]["chunk_overlap"] == 50
    assert last["detail"]["rebuild"] is True and last["door"] == "rest"


def test_only_kb_admins(live):
    with live.http(headers=auth("bob")) as http:
        for r in (http.get(f"/api/kbs/{live.small}/chunking"),
                  http.put(f"/api/kbs/{live.small}/chunking", json={"chunk_size": 500})):
            assert r.status_code == 403 and r.json()["code"] == 4003
    with live.http() as http:
        assert http.get(f"/api/kbs/{live.small}/chunking").status_code == 401
    with live.http(headers=auth("boss")) as http:
        assert ok(http.get(f"/api/kbs/{live.small}/chunking"))["chunking"]["chunk_size"] == 200
        assert http.get("/api/kbs/9999/chunking").json()["code"] == 3002


def test_deleted_kb_takes_its_chunking(live):
    config = live.engine.components.config
    with live.http(headers=auth("boss")) as http:
        kb = ok(http.post("/api/kbs", json={"name": "临时"}))["kb_id"]
        ok(http.put(f"/api/kbs/{kb}/chunking", json={"chunk_structure": False}))
        assert config.get(key_of(kb)) == {"chunk_structure": False}
        ok(http.delete(f"/api/kbs/{kb}", params={"confirm": "true"}))
    assert config.get(key_of(kb)) is None


@pytest.mark.slow
def test_team_mode_a_kbs_chunking_reaches_the_other_process(team_deployment, tmp_path):
    """Team mode (PostgreSQL + a Chroma server): the chunking saved through A is what B's ingest worker cuts with
    (A's worker is stopped, so B ingests), what B shows, and what B's preview uses."""
    from pipeline.engine import Engine
    from store.config_store import ConfigStore
    from store.db import Database

    db = Database(team_deployment.database_url)  # the shared settings: the tiny model for both processes
    ConfigStore(db).save({"embedding_model_path": str(tiny_model(tmp_path / "tiny")), "min_similarity": 0.0})
    db.close()
    a = Engine(tmp_path / "a" / "data", deployment=team_deployment)
    b = Engine(tmp_path / "b" / "data", deployment=team_deployment)
    try:
        kb = a.create_kb("团队", "")["kb_id"]
        a.update_kb_chunking(kb, {"chunk_size": 120, "chunk_overlap": 10})
        a.components.ingest.stop()  # only B's worker takes jobs now
        assert b.kb_chunking(kb)["chunking"]["chunk_size"] == 120
        text = tmp_path / "规则.txt"
        text.write_text("\n".join(real_paragraphs()), encoding="utf-8")
        shown = b.preview_upload(kb, text.name, text)
        res = b.upload([(text.name, text)], kb)[0]
        other = b.upload([(text.name, text)], 1)[0]  # the default KB keeps the global size
        assert res.ok and other.ok
        assert b.wait_idle(300)
        got = b.document_chunks(res.doc_id)
        assert max(len(c["text"]) for c in got) <= 120
        assert [c["text"] for c in got] == [c["text"] for c in shown["chunks"]]
        assert max(len(c["text"]) for c in b.document_chunks(other.doc_id)) > 120
    finally:
        b.close()
        a.close()
