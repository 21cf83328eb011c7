"""The tables of the metadata database as SQLAlchemy Core objects: what every store builds its statements from.

These describe the schema that the migrations (store/migrations.py) create; they do not create it (no
`create_all`). tests/test_db_dialects.py checks, on SQLite and PostgreSQL, that every table and column here is
the one the migrated database really has. Integer columns are BigInteger because PostgreSQL holds them as BIGINT
(SQLite's INTEGER is 64-bit too); JSON travels as TEXT (the stores encode it), so old data dirs read as they are.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, ForeignKey, MetaData, Table, Text

metadata = MetaData()


def _id(name: str, **kw) -> Column:
    return Column(name, BigInteger, primary_key=True, autoincrement=True, **kw)


sys_config = Table(
    "sys_config", metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text),
    Column("updated_at", Text),
)

kb_base = Table(
    "kb_base", metadata,
    _id("kb_id"),
    Column("name", Text, nullable=False, unique=True),
    Column("description", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("readers", Text),  # JSON list of user names; NULL = every logged-in user
)

kb_document = Table(
    "kb_document", metadata,
    _id("doc_id"),
    Column("kb_id", BigInteger, ForeignKey("kb_base.kb_id"), nullable=False),
    Column("file_name", Text, nullable=False),
    Column("file_type", Text, nullable=False),
    Column("file_size", BigInteger, nullable=False),
    Column("content_md5", Text, nullable=False),
    Column("chunk_count", BigInteger, nullable=False),
    Column("status", Text, nullable=False),
    Column("fail_reason", Text),
    Column("created_at", Text, nullable=False),
    Column("stored_name", Text),
    Column("progress", Text),
    Column("note", Text),
    Column("version", BigInteger, nullable=False),
    Column("lineage_id", BigInteger),
    Column("active", BigInteger, nullable=False),
)

kb_chunk = Table(
    "kb_chunk", metadata,
    _id("chunk_id"),
    Column("doc_id", BigInteger, ForeignKey("kb_document.doc_id", ondelete="CASCADE"), nullable=False),
    Column("chunk_index", BigInteger, nullable=False),
    Column("text", Text, nullable=False),
    Column("page", BigInteger),
    Column("char_start", BigInteger),
    Column("char_end", BigInteger),
    Column("source", Text, nullable=False),
    Column("tokens", Text, nullable=False),
    Column("context", Text),
    Column("section", BigInteger, nullable=False),
    Column("enabled", BigInteger, nullable=False),  # 0: a KB admin switched it off (out of both routes)
    Column("original_text", Text),  # the parsed text of an edited chunk; NULL = not edited
    Column("edited_by", Text),
    Column("edited_at", Text),
    Column("manual", BigInteger, nullable=False),  # 1: added by hand, not parsed from the file
)

kb_doc_tag = Table(
    "kb_doc_tag", metadata,
    Column("doc_id", BigInteger, ForeignKey("kb_document.doc_id", ondelete="CASCADE"), primary_key=True,
           autoincrement=False),
    Column("tag", Text, primary_key=True),
)

kb_doc_meta = Table(
    "kb_doc_meta", metadata,
    Column("doc_id", BigInteger, ForeignKey("kb_document.doc_id", ondelete="CASCADE"), primary_key=True,
           autoincrement=False),
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)

kb_section = Table(
    "kb_section", metadata,
    Column("doc_id", BigInteger, ForeignKey("kb_document.doc_id", ondelete="CASCADE"), primary_key=True),
    Column("section", BigInteger, primary_key=True, autoincrement=False),
    Column("page", BigInteger),
    Column("source", Text, nullable=False),
    Column("context", Text),
    Column("text", Text, nullable=False),
)

ingest_job = Table(
    "ingest_job", metadata,
    Column("doc_id", BigInteger, ForeignKey("kb_document.doc_id", ondelete="CASCADE"), primary_key=True,
           autoincrement=False),
    Column("owner", Text),
    Column("lease_until", Double),  # seconds since the epoch by the database clock
    Column("attempts", BigInteger, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("stage", Text),
    Column("stage_done", BigInteger),
    Column("stage_total", BigInteger),
    Column("stage_eta", Double),
)

app_state = Table(
    "app_state", metadata,
    Column("name", Text, primary_key=True),
    Column("value", BigInteger, nullable=False),
)

app_lease = Table(
    "app_lease", metadata,
    Column("name", Text, primary_key=True),
    Column("owner", Text),
    Column("lease_until", Double),
)

qa_retrieval = Table(
    "qa_retrieval", metadata,
    Column("question", Text, primary_key=True),
    Column("result", Text, nullable=False),
    Column("stored_at", Double, nullable=False),
)

conversation = Table(
    "conversation", metadata,
    Column("conv_id", Text, primary_key=True),
    Column("user", Text, nullable=False),  # reserved in PostgreSQL: SQLAlchemy quotes it there
    Column("title", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("updated_at", Text, nullable=False),
    Column("turn_count", BigInteger, nullable=False),
)

conversation_turn = Table(
    "conversation_turn", metadata,
    _id("turn_id"),
    Column("conv_id", Text, ForeignKey("conversation.conv_id", ondelete="CASCADE"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("user", Text, nullable=False),
    Column("question", Text, nullable=False),
    Column("rewritten", Text),
    Column("answer", Text, nullable=False),
    Column("sources", Text, nullable=False),  # JSON
    Column("trace", Text, nullable=False),  # JSON
    Column("mode", Text),
    Column("route", Text),
    Column("no_answer", BigInteger, nullable=False),
    Column("elapsed_ms", BigInteger),
    Column("created_at", Text, nullable=False),
)

answer_feedback = Table(
    "answer_feedback", metadata,
    _id("fb_id"),
    Column("turn_id", BigInteger, nullable=False, unique=True),
    Column("conv_id", Text),
    Column("user", Text, nullable=False),
    Column("rating", BigInteger, nullable=False),
    Column("reason", Text),
    Column("comment", Text),
    Column("question", Text, nullable=False),
    Column("rewritten", Text),
    Column("answer", Text, nullable=False),
    Column("sources", Text, nullable=False),  # JSON
    Column("created_at", Text, nullable=False),
)

verified_qa = Table(
    "verified_qa", metadata,
    _id("qa_id"),
    Column("doc_id", BigInteger, ForeignKey("kb_document.doc_id", ondelete="CASCADE"), nullable=False, unique=True),
    Column("question", Text, nullable=False),
    Column("answer", Text, nullable=False),
    Column("cited", Text, nullable=False),  # JSON
    Column("turn_id", BigInteger),
    Column("created_by", Text, nullable=False),
    Column("created_at", Text, nullable=False),
)

kb_gate_background = Table(
    "kb_gate_background", metadata,
    Column("kb_id", BigInteger, primary_key=True, autoincrement=False),
    Column("fingerprint", Text, nullable=False),
    Column("stats", Text, nullable=False),  # JSON
    Column("updated_at", Text, nullable=False),
)

api_key = Table(
    "api_key", metadata,
    _id("key_id"),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),  # pipeline.access.policy.Role value: user | kb_admin | admin
    Column("kb_ids", Text),  # JSON list of knowledge base ids it may read; NULL = every one its role may read
    Column("secret_hash", Text, nullable=False, unique=True),  # sha256 hex of the secret; the secret is not kept
    Column("prefix", Text, nullable=False),  # the first characters of the secret, to recognise it in lists
    Column("rate_limit", BigInteger),  # requests per minute; NULL = the setting api_rate_limit_per_min
    Column("expires_at", Double),  # seconds since the epoch; NULL = never
    Column("created_by", Text),
    Column("created_at", Text, nullable=False),
    Column("last_used_at", Text),
    Column("revoked_at", Text),  # NULL = active
)

rate_window = Table(
    "rate_window", metadata,
    Column("bucket", Text, primary_key=True),  # "key:<key_id>" | "user:<name>"
    Column("minute", BigInteger, primary_key=True, autoincrement=False),  # minutes since the epoch
    Column("hits", BigInteger, nullable=False),
)

audit_log = Table(
    "audit_log", metadata,
    _id("entry_id"),
    Column("at", Double, nullable=False),  # seconds since the epoch (retention and date filters compare it)
    Column("actor", Text),  # the user, key:<name> or 本机
    Column("door", Text, nullable=False),  # page / rest / openai / mcp / internal
    Column("kind", Text, nullable=False),  # question / admin
    Column("action", Text, nullable=False),  # ask, or the admin action (settings.update, document.delete …)
    Column("kb_ids", Text),  # ",1,3," — filterable with LIKE on both dialects
    Column("question", Text),
    Column("outcome", Text, nullable=False),  # answer / weak / refuse / error / aborted; ok for admin actions
    Column("latency_ms", BigInteger),
    Column("cited", Text),  # JSON [{doc_id, doc_name}]
    Column("detail", Text),  # JSON
)

# migration 20: what a knowledge base follows (pipeline/services/web_sources.py, folder_sync.py)
web_source = Table(
    "web_source", metadata,
    _id("source_id"),
    Column("kb_id", BigInteger, ForeignKey("kb_base.kb_id", ondelete="CASCADE"), nullable=False),
    Column("url", Text, nullable=False),  # the document's identity: one lineage of versions per URL
    Column("doc_name", Text, nullable=False),
    Column("interval_min", BigInteger),  # NULL: fetched on demand only
    Column("next_due", Double),  # seconds since the epoch; the scheduler claims rows past it
    Column("status", Text, nullable=False),  # pending / fetching / ok / unchanged / failed
    Column("message", Text),
    Column("last_fetch_at", Double),
    Column("last_doc_id", BigInteger),
    Column("content_md5", Text),
    Column("created_by", Text),
    Column("created_at", Double, nullable=False),
)

folder_source = Table(
    "folder_source", metadata,
    _id("source_id"),
    Column("kb_id", BigInteger, ForeignKey("kb_base.kb_id", ondelete="CASCADE"), nullable=False, unique=True),
    Column("path", Text, nullable=False),
    Column("interval_min", BigInteger),
    Column("next_due", Double),
    Column("last_sync_at", Double),
    Column("last_report_id", BigInteger),
    Column("created_by", Text),
    Column("created_at", Double, nullable=False),
)

folder_file = Table(
    "folder_file", metadata,
    Column("source_id", BigInteger, ForeignKey("folder_source.source_id", ondelete="CASCADE"), primary_key=True,
           autoincrement=False),
    Column("rel_path", Text, primary_key=True),
    Column("doc_name", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("mtime", Double, nullable=False),
    Column("md5", Text, nullable=False),
    Column("lineage_id", BigInteger),
    Column("state", Text, nullable=False),  # ok / failed / flagged (gone from the folder, document kept)
)

sync_report = Table(
    "sync_report", metadata,
    _id("report_id"),
    Column("source_id", BigInteger, ForeignKey("folder_source.source_id", ondelete="CASCADE"), nullable=False),
    Column("kb_id", BigInteger, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("finished_at", Double),
    Column("cause", Text, nullable=False),  # manual / interval
    Column("actor", Text),
    Column("added", BigInteger, nullable=False),
    Column("updated", BigInteger, nullable=False),
    Column("removed", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("unchanged", BigInteger, nullable=False),
    Column("detail", Text),  # JSON {added: [names], updated: [...], removed: [...], failed: [{name, reason}]}
)

schema_version = Table(
    "schema_version", metadata,
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("applied_at", Text, nullable=False),
)
