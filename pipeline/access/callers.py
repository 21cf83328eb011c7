"""Who is calling the HTTP API: the one resolution of an `Authorization` header into a `Caller` (api/ uses it
for every `/api/*` and `/v1/*` request), with the rate limit counted on the way.

- `Authorization: Bearer kbqa-…`: an API key (pipeline/services/api_keys.py). It has a role of its own (never
  more than that) and optionally a list of knowledge bases: a reader key without a list reads the knowledge bases
  open to every logged-in user; a key with a list reads exactly those (an admin granted them); KB-admin and
  admin keys read every knowledge base, or those of their list. What a key stores (conversations through
  /api/qa/ask, feedback) belongs to `key:<key_id>`, apart from every login's own.
- `Authorization: Basic …` with `--auth`: a login, with its role and per-KB readers (pipeline/access/policy.py).
- Nothing (or, while no key exists, any bearer token — clients send placeholders): without `--auth` the app is
  the open local tool (role admin, every knowledge base) — except `/v1`,
  which requires a key once any usable key exists; with `--auth` a login or a key is required.
Rate limits: per key (its own `rate_limit`, else the setting api_rate_limit_per_min) and per login user (the
setting login_rate_limit_per_min, off by default: logins were never limited before).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal

from pipeline.access.policy import DENIED_TEXT, EVERYONE, AccessPolicy, Reader, Role
from pipeline.errors import CODE_AUTH, EngineError
from pipeline.services.api_keys import ApiKeyService
from pipeline.services.login_throttle import LoginThrottle
from pipeline.services.rate_limits import RateLimiter

RANK = {Role.USER: 0, Role.KB_ADMIN: 1, Role.ADMIN: 2}
LOGIN_TEXT = "需要登录：请使用 HTTP Basic 认证，或 API Key（Authorization: Bearer kbqa-…）"
KEY_TEXT = "需要 API Key：请在请求头加 Authorization: Bearer kbqa-…（在 配置 → 开放接口 创建）"
BAD_KEY_TEXT = "API Key 无效、已吊销或已过期"


@dataclass(frozen=True)
class Caller:
    kind: Literal["open", "login", "key"]
    user: str | None          # who owns what the call stores: the login; a key: `key:<key_id>`; open: None
    role: Role
    reader: Reader
    key_id: int | None = None
    key_name: str | None = None

    @property
    def label(self) -> str:
        """Who, for people (lists, the audit log): the user name, `key:<name>`, or 本机."""
        if self.kind == "key":
            return f"key:{self.key_name}"
        return self.user or "本机"

    def allows(self, role: Role) -> bool:
        return RANK[self.role] >= RANK[role]

    def denial(self, role: Role) -> str | None:
        return None if self.allows(role) else DENIED_TEXT[role]


OPEN = Caller("open", None, Role.ADMIN, EVERYONE)


def key_reader(row: dict) -> Reader:
    role = Role(row["role"])
    kb_ids = frozenset(row["kb_ids"]) if row["kb_ids"] is not None else None
    return Reader(None, privileged=role is not Role.USER or kb_ids is not None, kb_ids=kb_ids)


def key_caller(row: dict) -> Caller:
    return Caller("key", f"key:{row['key_id']}", Role(row["role"]), key_reader(row), row["key_id"], row["name"])


class CallerResolver:
    def __init__(self, policy: AccessPolicy, keys: ApiKeyService, limits: RateLimiter,
                 throttle: LoginThrottle | None = None):
        self.policy, self.keys, self.limits, self.throttle = policy, keys, limits, throttle

    def resolve(self, authorization: str | None, *, key_required_if_any: bool = False,
                address: str | None = None) -> Caller:
        """The caller of a request, its request counted; EngineError 4001 (no / bad credentials) or RateLimited.
        `key_required_if_any`: the `/v1` rule (open only while no usable key exists)."""
        scheme, _, value = (authorization or "").strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and value.strip():
            row = self.keys.authenticate(value.strip())
            if row is None:
                if not self.policy.enabled and not self.keys.any_active() and not self.keys.was_issued(value.strip()):
                    return OPEN  # the open local tool: clients send some placeholder key (the SDK requires one)
                raise EngineError(CODE_AUTH, BAD_KEY_TEXT)
            self.limits.check_key(row["key_id"], row["rate_limit"])
            return key_caller(row)
        if not self.policy.enabled:
            if key_required_if_any and self.keys.any_active():
                raise EngineError(CODE_AUTH, KEY_TEXT)
            return OPEN
        if scheme == "basic":
            try:
                user, _, pw = base64.b64decode(value.strip()).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                user, pw = "", ""
            if user and self._login(user, pw, address):
                self.limits.check_login(user)
                role = (Role.ADMIN if self.policy.is_admin(user) else
                        Role.KB_ADMIN if self.policy.is_kb_admin(user) else Role.USER)
                return Caller("login", user, role, self.policy.reader(user))
        raise EngineError(CODE_AUTH, LOGIN_TEXT)

    def _login(self, user: str, pw: str, address: str | None) -> bool:
        """The password check behind the failed-login throttle (RateLimited while locked)."""
        if self.throttle is None:
            return self.policy.check(user, pw)
        return self.throttle.attempt(lambda: self.policy.check(user, pw), user, address)
