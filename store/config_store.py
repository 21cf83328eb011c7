"""Key/value persistence of settings in `sys_config` (values JSON-encoded, `updated_at` per key)."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from .db import Database
from .schema import sys_config

K = sys_config.c


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ConfigStore:
    def __init__(self, db: Database):
        self.db = db

    def load(self) -> dict[str, Any]:
        with self.db.connect() as conn:
            rows = conn.execute(select(K.key, K.value)).all()
        out = {}
        for key, value in rows:
            try:
                out[key] = json.loads(value)
            except (TypeError, ValueError):
                out[key] = value
        return out

    def updated_at(self) -> dict[str, str]:
        with self.db.connect() as conn:
            return {k: v for k, v in conn.execute(select(K.key, K.updated_at))}

    def write_defaults(self, defaults: dict[str, Any]) -> list[str]:
        """Insert keys that are missing (first start, or a new setting after an upgrade)."""
        now = _now()
        added = []
        with self.db.transaction() as conn:
            for key, value in defaults.items():
                row = {"key": key, "value": json.dumps(value, ensure_ascii=False), "updated_at": now}
                # RETURNING tells whether the row went in (an INSERT's rowcount is not reliable across drivers)
                if conn.execute(self.db.insert(sys_config).on_conflict_do_nothing().returning(K.key),
                                row).first() is not None:
                    added.append(key)
        return added

    def save(self, values: dict[str, Any]) -> list[str]:
        """Upsert values; `updated_at` moves only for keys whose stored value really changed."""
        now = _now()
        changed = []
        with self.db.transaction() as conn:
            for key, value in values.items():
                enc = json.dumps(value, ensure_ascii=False)
                stored = conn.execute(select(K.value).where(K.key == key)).first()
                if stored is not None and stored.value == enc:
                    continue
                upsert = self.db.insert(sys_config)
                conn.execute(upsert.on_conflict_do_update(index_elements=[K.key], set_={
                    "value": upsert.excluded.value, "updated_at": upsert.excluded.updated_at}),
                    {"key": key, "value": enc, "updated_at": now})
                changed.append(key)
        return changed
