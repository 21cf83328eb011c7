"""Key/value persistence of settings in `sys_config` (values JSON-encoded, `updated_at` per key); the keys in
`secret_keys` are sealed by the SecretBox (store/secrets.py) before they are written and opened when read."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select

from .db import Database
from .schema import sys_config
from .secrets import SecretBox, SecretUnreadable

K = sys_config.c


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ConfigStore:
    def __init__(self, db: Database, box: SecretBox | None = None, secret_keys: frozenset[str] = frozenset()):
        self.db = db
        self.box = box
        self.secret_keys = secret_keys if box is not None else frozenset()
        self.unreadable: set[str] = set()  # secrets stored under another key (a restore without secret.key)

    def load(self) -> dict[str, Any]:
        with self.db.connect() as conn:
            rows = conn.execute(select(K.key, K.value)).all()
        out = {}
        unreadable = set()
        for key, value in rows:
            try:
                out[key] = json.loads(value)
            except (TypeError, ValueError):
                out[key] = value
            if key in self.secret_keys and isinstance(out[key], str):
                try:
                    out[key] = self.box.open(out[key])
                except SecretUnreadable:
                    out[key] = ""  # must be entered again (health and the settings tab say so)
                    unreadable.add(key)
        self.unreadable = unreadable
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """One stored value (not a secret: those are read through load), `default` when the key is absent."""
        with self.db.connect() as conn:
            value = conn.execute(select(K.value).where(K.key == key)).scalar()
        if value is None:
            return default
        try:
            return json.loads(value)
        except (TypeError, ValueError):
            return value

    def delete(self, key: str) -> bool:
        """Remove one key (e.g. the chunking of a deleted knowledge base); True when it was there."""
        with self.db.transaction() as conn:
            return conn.execute(delete(sys_config).where(K.key == key)).rowcount > 0

    def _encoded(self, key: str, value: Any) -> str:
        if key in self.secret_keys and isinstance(value, str):
            value = self.box.seal(value)
        return json.dumps(value, ensure_ascii=False)

    def updated_at(self) -> dict[str, str]:
        with self.db.connect() as conn:
            return {k: v for k, v in conn.execute(select(K.key, K.updated_at))}

    def write_defaults(self, defaults: dict[str, Any]) -> list[str]:
        """Insert keys that are missing (first start, or a new setting after an upgrade)."""
        now = _now()
        added = []
        with self.db.transaction() as conn:
            for key, value in defaults.items():
                row = {"key": key, "value": self._encoded(key, value), "updated_at": now}
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
                enc = self._encoded(key, value)
                stored = conn.execute(select(K.value).where(K.key == key)).first()
                if stored is not None and (stored.value == enc or self._same_secret(key, stored.value, value)):
                    continue
                upsert = self.db.insert(sys_config)
                conn.execute(upsert.on_conflict_do_update(index_elements=[K.key], set_={
                    "value": upsert.excluded.value, "updated_at": upsert.excluded.updated_at}),
                    {"key": key, "value": enc, "updated_at": now})
                changed.append(key)
                self.unreadable.discard(key)
        return changed

    def _same_secret(self, key: str, stored: str, value: Any) -> bool:
        """A sealed value differs at every seal (a fresh IV): compare what it opens to."""
        if key not in self.secret_keys:
            return False
        try:
            return self.box.open(json.loads(stored)) == value
        except (SecretUnreadable, TypeError, ValueError):
            return False
