"""The audit log (`audit_log`, migration 17): one row per question through any door and per admin action.

Rows are written once and never changed; the app deletes those older than the retention (pipeline/services/
audit_log.py). Knowledge bases are kept as ",1,3," so a filter on one is a LIKE on both dialects.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select

from .db import Store, dicts
from .schema import audit_log

A = audit_log.c


@dataclass(frozen=True)
class AuditFilter:
    actor: str | None = None
    door: str | None = None
    kind: str | None = None
    outcome: str | None = None
    kb_id: int | None = None
    since: float | None = None  # seconds since the epoch, inclusive
    until: float | None = None  # exclusive

    def where(self) -> list:
        w = []
        if self.actor:
            w.append(A.actor == self.actor)
        for col, value in ((A.door, self.door), (A.kind, self.kind), (A.outcome, self.outcome)):
            if value:
                w.append(col == value)
        if self.kb_id is not None:
            w.append(A.kb_ids.like(f"%,{int(self.kb_id)},%"))
        if self.since is not None:
            w.append(A.at >= float(self.since))
        if self.until is not None:
            w.append(A.at < float(self.until))
        return w


def _row(d: dict) -> dict:
    d["kb_ids"] = [int(x) for x in (d.get("kb_ids") or "").split(",") if x]
    d["cited"] = json.loads(d["cited"]) if d.get("cited") else []
    d["detail"] = json.loads(d["detail"]) if d.get("detail") else {}
    return d


class AuditLogStore(Store):
    def add(self, *, at: float, actor: str | None, door: str, kind: str, action: str, outcome: str,
            kb_ids: list[int] | None = None, question: str | None = None, latency_ms: int | None = None,
            cited: list[dict] | None = None, detail: dict | None = None) -> None:
        with self.db.transaction() as conn:
            conn.execute(insert(audit_log).values(
                at=at, actor=actor, door=door, kind=kind, action=action, outcome=outcome,
                kb_ids=("," + ",".join(str(int(k)) for k in kb_ids) + ",") if kb_ids else None,
                question=question, latency_ms=latency_ms,
                cited=json.dumps(cited, ensure_ascii=False) if cited else None,
                detail=json.dumps(detail, ensure_ascii=False) if detail else None))

    def page(self, f: AuditFilter, page: int = 1, size: int = 50) -> tuple[list[dict], int]:
        """Newest first."""
        where = f.where()
        with self.db.connect() as conn:
            total = conn.execute(select(func.count()).select_from(audit_log).where(*where)).scalar() or 0
            rows = dicts(conn.execute(select(audit_log).where(*where).order_by(A.entry_id.desc())
                                      .limit(size).offset((page - 1) * size)))
        return [_row(r) for r in rows], int(total)

    def iterate(self, f: AuditFilter, batch: int = 1000) -> Iterator[dict]:
        """Every matching row, oldest first, read in batches (an export of a long log stays small in memory)."""
        after = 0
        while True:
            with self.db.connect() as conn:
                rows = dicts(conn.execute(select(audit_log).where(*f.where(), A.entry_id > after)
                                          .order_by(A.entry_id).limit(batch)))
            if not rows:
                return
            for r in rows:
                yield _row(r)
            after = rows[-1]["entry_id"]

    def purge(self, before: float) -> int:
        with self.db.transaction() as conn:
            return conn.execute(delete(audit_log).where(A.at < float(before))).rowcount or 0
