"""Exceptions of the parsing package. `reason` is a short Chinese sentence shown to the user as-is."""
from __future__ import annotations


class _ReasonError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason  # str(exc) is the reason too (the one argument)


class UploadRefused(_ReasonError):
    """The upload is refused before anything is stored (type, size, empty)."""


class ParseError(_ReasonError):
    """The file was accepted but cannot be turned into text; `reason` becomes the document's fail_reason."""
