"""SQLite-style SQL → PostgreSQL, so stores keep one portable SQL text.

Handled (outside string literals): `?` → `%s` (and a literal `%` doubled for psycopg), `LIKE` → `ILIKE`
(SQLite's LIKE ignores ASCII case), `INSERT OR IGNORE INTO …` → `INSERT INTO … ON CONFLICT DO NOTHING`, and
column names PostgreSQL reserves (`user`) quoted.
Refused with a clear error (no safe generic translation): `INSERT OR REPLACE` (write `ON CONFLICT(key) DO
UPDATE SET …`, valid on both), `PRAGMA`. DDL is not translated here: migrations carry it per dialect
(store/migrations.py `pg_ddl`).
"""
from __future__ import annotations

import re
from functools import lru_cache

_LITERAL = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")", re.S)  # string literals, quoted identifiers
_OR_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO\b", re.I)
_REFUSED = re.compile(r"^\s*(INSERT\s+OR\s+REPLACE|REPLACE\s+INTO|PRAGMA)\b", re.I)
_RETURNING = re.compile(r"\bRETURNING\b", re.I)
_LIKE = re.compile(r"\bLIKE\b", re.I)
# Column names SQLite accepts bare but PostgreSQL reserves (conversation.user …): quoted there.
_RESERVED = re.compile(r"(?<![\w.\"])\b(user)\b(?![\w\"(])", re.I)


class UnportableSQL(ValueError):
    """SQL that has no safe PostgreSQL equivalent: rewrite it in the portable subset."""


def quote_reserved(sql: str) -> str:
    """Quote the identifiers PostgreSQL reserves, outside string literals (also used for migration DDL)."""
    parts = _LITERAL.split(sql)
    return "".join(part if i % 2 else _RESERVED.sub(lambda m: f'"{m.group(1).lower()}"', part)
                   for i, part in enumerate(parts))


@lru_cache(maxsize=2048)
def to_postgres(sql: str, with_params: bool = True) -> str:
    m = _REFUSED.match(sql)
    if m:
        raise UnportableSQL(f"{m.group(1).upper()} is SQLite-only; use INSERT … ON CONFLICT(…) DO UPDATE/NOTHING: "
                            f"{sql[:80]}")
    out = []
    for i, part in enumerate(_LITERAL.split(sql)):
        if i % 2:  # a literal: only psycopg's % needs doubling
            out.append(part.replace("%", "%%") if with_params else part)
            continue
        if with_params:
            part = part.replace("%", "%%").replace("?", "%s")
        part = _LIKE.sub("ILIKE", part)
        out.append(_RESERVED.sub(lambda m: f'"{m.group(1).lower()}"', part))
    text = "".join(out)
    if _OR_IGNORE.match(text):
        text = _OR_IGNORE.sub("INSERT INTO", text, count=1)
        ret = _RETURNING.search(text)
        if ret:
            text = text[:ret.start()] + "ON CONFLICT DO NOTHING " + text[ret.start():]
        else:
            text = text.rstrip().rstrip(";") + " ON CONFLICT DO NOTHING"
    return text
