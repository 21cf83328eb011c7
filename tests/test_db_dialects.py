"""The metadata database on both dialects: real SQLite and a real PostgreSQL (tests/servers.py).

The same store code and the same SQLite-style SQL run on both; migrations are versioned; the ingest queue's
claim, lease expiry and fencing behave the same.
"""
from __future__ import annotations

import sqlite3
import threading

import psycopg
import pytest

from store.db import Database
from store.documents import ChunkRow, DocumentStore
from store.jobs import JobStore, LeaseLost
from store.leases import LeaseStore
from store.migrations import MIGRATIONS, Migration, current_version, migrate
from store.shared_state import KB_GENERATION, SharedState
from store.sql_dialect import UnportableSQL, to_postgres
from tests.waiting import wait_until


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])  # a PostgreSQL server: slow
def target(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "app.db"
    return request.getfixturevalue("pg_server").create_database()


@pytest.fixture
def db(target):
    d = Database(target)
    yield d
    d.close()


def test_translation_rules():
    assert to_postgres("SELECT * FROM t WHERE a = ? AND b LIKE ? ESCAPE '\\'") == \
        "SELECT * FROM t WHERE a = %s AND b ILIKE %s ESCAPE '\\'"
    assert to_postgres("SELECT 'a?b%' FROM t WHERE x = ?") == "SELECT 'a?b%%' FROM t WHERE x = %s"
    assert to_postgres("SELECT 'a%' FROM t", with_params=False) == "SELECT 'a%' FROM t"
    assert to_postgres("INSERT OR IGNORE INTO t(a) VALUES (?)") == "INSERT INTO t(a) VALUES (%s) ON CONFLICT DO NOTHING"
    assert to_postgres("INSERT OR IGNORE INTO t(a) VALUES (?) RETURNING a") == \
        "INSERT INTO t(a) VALUES (%s) ON CONFLICT DO NOTHING RETURNING a"
    assert to_postgres("SELECT title FROM clubs") == "SELECT title FROM clubs"  # LIKE only as a word
    assert to_postgres("SELECT c.user, 'user' FROM conversation c WHERE user = ?") == \
        "SELECT c.user, 'user' FROM conversation c WHERE \"user\" = %s"  # reserved in PostgreSQL
    with pytest.raises(UnportableSQL, match="ON CONFLICT"):
        to_postgres("INSERT OR REPLACE INTO t(a) VALUES (?)")


def test_migrations_recorded_once(db, target):
    assert db.applied_migrations == [m.version for m in MIGRATIONS]
    assert current_version(db) == len(MIGRATIONS)
    again = Database(target)
    try:
        assert again.applied_migrations == []  # a second process / restart applies nothing
    finally:
        again.close()
    extra = [*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "test table",
                                    ("CREATE TABLE t_extra (id INTEGER PRIMARY KEY AUTOINCREMENT, v REAL)",))]
    assert migrate(db, extra) == [len(MIGRATIONS) + 1]
    with db.transaction() as conn:
        new_id = conn.execute("INSERT INTO t_extra(v) VALUES (?) RETURNING id", (1.5,)).fetchone()[0]
        cur = conn.execute("INSERT INTO t_extra(v) VALUES (?)", (2.5,))
        assert cur.lastrowid == new_id + 1
    with pytest.raises(RuntimeError, match="比本程序支持的"):
        migrate(db, MIGRATIONS)  # the database is newer than this program


@pytest.mark.slow  # a PostgreSQL server
def test_concurrent_migration_runs_once(pg_server):
    url = pg_server.create_database()
    results, errors = [], []

    def start():
        try:
            d = Database(url)
            results.append(d.applied_migrations)
            d.close()
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(results, key=len) == [[], [], [], [m.version for m in MIGRATIONS]]


def test_rows_transactions_and_like(db):
    docs = DocumentStore(db)
    d = docs.create("Report-ABC.txt", "txt", 10, "a" * 32, "a" * 32 + ".txt")
    assert d["doc_id"] and d["status"] == "processing" and d["status_label"] == "处理中"
    ids = docs.replace_chunks(d["doc_id"], [ChunkRow(d["doc_id"], i, f"第{i}块", None, 0, 3, "text", ["第", str(i)])
                                            for i in range(3)])
    assert len(set(ids)) == 3 and docs.chunk_count_of(d["doc_id"]) == 3
    with db.connect() as conn:
        row = conn.execute("SELECT doc_id, file_name FROM kb_document WHERE doc_id = ?", (d["doc_id"],)).fetchone()
    assert row[1] == row["file_name"] == "Report-ABC.txt" and dict(row)["doc_id"] == d["doc_id"]
    (doc_id, name) = row
    assert name == "Report-ABC.txt"
    assert docs.list(keyword="report-abc")[1] == 1  # LIKE ignores ASCII case on both
    assert docs.list(keyword="%")[1] == 0  # wildcards in the keyword stay literal
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):  # UNIQUE(content_md5)
        docs.create("dup.txt", "txt", 10, "a" * 32, "x.txt")
    with pytest.raises(ZeroDivisionError), db.transaction() as conn:
        conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))
        raise ZeroDivisionError
    assert docs.chunk_count_of(doc_id) == 3  # rolled back
    docs.mark_ready(doc_id, 3)
    assert [c for c, _ in docs.iter_ready_tokens()] == ids
    assert docs.delete(doc_id) and docs.chunk_count_of(doc_id) == 0


