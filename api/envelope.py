"""What the /api routers share: the request body base, the envelope of an answer, the role check of a route, an
upload read to disk."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import UploadFile
from pydantic import BaseModel, ConfigDict

from pipeline.access.callers import Caller
from pipeline.access.policy import Role
from pipeline.errors import CODE_FORBIDDEN, EngineError


class Body(BaseModel):
    """A request body: extra keys are refused, so a typo is reported rather than ignored."""
    model_config = ConfigDict(extra="forbid")


def ok(data: Any = None) -> dict:
    return {"code": 0, "msg": "ok", "data": data}


def require(caller: Caller, role: Role) -> Caller:
    """The caller, when it holds `role`; else 4003 with the role's refusal text."""
    denied = caller.denial(role)
    if denied:
        raise EngineError(CODE_FORBIDDEN, denied)
    return caller


async def save_upload(file: UploadFile, dest: Path, limit: int) -> bool:
    """Stream the upload into `dest` 1 MiB at a time; False as soon as it passes `limit` bytes (dest cut short)."""
    size = 0
    with open(dest, "wb") as out:
        while chunk := await file.read(1 << 20):
            size += len(chunk)
            if size > limit:
                return False
            out.write(chunk)
    return True
