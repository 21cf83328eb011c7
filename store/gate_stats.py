"""The no-answer gate's background statistics, one row per knowledge base (table `kb_gate_background`).

Written after every ingest / delete / rebuild by pipeline.retrieval.gate_background; `fingerprint` names the
knowledge base state (embedding model, its ready chunks) the statistics were measured on, so a stale row is seen.
The rows are a cache: a missing or stale one is measured again, so dropping a knowledge base just deletes its row.
"""
from __future__ import annotations

import json
from datetime import datetime

from .db import Database


class GateStatsStore:
    def __init__(self, db: Database):
        self.db = db

    def load(self, kb_id: int) -> tuple[str, dict] | None:
        """(fingerprint, stats) of one knowledge base, or None when never measured."""
        with self.db.connect() as conn:
            row = conn.execute("SELECT fingerprint, stats FROM kb_gate_background WHERE kb_id = ?",
                               (int(kb_id),)).fetchone()
        if row is None:
            return None
        try:
            return row["fingerprint"], json.loads(row["stats"])
        except (TypeError, ValueError):
            return None

    def save(self, kb_id: int, fingerprint: str, stats: dict) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO kb_gate_background(kb_id, fingerprint, stats, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(kb_id) DO UPDATE SET fingerprint = excluded.fingerprint, stats = excluded.stats, "
                "updated_at = excluded.updated_at",
                (int(kb_id), fingerprint, json.dumps(stats, ensure_ascii=False),
                 datetime.now().isoformat(sep=" ", timespec="seconds")))

    def delete(self, kb_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM kb_gate_background WHERE kb_id = ?", (int(kb_id),))

    def ready_fingerprint_parts(self, kb_id: int) -> tuple[int, int]:
        """(count, max chunk_id) of the retrievable chunks of one knowledge base: changes with every add / delete."""
        with self.db.connect() as conn:
            row = conn.execute(
                "SELECT COUNT(*), COALESCE(MAX(c.chunk_id), 0) FROM kb_chunk c JOIN kb_document d"
                " ON d.doc_id = c.doc_id WHERE d.status = 'ready' AND d.active = 1 AND d.kb_id = ?",
                (int(kb_id),)).fetchone()
        return int(row[0]), int(row[1])