def test_job_claim_lease_takeover_and_fencing(db):
    docs, jobs, state = DocumentStore(db), JobStore(db), SharedState(db)
    made = [docs.create(f"d{i}.txt", "txt", 1, f"{i:032x}", f"{i:032x}.txt")["doc_id"] for i in range(6)]
    assert all(jobs.add(i) for i in made) and not jobs.add(made[0])  # one job per document
    a = jobs.claim("A", 0.6, 4)
    b = jobs.claim("B", 30, 4)
    assert [j.doc_id for j in a] == made[:4] and [j.doc_id for j in b] == made[4:]
    assert all(j.attempts == 1 for j in a + b) and jobs.claim("B", 30, 4) == []
    assert jobs.renew("A", 0.6) == set(made[:4])
    # A stops renewing (it died): its leases run out and B takes them over.
    # TODO(clock): advance db.clock past A's 0.6 s lease instead of waiting for the wall clock.
    taken = wait_until(lambda: jobs.claim("B", 30, 10), 10, 0.05, "A's job leases to run out")
    assert [j.doc_id for j in taken] == made[:4] and all(j.attempts == 2 for j in taken)
    assert jobs.renew("A", 30) == set()  # A learns it holds nothing
    gen = state.read()[KB_GENERATION]
    assert not jobs.complete(made[0], "A", 5)  # fenced: the old owner cannot finish it
    with pytest.raises(LeaseLost), db.transaction() as conn:
        jobs.fence(conn, made[0], "A", 30)
    assert jobs.complete(made[0], "B", 5)
    assert docs.get(made[0])["status"] == "ready" and state.read()[KB_GENERATION] == gen + 1
    assert jobs.fail(made[1], "B", "坏文件") and docs.get(made[1])["fail_reason"] == "坏文件"
    docs.delete(made[2])
    assert not jobs.exists(made[2])  # deleting a document drops its job
    jobs.release([made[3]], "B")
    assert [j.doc_id for j in jobs.claim("C", 30, 10)] == [made[3]]
    assert jobs.count() == 3 and jobs.claimable() == 0


def test_concurrent_claims_never_share_a_job(db):
    docs, jobs = DocumentStore(db), JobStore(db)
    for i in range(60):
        jobs.add(docs.create(f"c{i}.txt", "txt", 1, f"{i:032x}", f"{i:032x}.txt")["doc_id"])
    got: dict[str, list[int]] = {}

    def worker(name):
        mine = got.setdefault(name, [])
        while True:
            claimed = jobs.claim(name, 60, 3)
            if not claimed:
                return
            mine.extend(j.doc_id for j in claimed)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [d for ids in got.values() for d in ids]
    assert len(every) == 60 and len(set(every)) == 60


def test_named_lease_one_holder_and_expiry(db):
    leases = LeaseStore(db)
    assert leases.holder("kb_rebuild") is None
    assert leases.acquire("kb_rebuild", "A", 0.6)
    assert not leases.acquire("kb_rebuild", "B", 30) and leases.holder("kb_rebuild") == "A"
    assert leases.renew("kb_rebuild", "A", 0.6) and not leases.renew("kb_rebuild", "B", 30)
    # A died: its lease frees itself.  TODO(clock): advance db.clock past the 0.6 s lease instead of waiting.
    wait_until(lambda: leases.holder("kb_rebuild") is None, 10, 0.05, "A's kb_rebuild lease to run out")
    assert leases.acquire("kb_rebuild", "B", 30) and not leases.renew("kb_rebuild", "A", 30)
    leases.release("kb_rebuild", "A")  # not A's any more: no effect
    assert leases.holder("kb_rebuild") == "B"
    leases.release("kb_rebuild", "B")
    assert leases.holder("kb_rebuild") is None


def test_stored_retrieval_not_replayed_once_a_source_is_gone(db):
    from llama_index.core.schema import NodeWithScore

    from pipeline.conversation.rewrite import Rewrite
    from pipeline.retrieval.nodes import node_from_row
    from pipeline.retrieval.result import RetrievalResult
    from pipeline.retry_cache import StoredRetrievals
    from store.retrievals import RetrievalStore

    docs = DocumentStore(db)
    d = docs.create("r.txt", "txt", 1, "b" * 32, "b" * 32 + ".txt")
    (cid,) = docs.replace_chunks(d["doc_id"], [ChunkRow(d["doc_id"], 0, "重试材料", None, 0, 4, "text", ["重试"])])
    docs.mark_ready(d["doc_id"], 1)
    node = NodeWithScore(node=node_from_row(docs.get_chunks([cid])[cid]), score=0.9)
    node.node.metadata["rerank_score"] = 0.5
    res = RetrievalResult(query="q", vector=[node], fused=[node], final=[node], hit=True, ms={"total": 1.5})
    stored = StoredRetrievals(RetrievalStore(db), docs.get_chunks)
    key = ("conv-1", "q")
    stored.put(key, (Rewrite("q 改写", "q", "deterministic", "pronoun"), res))
    rw, back = stored.get(key)  # as another process would read it
    assert (rw.query, rw.original, rw.method, rw.kind, rw.changed) == ("q 改写", "q", "deterministic", "pronoun", True)
    assert back.hit and back.ms == {"total": 1.5} and back.final[0].node.get_content() == "重试材料"
    assert back.final[0].node.metadata["rerank_score"] == 0.5 and back.final[0].score == 0.9
    assert stored.get(("conv-2", "q")) is None  # keyed by conversation too
    docs.delete(d["doc_id"])  # deleted after the answer stored its retrieval, before the retry
    assert stored.get(key) is None
