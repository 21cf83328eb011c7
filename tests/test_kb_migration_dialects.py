"""Migrations 8–9 (knowledge bases, versions, chunk structure) on both dialects, from a database at the schema of
the release before them (version 7): rows kept (chunks and queued jobs not cascaded away by SQLite's table
rebuild), everything in the default knowledge base, ids never reused, the same file allowed in two knowledge
bases but not twice in one. PostgreSQL runs in a throw-away cluster (tests/servers.py)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from store.db import Database
from store.documents import DocumentStore
from store.knowledge_bases import KBStore
from store.migrations import MIGRATIONS, migrate


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])  # a PostgreSQL server: slow
def target(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "app.db"
    return request.getfixturevalue("pg_server").create_database()


def _insert_doc(conn, name: str, md5: str) -> int:
    return conn.execute(text(
        "INSERT INTO kb_document(file_name, file_type, file_size, content_md5, status, created_at, stored_name)"
        " VALUES (:name, 'txt', 10, :md5, 'ready', '2026-11-30 10:00:00', :stored) RETURNING doc_id"),
        {"name": name, "md5": md5, "stored": f"{md5}.txt"}).scalar_one()


def test_kb_migrations_on_a_version_7_database(target):
    old = Database(target, migrate=False)
    assert migrate(old, MIGRATIONS[:7]) == list(range(1, 8))  # the schema before issue 16
    with old.transaction() as conn:
        kept = _insert_doc(conn, "合同.txt", "aa11")
        conn.execute(text("INSERT INTO kb_chunk(doc_id, chunk_index, text, tokens) VALUES (:d, 0, :t, :k)"),
                     {"d": kept, "t": "付款期限 30 天", "k": "付款 期限 30 天"})
        queued = _insert_doc(conn, "排队.txt", "bb22")
        conn.execute(text("INSERT INTO ingest_job(doc_id, created_at) VALUES (:d, 0)"), {"d": queued})
        gone = _insert_doc(conn, "删除.txt", "cc33")
        conn.execute(text("DELETE FROM kb_document WHERE doc_id = :d"), {"d": gone})
    old.close()

    db = Database(target)
    try:
        assert db.applied_migrations == [m.version for m in MIGRATIONS[7:]]
        docs, kbs = DocumentStore(db), KBStore(db)
        d = docs.get(kept)
        assert (d["kb_id"], d["version"], d["lineage_id"], d["active"], d["note"]) == (1, 1, kept, 1, None)
        assert [c["text"] for c in docs.chunks_of(kept)] == ["付款期限 30 天"]  # not cascaded away
        assert docs.chunks_of(kept)[0]["context"] is None and docs.chunks_of(kept)[0]["section"] == 0
        with db.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM ingest_job WHERE doc_id = :d"), {"d": queued}).scalar_one() == 1
        assert [(k["kb_id"], k["name"], k["docs"], k["chunks"]) for k in kbs.list()] == [(1, "默认知识库", 2, 1)]
        other = kbs.create("合同库")
        assert other["kb_id"] == 2  # the identity / autoincrement sequence is past the default knowledge base
        twin = docs.create("合同.txt", "txt", 10, "aa11", "kb2-aa11.txt", kb_id=other["kb_id"])
        assert twin["doc_id"] > gone  # ids of documents deleted before the upgrade are not handed out again
        with pytest.raises(Exception):  # noqa: B017 - sqlalchemy IntegrityError (sqlite3 / psycopg UniqueViolation)
            docs.create("合同副本.txt", "txt", 10, "aa11", "aa11.txt")  # same content, same knowledge base
        assert docs.find_by_md5("aa11", 1)["doc_id"] == kept and docs.find_by_md5("aa11", 2)["doc_id"] == twin["doc_id"]
    finally:
        db.close()
