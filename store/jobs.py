"""The ingest queue in the database (`ingest_job`): one row per document waiting for or under ingestion.

A worker claims jobs atomically and holds them under a lease (`owner`, `lease_until` by the database clock)
that it renews while it works. A job whose lease ran out (its process died, kill -9 included) is claimable
again by any worker. The owner check on every end-of-job write is the fencing: a worker that lost its lease
can no longer mark the document 就绪/失败 or drop the job, so no job is done twice. Deleting a document deletes
its job (ON DELETE CASCADE).

PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED` lets several processes claim concurrently without waiting on each
other. SQLite: the claim runs under BEGIN IMMEDIATE (one writer), the single local worker; SQLAlchemy renders no
FOR UPDATE there.

Every time is read from `db.clock` (the database's clock; tests move it forward to let a lease run out).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, delete, func, or_, select, update

from .db import Database
from .documents import activate_waiting_version
from .schema import app_state, ingest_job, kb_document

J = ingest_job.c


class LeaseLost(RuntimeError):
    """This worker's lease on a document ran out and another worker holds it now."""


@dataclass(frozen=True)
class Job:
    doc_id: int
    attempts: int  # claims so far, this one included (> 1: taken over from a worker that stopped)


class JobStore:
    def __init__(self, db: Database):
        self.db = db
        self.clock = db.clock

    def _lease(self, owner: str, lease_s: float, *, claim: bool = False) -> dict:
        """SET values leasing a job to `owner` for `lease_s` seconds (a claim also counts an attempt)."""
        values = {"owner": owner, "lease_until": self.clock.now() + float(lease_s)}
        return {**values, "attempts": J.attempts + 1} if claim else values

    def _free(self):
        """Jobs nobody holds: unowned, or their lease ran out."""
        return or_(J.owner.is_(None), J.lease_until < self.clock.now())

    def _add(self, conn, doc_id: int) -> bool:
        # RETURNING tells whether a row went in (an INSERT's rowcount is not reliable across drivers)
        return conn.execute(self.db.insert(ingest_job).values(created_at=self.clock.now()).on_conflict_do_nothing()
                            .returning(J.doc_id), {"doc_id": doc_id}).first() is not None

    def add(self, doc_id: int) -> bool:
        """Queue the document (no-op when it already has a job). True when a job was created."""
        with self.db.transaction() as conn:
            return self._add(conn, doc_id)

    def claim(self, owner: str, lease_s: float, limit: int) -> list[Job]:
        """Up to `limit` unowned or expired jobs, now leased to `owner` (oldest first)."""
        free = (select(J.doc_id).where(self._free()).order_by(J.doc_id).limit(int(limit))
                .with_for_update(skip_locked=True).correlate(None))  # its own FROM ingest_job, not the UPDATE's
        with self.db.transaction() as conn:
            rows = conn.execute(update(ingest_job).where(J.doc_id.in_(free))
                                .values(self._lease(owner, lease_s, claim=True))
                                .returning(J.doc_id, J.attempts)).all()
        return sorted((Job(int(r[0]), int(r[1])) for r in rows), key=lambda j: j.doc_id)

    def claim_doc(self, doc_id: int, owner: str, lease_s: float) -> bool:
        """Lease one given document's job to `owner` (a full rebuild re-processing it). False when another
        live worker holds it."""
        with self.db.transaction() as conn:
            self._add(conn, doc_id)
            return conn.execute(update(ingest_job).where(J.doc_id == doc_id, or_(self._free(), J.owner == owner))
                                .values(self._lease(owner, lease_s, claim=True))).rowcount > 0

    def renew(self, owner: str, lease_s: float) -> set[int]:
        """Extend every lease `owner` holds; returns the doc_ids it still holds."""
        with self.db.transaction() as conn:
            return {int(d) for d in conn.execute(update(ingest_job).where(J.owner == owner)
                                                 .values(self._lease(owner, lease_s)).returning(J.doc_id)).scalars()}

    def fence(self, conn, doc_id: int, owner: str, lease_s: float) -> None:
        """Inside a caller's transaction: renew and row-lock our lease, or raise LeaseLost. The lock holds until
        that transaction ends, so no other worker can take the job over halfway through its writes."""
        if conn.execute(update(ingest_job).where(J.doc_id == doc_id, J.owner == owner)
                        .values(self._lease(owner, lease_s))).rowcount == 0:
            raise LeaseLost(doc_id)

    def release(self, doc_ids: list[int], owner: str) -> None:
        """Put jobs we still hold back in the queue (processing stopped without an outcome)."""
        if not doc_ids:
            return
        with self.db.transaction() as conn:
            conn.execute(update(ingest_job).where(J.owner == owner, J.doc_id.in_([int(d) for d in doc_ids]))
                         .values(owner=None, lease_until=None))

    def holds(self, doc_id: int, owner: str) -> bool:
        with self.db.connect() as conn:
            return conn.execute(select(1).where(J.doc_id == doc_id, J.owner == owner)).first() is not None

    def complete(self, doc_id: int, owner: str, chunk_count: int) -> int | None:
        """The job ends and the document turns 就绪 in one transaction — only while `owner` holds the lease (else
        None). Returns the KB generation this moved the counter to (SharedSync.bumped: no need to react to it)."""
        return self._end(doc_id, owner, {"status": "ready", "fail_reason": None, "progress": None,
                                         "chunk_count": chunk_count}, ready=True)

    def fail(self, doc_id: int, owner: str, reason: str) -> bool:
        """The job ends and the document turns 失败 (with its reason) — only while `owner` holds the lease."""
        return self._end(doc_id, owner, {"status": "failed", "fail_reason": reason, "progress": None}) is not None

    def _end(self, doc_id: int, owner: str, doc_values: dict, ready: bool = False) -> int | None:
        """None when fenced; else the KB generation after the change (0: the ready set did not change)."""
        with self.db.transaction() as conn:
            if conn.execute(delete(ingest_job).where(J.doc_id == doc_id, J.owner == owner)).rowcount == 0:
                return None  # fenced: the lease ran out and another worker holds the job
            conn.execute(update(kb_document).where(kb_document.c.doc_id == doc_id).values(doc_values))
            if not ready:
                return 0
            # the set of 就绪 chunks changed: every other process's BM25 follows it
            activate_waiting_version(conn, doc_id)  # a new version replaces the old one at the same moment
            return int(conn.execute(update(app_state).where(app_state.c.name == "kb_generation")
                                    .values(value=app_state.c.value + 1).returning(app_state.c.value)).scalar_one())

    def release_all(self) -> int:
        """Single-process start (SQLite): every lease belongs to a previous run, so free them now."""
        with self.db.transaction() as conn:
            return conn.execute(update(ingest_job).where(J.owner.is_not(None))
                                .values(owner=None, lease_until=None)).rowcount

    def exists(self, doc_id: int) -> bool:
        with self.db.connect() as conn:
            return conn.execute(select(1).where(J.doc_id == doc_id)).first() is not None

    def count(self) -> int:
        with self.db.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(ingest_job)).scalar_one())

    def set_stage(self, doc_id: int, owner: str, stage: str, done: int, total: int, eta_s: float | None) -> None:
        """The holder's progress on a job, for the other processes' document lists."""
        with self.db.transaction() as conn:
            conn.execute(update(ingest_job).where(J.doc_id == doc_id, J.owner == owner).values(
                stage=stage, stage_done=int(done), stage_total=int(total), stage_eta=eta_s))

    def progress(self) -> dict[int, dict]:
        """Every job: {doc_id: {stage, done, total, eta_s, position}}. A job nobody holds (or whose lease ran out)
        is queued, `position` = its place among those in the order workers claim them; a held one shows the stage
        its worker last wrote."""
        held = and_(J.owner.is_not(None), J.lease_until >= self.clock.now())
        with self.db.connect() as conn:
            rows = conn.execute(select(J.doc_id, held, J.stage, J.stage_done, J.stage_total, J.stage_eta)
                                .order_by(J.doc_id)).all()
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
            return int(conn.execute(select(func.count()).select_from(ingest_job).where(self._free())).scalar_one())
