"""The running app's REST API for the ops CLIs (audit, repair, backup): only the app can pause its own writes.

Credentials for an app started with --auth: --user, and the password from --password or $KBQA_PASSWORD.
"""
from __future__ import annotations

import argparse
import os

import httpx

DEFAULT_URL = "http://127.0.0.1:7860"


class AppError(RuntimeError):
    def __init__(self, code: int, msg: str):
        super().__init__(f"[{code}] {msg}")
        self.code = code
        self.msg = msg


def add_app_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--url", default=DEFAULT_URL, help=f"the running app (default {DEFAULT_URL})")
    ap.add_argument("--user", default=None, help="login of an admin when the app runs with --auth")
    ap.add_argument("--password", default=None, help="its password (or set KBQA_PASSWORD)")


def call(args: argparse.Namespace, method: str, path: str, timeout: float = 3600, **kw):
    """One API call; returns the envelope's data or raises AppError (connection failures as code -1)."""
    auth = (args.user, args.password or os.environ.get("KBQA_PASSWORD", "")) if args.user else None
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, auth=auth, timeout=timeout, **kw)
    except httpx.HTTPError as exc:
        raise AppError(-1, f"无法连接应用 {args.url}：{exc}（应用未运行时请用 --data-dir 离线执行）") from None
    try:
        body = r.json()
    except ValueError:
        raise AppError(r.status_code, f"应用返回了非 JSON 响应（HTTP {r.status_code}）") from None
    if body.get("code") != 0:
        raise AppError(body.get("code", r.status_code), body.get("msg", ""))
    return body.get("data")
