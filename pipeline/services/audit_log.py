"""The audit log: every question through any door (page, REST, OpenAI-compatible, MCP) and every admin action,
with who, which knowledge bases, the outcome, the latency and the documents cited; filtered views and CSV / JSONL
export for admins; rows past the retention (setting audit_retention_days) deleted by the app.

Questions are recorded by `audited`, wrapped around the one answer event stream, so no door can skip it; a
consumer that hangs up is recorded as `aborted`. Admin actions are recorded by the services that perform them.
Writing a row never fails the request it records (a failed write is logged).
"""
from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline import events as ev
from pipeline.errors import CODE_VALIDATION, EngineError
from store.audit_log import AuditFilter, AuditLogStore

log = logging.getLogger(__name__)

DOORS = ("page", "rest", "openai", "mcp", "internal")
OUTCOMES = ("answer", "weak", "refuse", "error", "aborted", "ok")
PURGE_EVERY_S = 3600.0  # retention is applied at most this often, on a write
CSV_COLUMNS = ("entry_id", "time", "actor", "door", "kind", "action", "kb_ids", "question", "outcome",
               "latency_ms", "cited", "detail")


@dataclass(frozen=True)
class Actor:
    """Who acts and through which door, as the audit log records it (`name`: the user, key:<name>, or None for
    the local single-user tool)."""

    name: str | None
    door: str = "internal"


def outcome_of(done: dict) -> str:
    return "refuse" if done.get("no_answer") else "weak" if done.get("weak") else "answer"


class AuditLog:
    def __init__(self, store: AuditLogStore, retention_days: Callable[[], int], clock: Callable[[], float] = time.time):
        self.store = store
        self.retention_days = retention_days
        self.clock = clock
        self._purged_at = 0.0

    # ---- writing
    def _add(self, **row: Any) -> None:
        try:
            now = self.clock()
            self.store.add(at=now, **row)
            if now - self._purged_at >= PURGE_EVERY_S:
                self.purge_expired()
        except Exception:  # the log must never fail what it records
            log.exception("audit log write failed")

    def admin(self, actor: Actor | None, action: str, detail: dict | None = None,
              kb_ids: list[int] | None = None) -> None:
        """An admin action (settings.update, engine.reload, key.create, key.revoke, document.delete, kb.create,
        kb.update, kb.readers, kb.delete, chunk.edit / restore / disable / enable / add / reparse …) by `actor`."""
        a = actor or Actor(None)
        self._add(actor=a.name, door=a.door, kind="admin", action=action, outcome="ok", kb_ids=kb_ids,
                  detail=detail)

    def audited(self, events: Iterator[ev.Event], actor: Actor, searched: list[int], question: str,
                asked: list[int] | None = None) -> Iterator[ev.Event]:
        """`events` passed through unchanged; one row when the stream ends, however it ends. `searched` is filled
        by the stream once it has resolved its scope; a stream refused before that logs the ids `asked` for."""
        t0 = time.perf_counter()
        outcome, cited, detail = "aborted", [], {}
        try:
            for e in events:
                if e.type is ev.EventType.SOURCES:
                    cited = _cited_documents(e.data["sources"])
                elif e.type is ev.EventType.DONE:
                    outcome = outcome_of(e.data)
                    detail = {k: e.data.get(k) for k in ("route", "mode", "conversation_id", "turn_id")
                              if e.data.get(k) is not None}
                    if e.data.get("refusal"):  # refused after the gate let it through (the LLM, the extractive reader)
                        detail["refused_by"] = e.data["refusal"]["by"]
                elif e.type is ev.EventType.ERROR:
                    outcome, detail = "error", {"code": e.data.get("code"), "msg": e.data.get("msg")}
                yield e
        finally:
            events.close()
            self._add(actor=actor.name, door=actor.door, kind="question", action="ask", outcome=outcome,
                      kb_ids=searched or asked, question=question,
                      latency_ms=round((time.perf_counter() - t0) * 1000), cited=cited, detail=detail)

    def purge_expired(self) -> int:
        days = self.retention_days()
        self._purged_at = self.clock()
        if days <= 0:
            return 0
        n = self.store.purge(self._purged_at - days * 86400.0)
        if n:
            log.info("audit log: %d entries older than %d days deleted", n, days)
        return n

    # ---- reading (admins)
    def list(self, page: int = 1, size: int = 50, **filters: Any) -> dict:
        f = audit_filter(**filters)
        if not (isinstance(page, int) and page >= 1 and isinstance(size, int) and 1 <= size <= 500):
            raise EngineError(CODE_VALIDATION, "page 须 ≥ 1，size 须在 1–500 之间", "page")
        items, total = self.store.page(f, page, size)
        return {"items": [_with_time(r) for r in items], "total": total, "page": page, "size": size}

    def export(self, fmt: str = "jsonl", **filters: Any) -> str:
        """Every matching row, oldest first, as JSON lines or CSV (UTF-8 with a BOM so spreadsheets read 中文)."""
        rows = (_with_time(r) for r in self.store.iterate(audit_filter(**filters)))
        if fmt == "jsonl":
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        if fmt != "csv":
            raise EngineError(CODE_VALIDATION, "format 只能是 jsonl 或 csv", "format")
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([",".join(map(str, r["kb_ids"])) if c == "kb_ids" else
                        json.dumps(r[c], ensure_ascii=False) if c in ("cited", "detail") else r.get(c)
                        for c in CSV_COLUMNS])
        return "\ufeff" + out.getvalue()


def audit_filter(actor: str | None = None, door: str | None = None, kind: str | None = None,
                 outcome: str | None = None, kb_id: int | None = None, since: str | float | None = None,
                 until: str | float | None = None) -> AuditFilter:
    if door and door not in DOORS:
        raise EngineError(CODE_VALIDATION, f"door 只能是 {' / '.join(DOORS)}", "door")
    if outcome and outcome not in OUTCOMES:
        raise EngineError(CODE_VALIDATION, f"outcome 只能是 {' / '.join(OUTCOMES)}", "outcome")
    if kind and kind not in ("question", "admin"):
        raise EngineError(CODE_VALIDATION, "kind 只能是 question 或 admin", "kind")
    return AuditFilter(actor or None, door or None, kind or None, outcome or None, kb_id,
                       _epoch(since, "since"), _epoch(until, "until", end_of_day=True))


def _epoch(value: str | float | None, field: str, end_of_day: bool = False) -> float | None:
    """Seconds since the epoch from a number or an ISO date / date-time (local time); a bare `until` date
    includes that whole day."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    from datetime import datetime, timedelta

    try:
        t = datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise EngineError(CODE_VALIDATION, f"{field} 不是合法的日期（如 2026-12-01 或 2026-12-01T08:00）",
                          field) from None
    if end_of_day and len(str(value).strip()) == 10:
        t += timedelta(days=1)
    return t.timestamp()


def _with_time(r: dict) -> dict:
    from datetime import datetime

    return {**r, "time": datetime.fromtimestamp(r["at"]).isoformat(sep=" ", timespec="seconds")}


def _cited_documents(sources: list[dict]) -> list[dict]:
    seen: dict[Any, dict] = {}
    for s in sources:
        if s.get("cited") and s.get("doc_id") not in seen:
            seen[s.get("doc_id")] = {"doc_id": s.get("doc_id"), "doc_name": s.get("doc_name")}
    return list(seen.values())
