"""Error codes shared by the answer event stream and the REST envelope, and the engine's error type.

1001 validation (field named) · 2001 LLM failure · 2002 engine loading/reloading/busy · 3001 parse failure ·
3002 no such document / conversation / entry · 4001 login required · 4003 not yours / not allowed.
"""
from __future__ import annotations

from pipeline.events import CODE_ENGINE, CODE_LLM, CODE_NO_DOC, CODE_PARSE, CODE_VALIDATION  # noqa: F401

CODE_AUTH = 4001
CODE_FORBIDDEN = 4003


class EngineError(Exception):
    """An error with a REST/event code (1001 validation, 2002 engine, 3002 no such document…)."""

    def __init__(self, code: int, msg: str, field: str | None = None):
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.field = field
