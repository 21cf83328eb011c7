"""Counters in `app_state` that tell every app process what changed elsewhere (one tiny-table read per check).

    kb_generation   moves when the set of 就绪 chunks changes (a document turned 就绪, was deleted or re-processed)
    config_version  moves when settings are saved
    engine_version  moves on 重载引擎
"""
from __future__ import annotations

from sqlalchemy import select, update

from .db import Store
from .schema import app_state

KB_GENERATION = "kb_generation"
CONFIG_VERSION = "config_version"
ENGINE_VERSION = "engine_version"


class SharedState(Store):
    def read(self) -> dict[str, int]:
        with self.db.connect() as conn:
            return {name: int(value) for name, value in conn.execute(select(app_state.c.name, app_state.c.value))}

    def bump(self, name: str) -> int:
        """Move one counter; returns its new value."""
        with self.db.transaction() as conn:
            value = conn.execute(update(app_state).where(app_state.c.name == name)
                                 .values(value=app_state.c.value + 1).returning(app_state.c.value)).scalar()
        if value is None:
            raise KeyError(name)
        return int(value)
