"""Who may do what. Kept deliberately simple (documented in README):

- Without `--auth`, the app is a local single-user tool: everyone may do everything (it binds 127.0.0.1).
- With `--auth USER:PASS …`, users log in. `--admin USER` marks settings admins (配置 tab, /api/config*),
  `--kb-admin USER` marks knowledge-base admins (知识库 tab, upload/delete/rebuild). Admins are also KB admins.
  Every logged-in user may ask questions and use the debug search.
- Knowledge bases are open to every logged-in user unless their `readers` list names who may read them; KB
  admins and admins read every knowledge base. `AccessPolicy.reader(user)` is what the engine checks against.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import Enum


class Role(str, Enum):
    """What an action needs. Every logged-in user has USER; ADMIN implies KB_ADMIN."""

    USER = "user"
    KB_ADMIN = "kb_admin"
    ADMIN = "admin"


@dataclass(frozen=True)
class Reader:
    """Who reads: the engine's one per-KB read check (pipeline.engine). `privileged` = KB admin, admin, or logins
    off; a knowledge base with `readers` None is open to every logged-in user."""

    user: str | None = None
    privileged: bool = True
    kb_ids: frozenset[int] | None = None  # an API key's knowledge bases: nothing outside them (None: no such bound)

    @property
    def unrestricted(self) -> bool:
        """Reads every knowledge base (no per-KB check needed)."""
        return self.privileged and self.kb_ids is None

    def may_read(self, kb: dict) -> bool:
        if self.kb_ids is not None and kb.get("kb_id") not in self.kb_ids:
            return False
        readers = kb.get("readers")
        return self.privileged or readers is None or (self.user is not None and self.user in readers)


EVERYONE = Reader()  # scripts, tools, the app without logins


# The one refusal text per role, shown by the UI and returned by the API (code 4003).
DENIED_TEXT = {
    Role.KB_ADMIN: "无权限：仅知识库管理员可以管理知识库",
    Role.ADMIN: "无权限：仅管理员可以查看和修改配置",
}


@dataclass
class AccessPolicy:
    users: dict[str, str] = field(default_factory=dict)  # username → password
    admins: set[str] = field(default_factory=set)
    kb_admins: set[str] = field(default_factory=set)

    @classmethod
    def from_args(cls, auth: list[str] | None, admins: list[str] | None = None,
                  kb_admins: list[str] | None = None) -> "AccessPolicy":
        users = {}
        for item in auth or []:
            if ":" not in item:
                raise ValueError(f"--auth 需要 USER:PASS 形式：{item!r}")
            u, p = item.split(":", 1)
            if not u or not p:
                raise ValueError(f"--auth 用户名和密码都不能为空：{item!r}")
            users[u] = p
        admins_set = set(admins or [])
        unknown = (admins_set | set(kb_admins or [])) - set(users)
        if users and unknown:
            raise ValueError(f"--admin/--kb-admin 指定了不存在的用户：{', '.join(sorted(unknown))}")
        return cls(users, admins_set, set(kb_admins or []) | admins_set)

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, username: str | None, password: str | None) -> bool:
        if not self.enabled:
            return True
        expected = self.users.get(username or "")
        return expected is not None and hmac.compare_digest(expected.encode(), (password or "").encode())

    def is_admin(self, username: str | None) -> bool:
        return not self.enabled or (username in self.admins)

    def is_kb_admin(self, username: str | None) -> bool:
        return not self.enabled or (username in self.kb_admins)

    def allows(self, username: str | None, role: Role) -> bool:
        """The one role check used by ui/ and api/."""
        if role is Role.ADMIN:
            return self.is_admin(username)
        if role is Role.KB_ADMIN:
            return self.is_kb_admin(username)
        return True

    def denial(self, username: str | None, role: Role) -> str | None:
        """None when allowed, else the refusal text for that role."""
        return None if self.allows(username, role) else DENIED_TEXT[role]

    def reader(self, username: str | None) -> Reader:
        return Reader(username, self.is_kb_admin(username))

    def unknown_users(self, names) -> list[str]:
        """Names in a readers list that are not users of this app (empty without logins: nothing to check)."""
        return sorted(set(names or []) - set(self.users)) if self.enabled else []

    def gradio_auth(self):
        """Value for Gradio's `auth=` (None when logins are off)."""
        return self.check if self.enabled else None
