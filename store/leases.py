"""Named leases in `app_lease`: one holder at a time across app processes, lost when not renewed in time.

Used for work that must not run in two processes at once (全量重建). A holder that dies stops renewing and the
lease frees itself after `lease_s`.
"""
from __future__ import annotations

from .db import Database


class LeaseStore:
    def __init__(self, db: Database):
        self.db = db
        self._now = db.now_sql

    def acquire(self, name: str, owner: str, lease_s: float) -> bool:
        with self.db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO app_lease(name) VALUES (?)", (name,))
            return conn.execute(
                f"UPDATE app_lease SET owner = ?, lease_until = {self._now} + ? WHERE name = ?"
                f" AND (owner IS NULL OR owner = ? OR lease_until < {self._now})",
                (owner, float(lease_s), name, owner)).rowcount > 0

    def renew(self, name: str, owner: str, lease_s: float) -> bool:
        with self.db.transaction() as conn:
            return conn.execute(f"UPDATE app_lease SET lease_until = {self._now} + ? WHERE name = ? AND owner = ?",
                                (float(lease_s), name, owner)).rowcount > 0

    def release(self, name: str, owner: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE app_lease SET owner = NULL, lease_until = NULL WHERE name = ? AND owner = ?",
                         (name, owner))

    def holder(self, name: str) -> str | None:
        """The live holder of the lease, or None."""
        with self.db.connect() as conn:
            row = conn.execute(f"SELECT owner FROM app_lease WHERE name = ? AND owner IS NOT NULL"
                               f" AND lease_until >= {self._now}", (name,)).fetchone()
        return row[0] if row else None
