"""Issue 27, availability 2: request bodies are bounded before authentication and before anything reads them.

Before: an unauthenticated 200 MB JSON body cost +600 MB RSS and 16.8 s before its 401, and a 200 MB multipart
upload was spooled in full. Here a real HTTP client (a socket speaking HTTP/1.1, so that it can watch for the
server's answer while it is still sending) streams a 200 MB body at the live app with logins on and counts how
many bytes it got to send before the 413 came back: a small fraction, and the server's RSS does not move.
"""
from __future__ import annotations

import base64
import json
import os
import select
import socket

import pytest

from api.body_limit import JSON_LIMIT, UPLOAD_LIMIT
from pipeline.access.policy import AccessPolicy

TOTAL = 200 * 1024 * 1024
CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from tests.live import LiveApp
    from tests.tiny_engine import tiny_engine, tiny_model

    tmp = tmp_path_factory.mktemp("body")
    app = LiveApp(tiny_engine(tmp / "data", tiny_model(tmp / "tiny")), AccessPolicy.from_args(["alice:pw"], kb_admins=["alice"]))
    try:
        yield app
    finally:
        app.stop(close_engine=True)


def _rss_mb() -> float:  # the app runs in this process (LiveApp serves it from a thread)
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _read_response(sock: socket.socket) -> tuple[int, dict]:
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            break
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    while length is not None and len(body) < length:
        part = sock.recv(65536)
        if not part:
            break
        body += part
    return status, json.loads(body or b"{}")


MULTIPART = "multipart/form-data; boundary=x"
FILE_PART = (b'--x\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
             b"Content-Type: text/plain\r\n\r\n")


ALICE = "Authorization: Basic " + base64.b64encode(b"alice:pw").decode()


def stream_post(port: int, path: str, *, chunked: bool, content_type: str = "application/json",
                total: int = TOTAL, first: bytes = b'{"question": "', auth: str | None = ALICE) -> tuple[int, dict, int]:
    """POST `total` bytes to `path`, watching for the answer before every chunk: (status, JSON body, bytes of
    body sent before the answer came)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Type: {content_type}"]
        head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
        if auth:
            head.append(auth)
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        piece = first + b"a" * (CHUNK - len(first))
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            frame = piece if not chunked else f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            piece = b"a" * CHUNK
        status, body = _read_response(sock)
        return status, body, sent
    finally:
        sock.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_200mb_json_body_refused_before_auth_without_reading_it(live, chunked):
    rss0 = _rss_mb()
    status, body, sent = stream_post(live.port, "/api/qa/ask/sync", chunked=chunked)
    assert status == 413, body
    assert body["code"] == 1001 and "1 MB" in body["msg"] and body["data"]["limit_bytes"] == JSON_LIMIT, body
    # Content-Length: refused on the headers (the socket buffers hold a few MB at most); chunked: the first
    # chunk past 1 MB ends it.
    assert sent < 32 * 1024 * 1024, sent
    assert _rss_mb() - rss0 < 50


def test_huge_upload_refused_on_the_declared_length(live):
    status, body, sent = stream_post(live.port, "/api/kb/documents", chunked=False,
                                     content_type=MULTIPART, total=300 * 1024 * 1024, first=FILE_PART)
    assert status == 413 and body["data"]["limit_bytes"] == UPLOAD_LIMIT
    assert "201 MB" in body["msg"] and sent < 32 * 1024 * 1024


def test_chunked_upload_counted_as_it_arrives(live):
    status, body, sent = stream_post(live.port, "/api/kb/documents", chunked=True,
                                     content_type=MULTIPART, total=260 * 1024 * 1024, first=FILE_PART)
    assert status == 413 and "201 MB" in body["msg"]
    assert UPLOAD_LIMIT <= sent < UPLOAD_LIMIT + 32 * 1024 * 1024


def test_v1_gets_the_openai_error_shape(live):
    status, body, _ = stream_post(live.port, "/v1/chat/completions", chunked=False)
    assert status == 413 and body["error"]["code"] == "request_too_large" and "1 MB" in body["error"]["message"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_unauthenticated_upload_is_refused_before_its_body_is_read(live, chunked):
    rss0 = _rss_mb()
    status, body, sent = stream_post(live.port, "/api/kb/documents", chunked=chunked, content_type=MULTIPART,
                                     total=200 * 1024 * 1024, first=FILE_PART, auth=None)
    assert status == 401 and body["code"] == 4001, body
    assert sent < 32 * 1024 * 1024, sent  # the answer came on the headers (socket buffers hold a few MB)
    assert _rss_mb() - rss0 < 50
    status, body, sent = stream_post(live.port, "/v1/chat/completions", chunked=True, auth="Authorization: Basic "
                                     + base64.b64encode(b"alice:wrong").decode())
    assert status == 401 and body["error"]["code"] == "invalid_api_key" and sent < 32 * 1024 * 1024, body


def test_small_requests_pass(live):
    with live.http() as http:
        r = http.post("/api/qa/ask/sync", json={"question": "客服电话？"})
        assert r.status_code == 401 and r.json()["code"] == 4001  # the login check decides a small body
        r = http.post("/api/kb/documents", auth=("alice", "pw"),
                      files=[("file", ("小.txt", "一个小文件。".encode()))])
        assert r.status_code == 200 and r.json()["data"][0]["ok"], r.json()


def test_gradio_upload_route_has_the_upload_limit(live):
    status, body, sent = stream_post(live.port, "/gradio_api/upload", chunked=False, content_type=MULTIPART,
                                     total=300 * 1024 * 1024, first=FILE_PART)
    assert status == 413 and body["limit_bytes"] == UPLOAD_LIMIT and "201 MB" in body["detail"]
    with live.http() as http:  # a normal file through the UI's upload route still passes
        r = http.post("/gradio_api/upload", auth=("alice", "pw"), files=[("files", ("小.txt", "一个小文件。".encode()))])
        assert r.status_code != 413, r.text
