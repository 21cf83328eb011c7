"""SQLite-style SQL → PostgreSQL, so stores keep one portable SQL text.

Handled (outside string literals): `?` → `%s` (and a literal `%` doubled for psycopg), `LIKE` → `ILIKE`
(SQLite's LIKE ignores ASCII case), `INSERT OR IGNORE INTO …` → `INSERT INTO … ON CONFLICT DO NOTHING`.
Refused with a clear error (no safe generic translation): `INSERT OR REPLACE` (write `ON CONFLICT(key) DO
UPDATE SET …`, valid on both), `PRAGMA`. DDL is not translated here: migrations carry it per dialect
(store/migrations.py `pg_ddl`).
"""
from __future__ import annotations

import re
from functools import lru_cache

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|%|\bLIKE\b|[^'\"?%L]+|.", re.S | re.I)
_OR_IGNORE = re.compile(r"^\s*INSERT\s+OR\s+IGNORE\s+INTO\b", re.I)
_REFUSED = re.compile(r"^\s*(INSERT\s+OR\s+REPLACE|REPLACE\s+INTO|PRAGMA)\b", re.I)
_RETURNING = re.compile(r"\bRETURNING\b", re.I)


class UnportableSQL(ValueError):
    """SQL that has no safe PostgreSQL equivalent: rewrite it in the portable subset."""


@lru_cache(maxsize=2048)
def to_postgres(sql: str, with_params: bool = True) -> str:
    m = _REFUSED.match(sql)
    if m:
        raise UnportableSQL(f"{m.group(1).upper()} is SQLite-only; use INSERT … ON CONFLICT(…) DO UPDATE/NOTHING: "
                            f"{sql[:80]}")
    out = []
    for tok in _TOKEN.findall(sql):
        if tok == "?":
            out.append("%s")
        elif tok == "%":
            out.append("%%" if with_params else "%")
        elif tok.upper() == "LIKE":
            out.append("ILIKE")
        elif tok.startswith("'") and "%" in tok and with_params:
            out.append(tok.replace("%", "%%"))
        else:
            out.append(tok)
    text = "".join(out)
    if _OR_IGNORE.match(text):
        text = _OR_IGNORE.sub("INSERT INTO", text, count=1)
        ret = _RETURNING.search(text)
        if ret:
            text = text[:ret.start()] + "ON CONFLICT DO NOTHING " + text[ret.start():]
        else:
            text = text.rstrip().rstrip(";") + " ON CONFLICT DO NOTHING"
    return text
