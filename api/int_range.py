"""Integers in REST paths and queries beyond what the database can hold (issue 27: an id or page number ≥ 2^63
gave HTTP 500 — SQLite and PostgreSQL integers are 64-bit signed, and the driver's OverflowError surfaced as an
internal error).

An ASGI middleware in front of the API: for the route a request matches, every int-typed path or query
parameter whose value is an integer literal outside the signed 64-bit range is answered before the route runs:
a path id as the resource not existing (3002, the same wording the services use), a query parameter as a
validation error (1001) naming it and the range. Everything else passes untouched (FastAPI still validates
types and bounds as declared).
"""
from __future__ import annotations

import json
import re
import types
import typing
from urllib.parse import parse_qsl

from pipeline.errors import CODE_NO_DOC, CODE_VALIDATION

INT64_MAX = 2**63 - 1
_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_NOT_FOUND = {"doc_id": "文档不存在", "kb_id": "知识库不存在", "conv_id": "会话不存在", "qa_id": "已核实问答不存在",
              "fb_id": "反馈不存在", "turn_id": "回答记录不存在"}


def _is_int_typed(annotation) -> bool:
    if annotation is int:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return int in typing.get_args(annotation)
    return False


def _out_of_range(value: str) -> bool:
    return bool(_INT.match(value)) and not (-INT64_MAX - 1 <= int(value) <= INT64_MAX)


class IntRange:
    def __init__(self, app, api):
        self.app = app
        self.api = api  # the FastAPI app whose routes say which parameters are integers
        self._params: dict[int, tuple[list, dict]] = {}  # id(route) → (int path params, int query params by alias)

    def _int_params(self, route) -> tuple[list, dict]:
        got = self._params.get(id(route))
        if got is None:
            path, query, todo = [], [], [route.dependant]  # the endpoint's and its dependencies' parameters
            while todo:
                d = todo.pop()
                path += [p for p in d.path_params if _is_int_typed(p.field_info.annotation)]
                query += [p for p in d.query_params if _is_int_typed(p.field_info.annotation)]
                todo += d.dependencies
            got = (path, {p.alias: p for p in query})
            self._params[id(route)] = got
        return got

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path", "").startswith("/api/"):
            refusal = self._check(scope)
            if refusal is not None:
                return await _send(send, *refusal)
        return await self.app(scope, receive, send)

    def _check(self, scope) -> tuple[int, dict] | None:
        from starlette.routing import Match

        for route in self.api.router.routes:
            if getattr(route, "dependant", None) is None:
                continue
            match, child = route.matches(scope)
            if match != Match.FULL:
                continue
            int_path, ints = self._int_params(route)
            path_params = child.get("path_params", {})
            for p in int_path:
                value = str(path_params.get(p.alias, ""))
                if _out_of_range(value):
                    what = _NOT_FOUND.get(p.name, f"{p.name} 对应的对象不存在")
                    return 404, {"code": CODE_NO_DOC, "msg": f"{what}：{value[:40]}", "data": {"field": p.name}}
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            for name, value in query:
                if name in ints and _out_of_range(value):
                    return 400, {"code": CODE_VALIDATION, "msg": f"参数 {name} 超出范围（整数，绝对值小于 2^63）",
                                 "data": {"field": name}}
            return None
        return None


async def _send(send, status: int, body: dict) -> None:
    raw = json.dumps(body, ensure_ascii=False).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})
