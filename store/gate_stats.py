"""The no-answer gate's background statistics, one row per knowledge base (table `kb_gate_background`).

Written after every ingest / delete / rebuild by pipeline.retrieval.gate_background; `fingerprint` names the
knowledge base state (embedding model, its ready chunks) the statistics were measured on, so a stale row is seen.
The rows are a cache: a missing or stale one is measured again, so dropping a knowledge base just deletes its row.
"""
from __future__ import annotations

import json

from sqlalchemy import delete, func, select

from .db import Store, now_text
from .schema import kb_chunk, kb_document, kb_gate_background

G = kb_gate_background.c


class GateStatsStore(Store):
    def load(self, kb_id: int) -> tuple[str, dict] | None:
        """(fingerprint, stats) of one knowledge base, or None when never measured."""
        with self.db.connect() as conn:
            row = conn.execute(select(G.fingerprint, G.stats).where(G.kb_id == int(kb_id))).first()
        if row is None:
            return None
        try:
            return row.fingerprint, json.loads(row.stats)
        except (TypeError, ValueError):
            return None

    def save(self, kb_id: int, fingerprint: str, stats: dict) -> None:
        stmt = self.db.insert(kb_gate_background)
        new = stmt.excluded
        with self.db.transaction() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=[G.kb_id], set_={
                "fingerprint": new.fingerprint, "stats": new.stats, "updated_at": new.updated_at}), {
                "kb_id": int(kb_id), "fingerprint": fingerprint, "stats": json.dumps(stats, ensure_ascii=False),
                "updated_at": now_text()})

    def delete(self, kb_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(kb_gate_background).where(G.kb_id == int(kb_id)))

    def ready_fingerprint_parts(self, kb_id: int) -> tuple[int, int]:
        """(count, max chunk_id) of the retrievable chunks of one knowledge base: changes with every add / delete."""
        c, d = kb_chunk.c, kb_document.c
        with self.db.connect() as conn:
            row = conn.execute(
                select(func.count(), func.coalesce(func.max(c.chunk_id), 0))
                .select_from(kb_chunk.join(kb_document, d.doc_id == c.doc_id))
                .where(d.status == "ready", d.active == 1, d.kb_id == int(kb_id))).one()
        return int(row[0]), int(row[1])
