"""The metadata database on both dialects: real SQLite and a real PostgreSQL (tests/servers.py).

The same store code runs on both, its statements rendered by SQLAlchemy for each dialect (values with `?`, `%`,
`;` or quotes, the reserved column `user`, JSON text, ids by RETURNING); migrations are versioned; the ingest
queue's claim, lease expiry (by the database clock, moved forward here instead of sleeping) and fencing behave the
same.
"""
from __future__ import annotations

import sqlite3
import threading
import time

import psycopg
import pytest
from sqlalchemy import exc, inspect, select, text

from store.conversations import ConversationStore
from store.db import Database
from store.documents import ChunkRow, DocumentStore
from store.feedback import FeedbackStore
from store.jobs import JobStore, LeaseLost
from store.knowledge_bases import KBStore
from store.leases import LeaseStore
from store.migrations import MIGRATIONS, Migration, current_version, migrate
from store.schema import kb_base, kb_document, metadata
from store.shared_state import KB_GENERATION, SharedState
from store.verified import VerifiedQAStore


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


def test_schema_module_describes_the_migrated_database(db):
    """store/schema.py (what the stores' statements are built from) names exactly the tables and columns the
    migrations made, on both dialects."""
    found = inspect(db.engine)
    tables = set(found.get_table_names()) - {"sqlite_sequence"}
    assert tables == set(metadata.tables)
    for name, table in metadata.tables.items():
        assert {c["name"] for c in found.get_columns(name)} == {c.name for c in table.columns}, name


def test_migrations_recorded_once(db, target):
    assert db.applied_migrations == [m.version for m in MIGRATIONS]
    assert current_version(db) == len(MIGRATIONS)
    again = Database(target)
    try:
        assert again.applied_migrations == []  # a second process / restart applies nothing
    finally:
        again.close()
    # one statement is one statement: a `;` inside a literal is not a statement boundary, and pg_ddl leaves
    # the words it rewrites (INTEGER, user) alone inside literals
    default = "a; INTEGER user?"
    extra = [*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "test table", (
        f"CREATE TABLE t_extra (id INTEGER PRIMARY KEY AUTOINCREMENT, v REAL, note TEXT NOT NULL DEFAULT '{default}')",
    ))]
    assert migrate(db, extra) == [len(MIGRATIONS) + 1]
    with db.transaction() as conn:
        new_id = conn.execute(text("INSERT INTO t_extra(v) VALUES (:v) RETURNING id"), {"v": 1.5}).scalar_one()
        assert conn.execute(text("INSERT INTO t_extra(v) VALUES (:v) RETURNING id"), {"v": 2.5}).scalar_one() \
            == new_id + 1
        assert conn.execute(text("SELECT note FROM t_extra WHERE id = :id"), {"id": new_id}).scalar_one() == default
    with pytest.raises(RuntimeError, match="比本程序支持的"):
        migrate(db, MIGRATIONS)  # the database is newer than this program


def test_values_and_sql_the_old_translation_broke(db):
    """What a regex rewrite of SQLite SQL got wrong on PostgreSQL: `?` in a value, in a comment or as the JSON
    operator, a `;` or `%` inside a literal, the reserved word `user` as a column name."""
    odd = "谁? 100%; DROP TABLE conversation; --'\""
    convs = ConversationStore(db)
    c = convs.create(odd, odd)
    t = convs.add_turn(c["conv_id"], odd, odd, odd, sources=[{"q": "?"}], trace={"a?b": "c;d", "%s": "?"})
    assert convs.get(c["conv_id"])["title"] == odd and convs.list(odd)[1] == 1 and convs.list("谁")[1] == 0
    turn = convs.get_turn(t["turn_id"])
    assert (turn["user"], turn["question"], turn["answer"]) == (odd, odd, odd)
    assert turn["sources"] == [{"q": "?"}] and turn["trace"] == {"a?b": "c;d", "%s": "?"}
    fb = FeedbackStore(db).upsert(turn, -1, odd, odd)
    assert (fb["user"], fb["reason"], fb["comment"], fb["sources"]) == (odd, odd, odd, [{"q": "?"}])
    with db.connect() as conn:
        # a `?` and a `;` in a comment and in literals of a hand-written statement, next to a named parameter
        got = conn.execute(text("SELECT 'x;y' AS a, '50%?' AS b, :p AS c -- why? because; it is text\n"),
                           {"p": odd}).one()
        assert tuple(got) == ("x;y", "50%?", odd)
        if db.dialect == "postgresql":  # jsonb's key-exists operator is a bare `?`
            assert conn.execute(text("SELECT CAST(:doc AS jsonb) ? 'a?b'"), {"doc": turn_json(db, t["turn_id"])}
                                ).scalar_one() is True
    assert convs.clear(odd) == 1 and convs.list(odd)[1] == 0


def turn_json(db, turn_id: int) -> str:
    with db.connect() as conn:
        return conn.execute(text("SELECT trace FROM conversation_turn WHERE turn_id = :t"), {"t": turn_id}).scalar_one()


