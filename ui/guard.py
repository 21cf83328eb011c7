"""The UI side of the one role check (pipeline.access.AccessPolicy.denial): who is calling, and refuse; and what
every handler reads the same way (a number from a Gradio value, the files of a gr.File, the text of an engine
error).

A hidden tab is not security: every handler that changes something calls `require` on the server.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gradio as gr

from pipeline.access.policy import EVERYONE, AccessPolicy, Reader, Role
from pipeline.services.audit_log import Actor

log = logging.getLogger(__name__)


def request_user(request: Any) -> str | None:
    """The logged-in user of a Gradio request (None without logins or outside a request)."""
    return getattr(request, "username", None) if request is not None else None


def page_actor(request: Any) -> Actor:
    """Who acts through the page, for the audit log."""
    return Actor(request_user(request), "page")


def reader_of(policy: AccessPolicy | None, request: Any) -> Reader:
    """Who reads, for the engine's per-KB read check (everyone when there is no policy: logins off)."""
    return policy.reader(request_user(request)) if policy is not None else EVERYONE


def require(policy: AccessPolicy, request: Any, role: Role) -> None:
    """Raise gr.Error with the role's refusal text unless the caller holds `role`."""
    denied = policy.denial(request_user(request), role)
    if denied:
        log.warning("%s action refused for user %r", role.value, request_user(request))
        raise gr.Error(denied)


def to_int(x: Any, default: int | None = None) -> int | None:
    """A Gradio value (number, numeric text, None) as an int; `default` when it is not one."""
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return default


def file_items(files: Any) -> list[tuple[str, Path]]:
    """(original name, path) from gr.File's raw payload (preprocess=False: FileData dicts) or plain paths."""
    if files is None:
        return []
    if not isinstance(files, (list, tuple)):
        files = [files]
    items = []
    for f in files:
        if isinstance(f, dict):
            path = f.get("path")
            name = f.get("orig_name") or (Path(path).name if path else "")
        else:
            path = getattr(f, "path", None) or str(f)
            name = getattr(f, "orig_name", None) or Path(path).name
        if path:
            items.append((name, Path(path)))
    return items


def error_text(exc: Exception) -> str:
    """What to show of an error: an EngineError's message, else the exception's text."""
    return getattr(exc, "msg", None) or str(exc)


def failure_text(exc: Exception, what: str) -> str:
    """error_text(exc), called inside the `except`: an error without an engine code (a bug, not a refusal) is
    logged with its traceback as "<what> failed" first."""
    if not getattr(exc, "code", None):
        log.exception("%s failed", what)
    return error_text(exc)
