"""API keys (`api_key`, migration 15) and the per-minute request counters of rate limits (`rate_window`, 16).

A key row never holds the secret: only its sha256 (`secret_hash`, looked up on every request) and a short
display `prefix`. Revocation and expiry are read from the row on each request, so they take effect at once in
every app process. The counters are rows (bucket, minute) incremented with one upsert, so every process of a
team deployment counts into the same window.
"""
from __future__ import annotations

import json

from sqlalchemy import delete, func, select, update

from .db import Store, as_dict, dicts, now_text
from .schema import api_key, rate_window

K = api_key.c
W = rate_window.c
PUBLIC_COLUMNS = [c for c in api_key.c if c.name != "secret_hash"]  # what lists and lookups hand out


def _row(d: dict | None) -> dict | None:
    if d is not None:
        d["kb_ids"] = json.loads(d["kb_ids"]) if d.get("kb_ids") is not None else None
        d.pop("secret_hash", None)
    return d


class ApiKeyStore(Store):
    def create(self, *, name: str, role: str, kb_ids: list[int] | None, secret_hash: str, prefix: str,
               rate_limit: int | None, expires_at: float | None, created_by: str | None) -> dict:
        with self.db.transaction() as conn:
            key_id = conn.execute(api_key.insert().values(
                name=name, role=role, kb_ids=None if kb_ids is None else json.dumps(kb_ids), secret_hash=secret_hash,
                prefix=prefix, rate_limit=rate_limit, expires_at=expires_at, created_by=created_by,
                created_at=now_text()).returning(K.key_id)).scalar_one()
        return self.get(key_id)

    def get(self, key_id: int) -> dict | None:
        with self.db.connect() as conn:
            return _row(as_dict(conn.execute(select(*PUBLIC_COLUMNS).where(K.key_id == key_id)).first()))

    def by_hash(self, secret_hash: str) -> dict | None:
        with self.db.connect() as conn:
            return _row(as_dict(conn.execute(select(*PUBLIC_COLUMNS).where(K.secret_hash == secret_hash)).first()))

    def list(self) -> list[dict]:
        with self.db.connect() as conn:
            return [_row(d) for d in dicts(conn.execute(select(*PUBLIC_COLUMNS).order_by(K.key_id)))]

    def any_active(self, now: float) -> bool:
        with self.db.connect() as conn:
            return conn.execute(select(func.count()).select_from(api_key).where(
                K.revoked_at.is_(None), (K.expires_at.is_(None)) | (K.expires_at > now))).scalar_one() > 0

    def revoke(self, key_id: int) -> bool:
        with self.db.transaction() as conn:
            return conn.execute(update(api_key).where(K.key_id == key_id, K.revoked_at.is_(None))
                                .values(revoked_at=now_text())).rowcount > 0

    def touch(self, key_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(api_key).where(K.key_id == key_id).values(last_used_at=now_text()))


class RateWindowStore(Store):
    def hit(self, bucket: str, minute: int) -> int:
        """Count one request of `bucket` in `minute`; the count after it (every process adds to the same row)."""
        stmt = self.db.insert(rate_window).values(bucket=bucket, minute=minute, hits=1)
        stmt = stmt.on_conflict_do_update(index_elements=[W.bucket, W.minute], set_={"hits": W.hits + 1})
        with self.db.transaction() as conn:
            return int(conn.execute(stmt.returning(W.hits)).scalar_one())

    def total(self, bucket: str, since_minute: int) -> int:
        """Hits of `bucket` in the minutes from `since_minute` on."""
        with self.db.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.sum(W.hits), 0))
                                    .where(W.bucket == bucket, W.minute >= since_minute)).scalar_one())

    def first_minute(self, bucket: str, since_minute: int) -> int:
        with self.db.connect() as conn:
            return int(conn.execute(select(func.min(W.minute))
                                    .where(W.bucket == bucket, W.minute >= since_minute)).scalar_one())

    def prune(self, before_minute: int) -> int:
        with self.db.transaction() as conn:
            return conn.execute(delete(rate_window).where(W.minute < before_minute)).rowcount
