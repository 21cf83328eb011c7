"""The no-answer gate's background statistics of this knowledge base (table `kb_gate_background`, one row).

Written after every ingest / delete / rebuild by pipeline.retrieval.gate_background; `fingerprint` names the
knowledge base state (embedding model, ready chunks) the statistics were measured on, so a stale row is seen.
"""
from __future__ import annotations

import json
from datetime import datetime

from .db import Database


class GateStatsStore:
    def __init__(self, db: Database):
        self.db = db

    def load(self) -> tuple[str, dict] | None:
        """(fingerprint, stats) or None when never measured."""
        with self.db.connect() as conn:
            row = conn.execute("SELECT fingerprint, stats FROM kb_gate_background WHERE id = 1").fetchone()
        if row is None:
            return None
        try:
            return row["fingerprint"], json.loads(row["stats"])
        except (TypeError, ValueError):
            return None

    def save(self, fingerprint: str, stats: dict) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO kb_gate_background(id, fingerprint, stats, updated_at) VALUES (1, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET fingerprint = excluded.fingerprint, stats = excluded.stats, "
                "updated_at = excluded.updated_at",
                (fingerprint, json.dumps(stats, ensure_ascii=False),
                 datetime.now().isoformat(sep=" ", timespec="seconds")))

    def ready_fingerprint_parts(self) -> tuple[int, int]:
        """(count, max chunk_id) of the chunks of 就绪 documents: changes with every add / delete."""
        with self.db.connect() as conn:
            row = conn.execute(
                "SELECT COUNT(*), COALESCE(MAX(c.chunk_id), 0) FROM kb_chunk c JOIN kb_document d"
                " ON d.doc_id = c.doc_id WHERE d.status = 'ready'").fetchone()
        return int(row[0]), int(row[1])
