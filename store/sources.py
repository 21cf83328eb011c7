"""What knowledge bases follow (migration 20): web pages (`web_source`) and one server-side folder per knowledge
base (`folder_source`, the files it last saw in `folder_file`, a `sync_report` per sync).

`claim_due` is how the interval scheduler of every app process takes a source: one conditional UPDATE moves
`next_due` forward only where it is still past, so of two processes polling at once exactly one gets the row
(both dialects; no lock held while the fetch or the sync runs — the named lease in store/leases.py covers that).
"""
from __future__ import annotations

import json

from sqlalchemy import delete, desc, insert, select, update

from .db import Store, as_dict, dicts
from .schema import folder_file, folder_source, sync_report, web_source

W, F, FF, R = web_source.c, folder_source.c, folder_file.c, sync_report.c


def _due(interval_min, now: float) -> float | None:
    return None if not interval_min else now + 60.0 * int(interval_min)


class _Due(Store):
    table = None

    def get(self, source_id: int) -> dict | None:
        with self.db.connect() as conn:
            return as_dict(conn.execute(select(self.table).where(self.table.c.source_id == int(source_id))).first())

    def claim_due(self, now: float) -> list[int]:
        """Ids of sources whose interval ran out, each claimed by this caller alone (their next_due moved on)."""
        c = self.table.c
        with self.db.connect() as conn:
            due = conn.execute(select(c.source_id, c.interval_min, c.next_due)
                               .where(c.next_due.is_not(None), c.next_due <= now)).all()
        mine = []
        for source_id, interval, next_due in due:
            with self.db.transaction() as conn:
                if conn.execute(update(self.table).where(c.source_id == source_id, c.next_due == next_due)
                                .values(next_due=_due(interval, now))).rowcount == 1:
                    mine.append(int(source_id))
        return mine


class WebSourceStore(_Due):
    table = web_source

    def add(self, kb_id: int, url: str, doc_name: str, interval_min: int | None, created_by: str | None,
            now: float) -> dict:
        with self.db.transaction() as conn:
            source_id = conn.execute(insert(web_source).returning(W.source_id), {
                "kb_id": int(kb_id), "url": url, "doc_name": doc_name, "interval_min": interval_min,
                "next_due": _due(interval_min, now), "status": "pending", "created_by": created_by,
                "created_at": now}).scalar_one()
        return self.get(source_id)

    def find(self, kb_id: int, url: str) -> dict | None:
        with self.db.connect() as conn:
            return as_dict(conn.execute(select(web_source).where(W.kb_id == int(kb_id), W.url == url)).first())

    def list(self, kb_id: int) -> list[dict]:
        with self.db.connect() as conn:
            return dicts(conn.execute(select(web_source).where(W.kb_id == int(kb_id)).order_by(W.source_id)))

    def set_interval(self, source_id: int, interval_min: int | None, now: float) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(web_source).where(W.source_id == int(source_id))
                         .values(interval_min=interval_min, next_due=_due(interval_min, now)))

    def record(self, source_id: int, **values) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(web_source).where(W.source_id == int(source_id)).values(**values))

    def delete(self, source_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(web_source).where(W.source_id == int(source_id)))


class FolderSourceStore(_Due):
    table = folder_source

    def set(self, kb_id: int, path: str, interval_min: int | None, created_by: str | None, now: float) -> dict:
        """The folder the knowledge base follows (one per knowledge base; a new path replaces the old one and
        forgets the files seen there)."""
        with self.db.transaction() as conn:
            old = conn.execute(select(F.source_id, F.path).where(F.kb_id == int(kb_id))).first()
            if old is not None and old.path == path:
                conn.execute(update(folder_source).where(F.source_id == old.source_id)
                             .values(interval_min=interval_min, next_due=_due(interval_min, now)))
            else:
                if old is not None:
                    conn.execute(delete(folder_source).where(F.source_id == old.source_id))
                conn.execute(insert(folder_source), {
                    "kb_id": int(kb_id), "path": path, "interval_min": interval_min,
                    "next_due": _due(interval_min, now), "created_by": created_by, "created_at": now})
        return self.of_kb(kb_id)

    def of_kb(self, kb_id: int) -> dict | None:
        with self.db.connect() as conn:
            return as_dict(conn.execute(select(folder_source).where(F.kb_id == int(kb_id))).first())

    def remove(self, kb_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(folder_source).where(F.kb_id == int(kb_id)))

    # --- the files a sync last saw
    def files(self, source_id: int) -> dict[str, dict]:
        with self.db.connect() as conn:
            return {d["rel_path"]: d for d in dicts(conn.execute(
                select(folder_file).where(FF.source_id == int(source_id))))}

    def put_file(self, source_id: int, rel_path: str, **values) -> None:
        with self.db.transaction() as conn:
            conn.execute(self.db.insert(folder_file).values(source_id=int(source_id), rel_path=rel_path, **values)
                         .on_conflict_do_update(index_elements=["source_id", "rel_path"], set_=values))

    def drop_file(self, source_id: int, rel_path: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(folder_file).where(FF.source_id == int(source_id), FF.rel_path == rel_path))

    # --- reports
    def add_report(self, source_id: int, kb_id: int, report: dict) -> int:
        counts = {k: len(report[k]) for k in ("added", "updated", "removed", "failed", "unchanged")}
        detail = {k: report[k] for k in ("added", "updated", "removed", "failed")}
        with self.db.transaction() as conn:
            report_id = conn.execute(insert(sync_report).returning(R.report_id), {
                "source_id": int(source_id), "kb_id": int(kb_id), "started_at": report["started_at"],
                "finished_at": report["finished_at"], "cause": report["cause"], "actor": report.get("actor"),
                "detail": json.dumps(detail, ensure_ascii=False), **counts}).scalar_one()
            conn.execute(update(folder_source).where(F.source_id == int(source_id))
                         .values(last_sync_at=report["finished_at"], last_report_id=report_id))
        return int(report_id)

    def reports(self, source_id: int, limit: int = 20) -> list[dict]:
        with self.db.connect() as conn:
            rows = dicts(conn.execute(select(sync_report).where(R.source_id == int(source_id))
                                      .order_by(desc(R.report_id)).limit(int(limit))))
        for r in rows:
            r["detail"] = json.loads(r["detail"]) if r.get("detail") else {}
        return rows
