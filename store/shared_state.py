"""Counters in `app_state` that tell every app process what changed elsewhere (one tiny-table read per check).

    kb_generation   moves when the set of 就绪 chunks changes (a document turned 就绪, was deleted or re-processed)
    config_version  moves when settings are saved
    engine_version  moves on 重载引擎
"""
from __future__ import annotations

from .db import Database

KB_GENERATION = "kb_generation"
CONFIG_VERSION = "config_version"
ENGINE_VERSION = "engine_version"


class SharedState:
    def __init__(self, db: Database):
        self.db = db

    def read(self) -> dict[str, int]:
        with self.db.connect() as conn:
            return {r[0]: int(r[1]) for r in conn.execute("SELECT name, value FROM app_state")}

    def bump(self, name: str) -> int:
        """Move one counter; returns its new value."""
        with self.db.transaction() as conn:
            row = conn.execute("UPDATE app_state SET value = value + 1 WHERE name = ? RETURNING value",
                               (name,)).fetchone()
        if row is None:
            raise KeyError(name)
        return int(row[0])
