"""Browser-side answer history (F4): pure functions over the list kept in a `gr.BrowserState` (localStorage).

The stored value is a list of records, newest first. A record is
`{id, user, question, answer, sources, trace, elapsed_ms, time, ts, no_answer, mode}`. With logins on, several
users may share one browser: each record carries its user and every function here only sees / changes the
caller's own records; at most MAX_RECORDS per user are kept. The value comes back from the browser, so it is
treated as untrusted input (types checked here, everything HTML-escaped when rendered).
"""
from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

MAX_RECORDS = 50
STORAGE_VERSION = "v1"


def storage_key(data_dir: Any) -> str:
    """localStorage key: stable for one data dir, so two apps on the same origin don't mix histories."""
    h = hashlib.sha256(str(data_dir).encode("utf-8")).hexdigest()[:10]
    return f"kbqa-history-{STORAGE_VERSION}-{h}"


def storage_secret(data_dir: Any) -> str:
    """Stable across restarts (else the browser could no longer decrypt its history after a restart).

    Gradio's BrowserState encrypts in the browser with a secret it sends in the page config, so this is
    tamper-obfuscation, not confidentiality; deterministic is enough and needs no file of its own.
    """
    return hashlib.sha256(f"kbqa-history-secret|{data_dir}".encode()).hexdigest()[:32]


def _records(state: Any) -> list[dict]:
    if not isinstance(state, list):
        return []
    return [r for r in state if isinstance(r, dict) and isinstance(r.get("id"), str)]


def user_key(username: str | None) -> str:
    return username or ""


def for_user(state: Any, username: str | None) -> list[dict]:
    u = user_key(username)
    return [r for r in _records(state) if (r.get("user") or "") == u]


def make_record(question: str, answer: str, sources: list | None, trace: dict | None, elapsed_ms: Any,
                username: str | None, no_answer: bool = False, mode: str | None = None,
                now: float | None = None) -> dict:
    now = time.time() if now is None else now
    return {
        "id": uuid.uuid4().hex[:12], "user": user_key(username), "question": question, "answer": answer,
        "sources": list(sources or []), "trace": trace or {}, "elapsed_ms": elapsed_ms,
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)), "ts": now,
        "no_answer": bool(no_answer), "mode": mode,
    }


def add(state: Any, record: dict, limit: int = MAX_RECORDS) -> list[dict]:
    """New list with `record` first; the record's user keeps at most `limit` records."""
    recs = [record] + [r for r in _records(state) if r.get("id") != record["id"]]
    out, mine = [], 0
    for r in recs:
        if (r.get("user") or "") == record.get("user", ""):
            mine += 1
            if mine > limit:
                continue
        out.append(r)
    return out


def find(state: Any, rec_id: Any, username: str | None) -> dict | None:
    for r in for_user(state, username):
        if r["id"] == rec_id:
            return r
    return None


def delete(state: Any, rec_id: Any, username: str | None) -> list[dict]:
    u = user_key(username)
    return [r for r in _records(state) if not (r["id"] == rec_id and (r.get("user") or "") == u)]


def clear(state: Any, username: str | None) -> list[dict]:
    u = user_key(username)
    return [r for r in _records(state) if (r.get("user") or "") != u]


def choices(state: Any, username: str | None) -> list[tuple[str, str]]:
    from .render import history_label

    recs = sorted(for_user(state, username), key=lambda r: -float(r.get("ts") or 0))
    return [(history_label(r), r["id"]) for r in recs]
