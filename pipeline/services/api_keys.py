"""API keys: create (the secret is returned this once), list, revoke, and the check of a presented secret.

The secret is `kbqa-` + 32 random bytes (urlsafe base64): high entropy, so a plain sha256 is a sufficient hash
(no salt or slow KDF needed — nothing to brute-force). The database keeps the hash and a display prefix only;
the secret is never logged, never listed and never part of health, exports or backups (it is nowhere to copy).
Revocation and expiry are read from the database on every request (`authenticate`), so a key revoked in one
process fails at once in every other; `any_active` (does /v1 need a key?) is cached for at most a second.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
import time
from datetime import datetime
from typing import Any

from pipeline.access.policy import Role
from pipeline.errors import CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.services.audit_log import Actor, AuditLog
from store.api_keys import ApiKeyStore

SECRET_PREFIX = "kbqa-"
DISPLAY_CHARS = 12  # "kbqa-" + 7 characters: enough to tell keys apart in a list, far too few to guess the rest
TOUCH_EVERY_S = 60.0  # last_used_at is written at most once a minute per key (not a write per request)
ANY_ACTIVE_TTL_S = 1.0
MAX_NAME = 50

# The API's role names ↔ pipeline.access.policy.Role
ROLE_NAMES = {"reader": Role.USER, "kb-admin": Role.KB_ADMIN, "admin": Role.ADMIN}
ROLE_OF_NAME = {**ROLE_NAMES, "user": Role.USER, "kb_admin": Role.KB_ADMIN}
NAME_OF_ROLE = {r: n for n, r in ROLE_NAMES.items()}


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def _expiry(expires_at: Any, expires_in_days: Any) -> float | None:
    if expires_at is not None and expires_in_days is not None:
        raise EngineError(CODE_VALIDATION, "expires_at 与 expires_in_days 只能给一个", "expires_at")
    if expires_in_days is not None:
        if isinstance(expires_in_days, bool) or not isinstance(expires_in_days, (int, float)) \
                or not 0 < expires_in_days <= 3650:
            raise EngineError(CODE_VALIDATION, "expires_in_days 必须在 0–3650 之间", "expires_in_days")
        return time.time() + float(expires_in_days) * 86400
    if expires_at is None:
        return None
    try:
        ts = datetime.fromisoformat(str(expires_at)).timestamp()
    except ValueError:
        raise EngineError(CODE_VALIDATION, "expires_at 必须是 ISO 8601 时间，例如 2027-01-31T18:00:00",
                          "expires_at") from None
    if ts <= time.time():
        raise EngineError(CODE_VALIDATION, "expires_at 必须是将来的时间", "expires_at")
    return ts


def public(row: dict, now: float | None = None) -> dict:
    """A key as lists show it: never the secret or its hash."""
    now = time.time() if now is None else now
    expired = row["expires_at"] is not None and row["expires_at"] <= now
    return {"key_id": row["key_id"], "name": row["name"], "role": NAME_OF_ROLE[Role(row["role"])],
            "kb_ids": row["kb_ids"], "prefix": row["prefix"], "rate_limit": row["rate_limit"],
            "expires_at": _iso(row["expires_at"]), "created_by": row["created_by"], "created_at": row["created_at"],
            "last_used_at": row["last_used_at"], "revoked": row["revoked_at"] is not None,
            "revoked_at": row["revoked_at"], "expired": expired,
            "active": row["revoked_at"] is None and not expired}


class ApiKeyService:
    def __init__(self, store: ApiKeyStore, check_kb, audit: AuditLog):
        self.store = store
        self.audit = audit
        self.check_kb = check_kb  # kb_id → kb_id, EngineError 3002 when it does not exist
        self._active: tuple[float, bool] | None = None
        self._lock = threading.Lock()
        self._touched: dict[int, float] = {}

    def create(self, name: Any, role: Any = "reader", kb_ids: Any = None, *, expires_at: Any = None,
               expires_in_days: Any = None, rate_limit: Any = None, created_by: str | None = None,
               actor: Actor | None = None) -> dict:
        """A new key: its public fields plus `secret`, the only time the secret is handed out."""
        name = " ".join(name.split()) if isinstance(name, str) else ""
        if not name or len(name) > MAX_NAME:
            raise EngineError(CODE_VALIDATION, f"名称不能为空且最多 {MAX_NAME} 字", "name")
        if role not in ROLE_OF_NAME:
            raise EngineError(CODE_VALIDATION, "role 必须是 reader、kb-admin 或 admin", "role")
        if kb_ids is not None:
            if not isinstance(kb_ids, list) or not kb_ids:
                raise EngineError(CODE_VALIDATION, "kb_ids 必须是知识库 id 的非空列表，或 null（全部）", "kb_ids")
            kb_ids = sorted({self.check_kb(k) for k in kb_ids})
        if rate_limit is not None and (isinstance(rate_limit, bool) or not isinstance(rate_limit, int)
                                       or not 0 <= rate_limit <= 100000):
            raise EngineError(CODE_VALIDATION, "rate_limit 必须是 0–100000 的整数（每分钟请求数，0 = 不限）",
                              "rate_limit")
        expiry = _expiry(expires_at, expires_in_days)
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        row = self.store.create(name=name, role=ROLE_OF_NAME[role].value, kb_ids=kb_ids,
                                secret_hash=hash_secret(secret), prefix=secret[:DISPLAY_CHARS],
                                rate_limit=rate_limit, expires_at=expiry, created_by=created_by)
        self._active = None
        self.audit.admin(actor, "key.create", {"key_id": row["key_id"], "name": name, "role": role,
                                               "prefix": row["prefix"]}, kb_ids)  # never the secret
        return {**public(row), "secret": secret}

    def list(self) -> list[dict]:
        now = time.time()
        return [public(r, now) for r in self.store.list()]

    def revoke(self, key_id: Any, actor: Actor | None = None) -> dict:
        if isinstance(key_id, bool) or not isinstance(key_id, int) or self.store.get(key_id) is None:
            raise EngineError(CODE_NO_DOC, f"API Key 不存在：{key_id}", "key_id")
        self.store.revoke(key_id)
        self._active = None
        row = self.store.get(key_id)
        self.audit.admin(actor, "key.revoke", {"key_id": key_id, "name": row["name"], "prefix": row["prefix"]})
        return public(row)

    def authenticate(self, secret: str) -> dict | None:
        """The active key row of a presented secret (never the hash), or None: unknown, revoked or expired."""
        if not secret.startswith(SECRET_PREFIX):
            return None
        row = self.store.by_hash(hash_secret(secret))
        now = time.time()
        if row is None or row["revoked_at"] is not None or (row["expires_at"] is not None
                                                           and row["expires_at"] <= now):
            return None
        if now - self._touched.get(row["key_id"], 0.0) >= TOUCH_EVERY_S:
            self._touched[row["key_id"]] = now
            self.store.touch(row["key_id"])
        return row

    def was_issued(self, secret: str) -> bool:
        """A secret of a key this app issued, whatever its state now: a revoked or expired key is refused even
        while no usable key exists (only unknown placeholder tokens pass then)."""
        return secret.startswith(SECRET_PREFIX) and self.store.by_hash(hash_secret(secret)) is not None

    def any_active(self) -> bool:
        """Is there any usable key (then /v1 requires one)? Cached for at most a second."""
        now = time.monotonic()
        cached = self._active
        if cached is not None and now - cached[0] < ANY_ACTIVE_TTL_S:
            return cached[1]
        value = self.store.any_active(time.time())
        with self._lock:
            self._active = (now, value)
        return value
