"""Knowledge bases in SQLite (`kb_base`): name, description, creation time, document and chunk counts.

`readers`: the user names who may read it (a JSON list), NULL = every logged-in user (pipeline.access.Reader).
Knowledge base 1 is the default one (created by store.migrations for every data dir, holding the documents of
releases before knowledge bases existed); it can be renamed but not deleted.
"""
from __future__ import annotations

import json
from datetime import datetime

from .db import Database
from .migrations import DEFAULT_KB_ID

_COUNTS = """
SELECT b.kb_id, b.name, b.description, b.created_at, b.readers,
       (SELECT COUNT(*) FROM kb_document d WHERE d.kb_id = b.kb_id AND (d.active = 1 OR d.status != 'ready')) AS docs,
       (SELECT COUNT(*) FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id
         WHERE d.kb_id = b.kb_id AND d.status = 'ready' AND d.active = 1) AS chunks
FROM kb_base b
"""


def _kb_dict(row) -> dict:
    d = dict(row)
    d["is_default"] = d["kb_id"] == DEFAULT_KB_ID
    d["readers"] = json.loads(d["readers"]) if d.get("readers") is not None else None  # None = every user
    return d


def _readers_json(readers: list[str] | None) -> str | None:
    return None if readers is None else json.dumps(sorted(set(readers)), ensure_ascii=False)


class KBStore:
    def __init__(self, db: Database):
        self.db = db

    def list(self) -> list[dict]:
        with self.db.connect() as conn:
            return [_kb_dict(r) for r in conn.execute(_COUNTS + " ORDER BY b.kb_id")]

    def get(self, kb_id: int) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute(_COUNTS + " WHERE b.kb_id = ?", (int(kb_id),)).fetchone()
        return _kb_dict(row) if row else None

    def exists(self, kb_id: int) -> bool:
        with self.db.connect() as conn:
            return conn.execute("SELECT 1 FROM kb_base WHERE kb_id = ?", (int(kb_id),)).fetchone() is not None

    def ids(self) -> list[int]:
        with self.db.connect() as conn:
            return [r[0] for r in conn.execute("SELECT kb_id FROM kb_base ORDER BY kb_id")]

    def names(self) -> dict[int, str]:
        with self.db.connect() as conn:
            return {r[0]: r[1] for r in conn.execute("SELECT kb_id, name FROM kb_base")}

    def find_by_name(self, name: str) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT kb_id FROM kb_base WHERE name = ?", (name,)).fetchone()
        return self.get(row[0]) if row else None

    def create(self, name: str, description: str = "", readers: list[str] | None = None) -> dict:
        with self.db.transaction() as conn:
            kb_id = conn.execute("INSERT INTO kb_base(name, description, created_at, readers) VALUES (?, ?, ?, ?)"
                                 " RETURNING kb_id",
                                 (name, description, datetime.now().isoformat(sep=" ", timespec="seconds"),
                                  _readers_json(readers))).fetchone()[0]
        return self.get(kb_id)

    def update(self, kb_id: int, name: str | None = None, description: str | None = None,
               readers: list[str] | None | object = ...) -> dict | None:
        """`readers` ... (the default) leaves them; None opens the knowledge base to everyone."""
        with self.db.transaction() as conn:
            if readers is not ...:
                conn.execute("UPDATE kb_base SET readers = ? WHERE kb_id = ?", (_readers_json(readers), int(kb_id)))
            if name is not None:
                conn.execute("UPDATE kb_base SET name = ? WHERE kb_id = ?", (name, int(kb_id)))
            if description is not None:
                conn.execute("UPDATE kb_base SET description = ? WHERE kb_id = ?", (description, int(kb_id)))
        return self.get(kb_id)

    def delete(self, kb_id: int) -> None:
        """The row only: its documents must be gone first (Engine.delete_kb)."""
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM kb_base WHERE kb_id = ?", (int(kb_id),))
