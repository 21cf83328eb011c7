"""The ingest queue in the database (`ingest_job`): one row per document waiting for or under ingestion.

A worker claims jobs atomically and holds them under a lease (`owner`, `lease_until` by the database clock)
that it renews while it works. A job whose lease ran out (its process died, kill -9 included) is claimable
again by any worker. The owner check on every end-of-job write is the fencing: a worker that lost its lease
can no longer mark the document 就绪/失败 or drop the job, so no job is done twice. Deleting a document deletes
its job (ON DELETE CASCADE).

PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED` lets several processes claim concurrently without waiting on each
other. SQLite: the claim runs under BEGIN IMMEDIATE (one writer), the single local worker.
"""
from __future__ import annotations

from dataclasses import dataclass

from .db import Database
from .documents import activate_waiting_version


class LeaseLost(RuntimeError):
    """This worker's lease on a document ran out and another worker holds it now."""


@dataclass(frozen=True)
class Job:
    doc_id: int
    attempts: int  # claims so far, this one included (> 1: taken over from a worker that stopped)


class JobStore:
    def __init__(self, db: Database):
        self.db = db
        self._now = db.now_sql

    def add(self, doc_id: int) -> bool:
        """Queue the document (no-op when it already has a job). True when a job was created."""
        with self.db.transaction() as conn:
            cur = conn.execute(f"INSERT OR IGNORE INTO ingest_job(doc_id, created_at) VALUES (?, {self._now})",
                               (doc_id,))
            return cur.rowcount > 0

    def claim(self, owner: str, lease_s: float, limit: int) -> list[Job]:
        """Up to `limit` unowned or expired jobs, now leased to `owner` (oldest first)."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                f"UPDATE ingest_job SET owner = ?, lease_until = {self._now} + ?, attempts = attempts + 1"
                f" WHERE doc_id IN (SELECT doc_id FROM ingest_job"
                f" WHERE owner IS NULL OR lease_until < {self._now}"
                f" ORDER BY doc_id LIMIT ? {self.db.skip_locked})"
                f" RETURNING doc_id, attempts", (owner, float(lease_s), int(limit))).fetchall()
        return sorted((Job(int(r[0]), int(r[1])) for r in rows), key=lambda j: j.doc_id)

    def claim_doc(self, doc_id: int, owner: str, lease_s: float) -> bool:
        """Lease one given document's job to `owner` (a full rebuild re-processing it). False when another
        live worker holds it."""
        with self.db.transaction() as conn:
            conn.execute(f"INSERT OR IGNORE INTO ingest_job(doc_id, created_at) VALUES (?, {self._now})", (doc_id,))
            cur = conn.execute(
                f"UPDATE ingest_job SET owner = ?, lease_until = {self._now} + ?, attempts = attempts + 1"
                f" WHERE doc_id = ? AND (owner IS NULL OR owner = ? OR lease_until < {self._now})",
                (owner, float(lease_s), doc_id, owner))
            return cur.rowcount > 0

    def renew(self, owner: str, lease_s: float) -> set[int]:
        """Extend every lease `owner` holds; returns the doc_ids it still holds."""
        with self.db.transaction() as conn:
            rows = conn.execute(f"UPDATE ingest_job SET lease_until = {self._now} + ? WHERE owner = ?"
                                f" RETURNING doc_id", (float(lease_s), owner)).fetchall()
        return {int(r[0]) for r in rows}

    def fence(self, conn, doc_id: int, owner: str, lease_s: float) -> None:
        """Inside a caller's transaction: renew and row-lock our lease, or raise LeaseLost. The lock holds until
        that transaction ends, so no other worker can take the job over halfway through its writes."""
        cur = conn.execute(f"UPDATE ingest_job SET lease_until = {self._now} + ? WHERE doc_id = ? AND owner = ?",
                           (float(lease_s), doc_id, owner))
        if cur.rowcount == 0:
            raise LeaseLost(doc_id)

    def release(self, doc_ids: list[int], owner: str) -> None:
        """Put jobs we still hold back in the queue (processing stopped without an outcome)."""
        if not doc_ids:
            return
        marks = ",".join("?" * len(doc_ids))
        with self.db.transaction() as conn:
            conn.execute(f"UPDATE ingest_job SET owner = NULL, lease_until = NULL WHERE owner = ?"
                         f" AND doc_id IN ({marks})", (owner, *doc_ids))

    def holds(self, doc_id: int, owner: str) -> bool:
        with self.db.connect() as conn:
            return conn.execute("SELECT 1 FROM ingest_job WHERE doc_id = ? AND owner = ?",
                                (doc_id, owner)).fetchone() is not None

    def complete(self, doc_id: int, owner: str, chunk_count: int) -> bool:
        """The job ends and the document turns 就绪 in one transaction — only while `owner` holds the lease."""
        return self._end(doc_id, owner, "UPDATE kb_document SET status = 'ready', fail_reason = NULL,"
                         " progress = NULL, chunk_count = ? WHERE doc_id = ?", (chunk_count, doc_id), ready=True)

    def fail(self, doc_id: int, owner: str, reason: str) -> bool:
        """The job ends and the document turns 失败 (with its reason) — only while `owner` holds the lease."""
        return self._end(doc_id, owner, "UPDATE kb_document SET status = 'failed', fail_reason = ?,"
                         " progress = NULL WHERE doc_id = ?", (reason, doc_id))

    def _end(self, doc_id: int, owner: str, doc_sql: str, params: tuple, ready: bool = False) -> bool:
        with self.db.transaction() as conn:
            if conn.execute("DELETE FROM ingest_job WHERE doc_id = ? AND owner = ?", (doc_id, owner)).rowcount == 0:
                return False  # fenced: the lease ran out and another worker holds the job
            conn.execute(doc_sql, params)
            if ready:  # the set of 就绪 chunks changed: every process rebuilds its BM25
                activate_waiting_version(conn, doc_id)  # a new version replaces the old one at the same moment
                conn.execute("UPDATE app_state SET value = value + 1 WHERE name = 'kb_generation'")
        return True

    def drop(self, doc_id: int, owner: str) -> None:
        """Give up a job without touching the document (it was deleted meanwhile)."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM ingest_job WHERE doc_id = ? AND owner = ?", (doc_id, owner))

    def release_all(self) -> int:
        """Single-process start (SQLite): every lease belongs to a previous run, so free them now."""
        with self.db.transaction() as conn:
            return conn.execute("UPDATE ingest_job SET owner = NULL, lease_until = NULL"
                                " WHERE owner IS NOT NULL").rowcount

    def exists(self, doc_id: int) -> bool:
        with self.db.connect() as conn:
            return conn.execute("SELECT 1 FROM ingest_job WHERE doc_id = ?", (doc_id,)).fetchone() is not None

    def count(self) -> int:
        with self.db.connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM ingest_job").fetchone()[0])

    def set_stage(self, doc_id: int, owner: str, stage: str, done: int, total: int, eta_s: float | None) -> None:
        """The holder's progress on a job, for the other processes' document lists."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE ingest_job SET stage = ?, stage_done = ?, stage_total = ?, stage_eta = ?"
                         " WHERE doc_id = ? AND owner = ?", (stage, int(done), int(total), eta_s, doc_id, owner))

    def progress(self) -> dict[int, dict]:
        """Every job: {doc_id: {stage, done, total, eta_s, position}}. A job nobody holds (or whose lease ran out)
        is queued, `position` = its place among those in the order workers claim them; a held one shows the stage
        its worker last wrote."""
        with self.db.connect() as conn:
            rows = conn.execute(f"SELECT doc_id, owner IS NOT NULL AND lease_until >= {self._now}, stage,"
                                " stage_done, stage_total, stage_eta FROM ingest_job ORDER BY doc_id").fetchall()
        out: dict[int, dict] = {}
        place = 0
        for doc_id, held, stage, done, total, eta in rows:
            if held and stage:
                out[int(doc_id)] = {"stage": stage, "done": done or 0, "total": total or 0, "eta_s": eta,
                                    "position": None}
            else:
                place += 0 if held else 1
                out[int(doc_id)] = {"stage": "queued", "done": 0, "total": 0, "eta_s": None,
                                    "position": None if held else place}
        return out

    def claimable(self) -> int:
        with self.db.connect() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM ingest_job WHERE owner IS NULL"
                                    f" OR lease_until < {self._now}").fetchone()[0])
