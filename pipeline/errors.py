"""Every error code of the app in one place: the answer event stream, the REST envelope and the UI use these.

1xxx bad input · 2xxx engine / LLM · 3xxx documents · 4xxx login and roles.
"""
from __future__ import annotations

CODE_VALIDATION = 1001  # a field is missing, of the wrong type or out of range (the field is named)
CODE_LLM = 2001         # the LLM call failed (auth, timeout, refused, cut off …)
CODE_ENGINE = 2002      # engine loading / reloading / busy (rebuild) / not ready
CODE_PARSE = 3001       # a document could not be parsed
CODE_NO_DOC = 3002      # no such document
CODE_AUTH = 4001        # login required
CODE_FORBIDDEN = 4003   # logged in, but the role does not allow it
CODE_RATE_LIMIT = 4029  # too many requests from this key / login this minute (HTTP 429 with Retry-After)


class EngineError(Exception):
    """An error with a REST/event code; `field` names the offending input for 1001."""

    def __init__(self, code: int, msg: str, field: str | None = None):
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.field = field


class RateLimited(EngineError):
    """Over the per-minute request limit: `retry_after` whole seconds until the window ends (HTTP Retry-After)."""

    def __init__(self, msg: str, retry_after: int):
        super().__init__(CODE_RATE_LIMIT, msg)
        self.retry_after = retry_after
