"""Key/value persistence of settings in `sys_config` (values JSON-encoded, `updated_at` per key)."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .db import Database


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ConfigStore:
    def __init__(self, db: Database):
        self.db = db

    def load(self) -> dict[str, Any]:
        with self.db.connect() as conn:
            rows = conn.execute("SELECT key, value FROM sys_config").fetchall()
        out = {}
        for r in rows:
            try:
                out[r["key"]] = json.loads(r["value"])
            except (TypeError, ValueError):
                out[r["key"]] = r["value"]
        return out

    def updated_at(self) -> dict[str, str]:
        with self.db.connect() as conn:
            return {r["key"]: r["updated_at"] for r in conn.execute("SELECT key, updated_at FROM sys_config")}

    def write_defaults(self, defaults: dict[str, Any]) -> list[str]:
        """Insert keys that are missing (first start, or a new setting after an upgrade)."""
        now = _now()
        added = []
        with self.db.transaction() as conn:
            for key, value in defaults.items():
                cur = conn.execute(
                    "INSERT OR IGNORE INTO sys_config(key, value, updated_at) VALUES (?, ?, ?)",
                    (key, json.dumps(value, ensure_ascii=False), now),
                )
                if cur.rowcount:
                    added.append(key)
        return added

    def save(self, values: dict[str, Any]) -> list[str]:
        """Upsert values; `updated_at` moves only for keys whose stored value really changed."""
        now = _now()
        changed = []
        with self.db.transaction() as conn:
            for key, value in values.items():
                enc = json.dumps(value, ensure_ascii=False)
                row = conn.execute("SELECT value FROM sys_config WHERE key = ?", (key,)).fetchone()
                if row is not None and row["value"] == enc:
                    continue
                conn.execute(
                    "INSERT INTO sys_config(key, value, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    (key, enc, now),
                )
                changed.append(key)
        return changed
