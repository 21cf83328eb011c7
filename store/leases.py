"""Named leases in `app_lease`: one holder at a time across app processes, lost when not renewed in time.

Used for work that must not run in two processes at once (全量重建). A holder that dies stops renewing and the
lease frees itself after `lease_s`.
"""
from __future__ import annotations

from sqlalchemy import or_, select, update

from .db import Database
from .schema import app_lease

L = app_lease.c


class LeaseStore:
    def __init__(self, db: Database):
        self.db = db
        self.clock = db.clock  # the database's clock (a test moves it instead of sleeping)

    def acquire(self, name: str, owner: str, lease_s: float) -> bool:
        with self.db.transaction() as conn:
            conn.execute(self.db.insert(app_lease).values(name=name).on_conflict_do_nothing())
            return conn.execute(
                update(app_lease).where(L.name == name, or_(L.owner.is_(None), L.owner == owner,
                                                            L.lease_until < self.clock.now()))
                .values(owner=owner, lease_until=self.clock.now() + float(lease_s))).rowcount > 0

    def renew(self, name: str, owner: str, lease_s: float) -> bool:
        with self.db.transaction() as conn:
            return conn.execute(update(app_lease).where(L.name == name, L.owner == owner)
                                .values(lease_until=self.clock.now() + float(lease_s))).rowcount > 0

    def release(self, name: str, owner: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(app_lease).where(L.name == name, L.owner == owner).values(owner=None, lease_until=None))

    def holder(self, name: str) -> str | None:
        """The live holder of the lease, or None."""
        with self.db.connect() as conn:
            return conn.execute(select(L.owner).where(L.name == name, L.owner.is_not(None),
                                                      L.lease_until >= self.clock.now())).scalar()
