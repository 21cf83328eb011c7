"""A scripted OpenAI-compatible HTTP server for tests (real sockets, real SSE, 127.0.0.1, random port).

    srv = FakeLLMServer().start()      # or the `fake_llm` pytest fixture (tests/conftest.py)
    srv.base_url                       # "http://127.0.0.1:PORT/v1"
    srv.mode = "normal"                # see MODES
    srv.reply = "答案是 X[1]。"         # normal mode text (split into small deltas; brackets get their own delta)
    srv.chunks = ["a", "[", "1", "]"]  # or the exact deltas to stream (overrides reply)
    srv.responder = fn                 # or fn(request body) → reply text, per request (overrides both)
    srv.requests                       # [{"method", "path", "headers", "body"}] of every request
    srv.sent_chunks                    # content chunks actually written to streams (stops on client hang-up)
    srv.stop()

Routes: POST /v1/chat/completions (stream and non-stream), GET /v1/models.
Streams use HTTP/1.1 chunked transfer encoding, `data: {...}\\n\\n` frames and a final `data: [DONE]`.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = (
    "normal",     # stream/return the reply, finish_reason "stop"
    "auth",       # 401 invalid_api_key
    "ratelimit",  # 429 rate_limit_exceeded
    "slow",       # sleep `slow_seconds` (default 5) before answering — longer than the client timeout
    "drop",       # send the first `drop_after` chunks, then close the socket mid-chunked-body
    "eof",        # send some chunks, then end the body cleanly but without finish_reason / [DONE]
    "invent",     # cite [9] with "[", "9", "]" in separate chunks (plus a valid [1])
    "notfound",   # 404 model_not_found
    "error",      # 500 internal error
    "sse_error",  # some chunks, then an SSE `data: {"error": …}` frame
)

DEFAULT_REPLY = "根据资料，退货期限为 7 天[1]。"
INVENT_CHUNKS = ["根据资料，", "答案是甲", "[", "9", "]", "，另见", "[1", "]", "。"]
DEFAULT_MODEL = "fake-model"


def split_reply(text: str, size: int = 3) -> list[str]:
    """Split text into small deltas; every bracket character becomes its own delta."""
    out: list[str] = []
    for part in re.split(r"([\[\]【】])", text):
        if not part:
            continue
        if part in "[]【】":
            out.append(part)
        else:
            out.extend(part[i:i + size] for i in range(0, len(part), size))
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # --- plumbing ------------------------------------------------------------------------------------------------
    def _record(self, body: Any) -> None:
        fake = self.server.fake
        with fake.lock:
            fake.requests.append({
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            })

    def _send_json(self, status: int, payload: dict, extra_headers: dict | None = None) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _error(self, status: int, message: str, etype: str, code: str, extra_headers: dict | None = None):
        self._send_json(status, {"error": {"message": message, "type": etype, "param": None, "code": code}},
                        extra_headers)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _sse(self, obj: Any) -> None:
        text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        self._write_chunk(f"data: {text}\n\n".encode())

    # --- routes --------------------------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        self._record(None)
        fake = self.server.fake
        if self.path.rstrip("/") != "/v1/models":
            return self._error(404, f"Not found: {self.path}", "invalid_request_error", "not_found")
        if fake.mode == "auth":
            return self._auth_error()
        self._send_json(200, {"object": "list", "data": [
            {"id": fake.model_name, "object": "model", "created": 0, "owned_by": "fake"}]})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        self._record(body)
        fake = self.server.fake
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(404, f"Not found: {self.path}", "invalid_request_error", "not_found")
        mode = fake.mode
        model = (body or {}).get("model", "")
        if mode == "auth":
            return self._auth_error()
        if mode == "ratelimit":
            return self._error(429, "Rate limit reached for requests", "requests", "rate_limit_exceeded")
        if mode == "error":
            return self._error(500, "The server had an error while processing your request.", "server_error",
                               "internal_error")
        if mode == "notfound" or (fake.strict_model and model != fake.model_name):
            return self._error(404, f"The model `{model}` does not exist or you do not have access to it.",
                               "invalid_request_error", "model_not_found")
        if mode == "slow":
            if fake.stop_event.wait(fake.slow_seconds):
                return
        chunks = INVENT_CHUNKS if mode == "invent" else fake.deltas(body)
        try:
            if (body or {}).get("stream"):
                self._stream(chunks, model or fake.model_name, mode)
            else:
                self._complete("".join(chunks), model or fake.model_name)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client gave up (e.g. it timed out first)
            with fake.lock:
                fake.hangups += 1

    def _auth_error(self) -> None:
        self._error(401, "Incorrect API key provided: sk-****. You can find your API key at the dashboard.",
                    "invalid_request_error", "invalid_api_key")

    def _complete(self, text: str, model: str) -> None:
        self._send_json(200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    def _stream(self, chunks: list[str], model: str, mode: str) -> None:
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def frame(delta: dict, finish: str | None = None) -> dict:
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        self._sse(frame({"role": "assistant", "content": ""}))
        for i, piece in enumerate(chunks):
            if mode == "drop" and i >= fake.drop_after:
                # abrupt close in the middle of the chunked body: no terminating 0-chunk
                self.wfile.flush()
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.close_connection = True
                return
            if mode == "sse_error" and i >= fake.drop_after:
                self._sse({"error": {"message": "upstream model crashed", "type": "server_error"}})
                break
            self._sse(frame({"content": piece}))
            with fake.lock:
                fake.sent_chunks += 1
            if fake.chunk_delay:
                time.sleep(fake.chunk_delay)
        if mode != "eof":
            self._sse(frame({}, "stop"))
            self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: "FakeLLMServer"

    def handle_error(self, request, client_address) -> None:
        # Clients that hang up mid-stream (timeouts, disconnect tests) are expected: no traceback noise.
        pass


class FakeLLMServer:
    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.mode = "normal"
        self.reply = DEFAULT_REPLY
        self.chunks: list[str] | None = None
        self.responder: Callable[[dict], str] | None = None  # request body → reply text (overrides reply/chunks)
        self.model_name = DEFAULT_MODEL
        self.strict_model = False    # True: a chat request for another model name → 404 model_not_found
        self.slow_seconds = 5.0
        self.drop_after = 3          # chunks sent before "drop" / "eof" / "sse_error" strike
        self.chunk_delay = 0.0
        self.requests: list[dict] = []
        self.sent_chunks = 0         # content chunks written to streams so far (all requests)
        self.hangups = 0             # responses cut short because the client closed the connection
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---
    def start(self) -> "FakeLLMServer":
        self._httpd = _Server((self.host, 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- views ---
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def deltas(self, body: Any = None) -> list[str]:
        if self.responder is not None and body is not None:
            return split_reply(self.responder(body))
        return list(self.chunks) if self.chunks is not None else split_reply(self.reply)

    @property
    def chat_requests(self) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"].rstrip("/").endswith("/chat/completions")]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.sent_chunks = 0
            self.hangups = 0