def test_an_ignored_insert_never_gives_a_stale_id(db):
    """ids come from RETURNING: an ignored insert (which on PostgreSQL still draws from the identity sequence)
    returns no id, and the next real insert returns the id of its own row."""
    docs, kbs, jobs, qa = DocumentStore(db), KBStore(db), JobStore(db), VerifiedQAStore(db)
    first = kbs.create("甲")
    with db.transaction() as conn:
        ignored = conn.execute(db.insert(kb_base).values(name="甲", description="", created_at="x")
                               .on_conflict_do_nothing().returning(kb_base.c.kb_id)).first()
    assert ignored is None and len(kbs.list()) == 2
    second = kbs.create("乙")
    assert second["kb_id"] > first["kb_id"] and kbs.find_by_name("乙")["kb_id"] == second["kb_id"]
    doc = docs.create("q.txt", "qa", 1, "c" * 32, "c" * 32 + ".qa")
    assert jobs.add(doc["doc_id"]) and not jobs.add(doc["doc_id"])  # the second insert is ignored
    entry = qa.add(doc["doc_id"], "问?", "答;", [1], None, "u")
    assert qa.get(entry["qa_id"])["question"] == "问?" and entry["doc_id"] == doc["doc_id"]
    turn = ConversationStore(db).add_turn(ConversationStore(db).create("u", "t")["conv_id"], "u", "q", "a")
    assert ConversationStore(db).get_turn(turn["turn_id"])["question"] == "q"


def test_database_clock_and_nested_blocks(db):
    with db.connect() as conn:
        now = conn.execute(select(db.clock.now())).scalar_one()
    assert abs(now - time.time()) < 5  # seconds since the epoch by the database's clock
    db.clock.advance(3600)
    with db.connect() as conn:
        assert 3590 < conn.execute(select(db.clock.now())).scalar_one() - now < 3700
    docs = DocumentStore(db)
    with db.transaction() as conn:
        d = docs.create("n.txt", "txt", 1, "d" * 32, "d" * 32 + ".txt")  # nested: joins this transaction
        assert docs.get(d["doc_id"]) is not None  # a read inside sees the transaction's own write
        with pytest.raises(ZeroDivisionError), db.transaction():  # a savepoint
            docs.set_progress(d["doc_id"], "gone")
            raise ZeroDivisionError
        assert docs.get(d["doc_id"])["progress"] is None  # only the savepoint rolled back
    with db.connect():  # a transaction started inside a read block commits on its own
        docs.set_progress(d["doc_id"], "kept")
        assert docs.get(d["doc_id"])["progress"] == "kept"
    assert docs.get(d["doc_id"])["progress"] == "kept"


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
        row = conn.execute(select(kb_document.c.doc_id, kb_document.c.file_name)
                           .where(kb_document.c.doc_id == d["doc_id"])).one()
    assert row[1] == row.file_name == "Report-ABC.txt" and row._mapping["doc_id"] == d["doc_id"]
    (doc_id, name) = row
    assert name == "Report-ABC.txt"
    assert docs.list(keyword="report-abc")[1] == 1  # LIKE ignores ASCII case on both (ILIKE on PostgreSQL)
    assert docs.list(keyword="%")[1] == 0 and docs.list(keyword="_")[1] == 0  # wildcards stay literal
    with pytest.raises(exc.IntegrityError) as dup:  # UNIQUE(kb_id, content_md5)
        docs.create("dup.txt", "txt", 10, "a" * 32, "x.txt")
    assert isinstance(dup.value.orig, (sqlite3.IntegrityError, psycopg.errors.UniqueViolation))
    with pytest.raises(ZeroDivisionError), db.transaction() as conn:
        conn.execute(text("DELETE FROM kb_chunk WHERE doc_id = :d"), {"d": doc_id})
        raise ZeroDivisionError
    assert docs.chunk_count_of(doc_id) == 3  # rolled back
    assert not docs.any_retrievable_named("ABC", [1])  # still processing: nothing searchable yet
    docs.mark_ready(doc_id, 3)
    assert [c for c, _ in docs.iter_ready_tokens()] == ids
    # the referral check (an answer pointing at a document the knowledge base does not hold)
    assert docs.any_retrievable_named("Report-ABC", [1]) and not docs.any_retrievable_named("Report-ABC", [2])
    assert not any(docs.any_retrievable_named(w, [1]) for w in ("%", "_", "Report%ABC", ""))
    # the chunks before one, nearest first (the article a chunk starting inside one continues)
    assert docs.texts_before(doc_id, 2, 3) == ["第1块", "第0块"] and docs.texts_before(doc_id, 0, 3) == []
    assert docs.delete(doc_id) and docs.chunk_count_of(doc_id) == 0


def test_job_claim_lease_takeover_and_fencing(db):
    docs, jobs, state = DocumentStore(db), JobStore(db), SharedState(db)
    made = [docs.create(f"d{i}.txt", "txt", 1, f"{i:032x}", f"{i:032x}.txt")["doc_id"] for i in range(6)]
    assert all(jobs.add(i) for i in made) and not jobs.add(made[0])  # one job per document
    a = jobs.claim("A", 30, 4)
    b = jobs.claim("B", 300, 4)
    assert [j.doc_id for j in a] == made[:4] and [j.doc_id for j in b] == made[4:]
    assert all(j.attempts == 1 for j in a + b) and jobs.claim("B", 300, 4) == []
    assert jobs.renew("A", 30) == set(made[:4])
    db.clock.advance(31)  # A stops renewing (it died): its leases run out, B's do not
    taken = jobs.claim("B", 30, 10)
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
    assert leases.acquire("kb_rebuild", "A", 30)
    assert not leases.acquire("kb_rebuild", "B", 30) and leases.holder("kb_rebuild") == "A"
    assert leases.renew("kb_rebuild", "A", 30) and not leases.renew("kb_rebuild", "B", 30)
    db.clock.advance(31)  # A died: its lease frees itself
    assert leases.holder("kb_rebuild") is None
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
    from pipeline.services.retry_cache import StoredRetrievals
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
