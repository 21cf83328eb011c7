"""测试连接 (/api/config/test-llm) refuses link-local and cloud-metadata targets — by name and by what the resolver
answers — and relays at most a short excerpt of an upstream error body (issue 27, smaller items).

No traffic to those ranges: the refusals happen before any request (a stubbed resolver stands in for a DNS name
that points there); the long-body case uses a real HTTP server on 127.0.0.1.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.generation import llm_target
from pipeline.generation.llm_client import UPSTREAM_EXCERPT
from pipeline.generation.llm_client import test_llm_connection as check_connection


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/v1", "http://169.254.10.1:8080/v1", "http://[fd00:ec2::254]/v1",
    "http://[fe80::1]/v1", "http://[::ffff:169.254.169.254]/v1", "http://metadata.google.internal/v1",
    "https://METADATA.google.internal./computeMetadata/v1",
])
def test_link_local_and_metadata_refused(url):
    t0 = time.perf_counter()
    ok, msg = check_connection(url, "m", "k", timeout=2)
    assert not ok and "不允许连接" in msg, msg
    assert time.perf_counter() - t0 < 1.0  # refused before any connection attempt


def test_a_name_resolving_there_is_refused(monkeypatch):
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if host == "llm.example.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))]
        return real(host, *a, **kw)

    monkeypatch.setattr(llm_target.socket, "getaddrinfo", fake)
    ok, msg = check_connection("http://llm.example.test/v1", "m", "k", timeout=2)
    assert not ok and "169.254.169.254" in msg, msg
    assert llm_target.refused_target("http://127.0.0.1:9/v1") is None


class _Verbose(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"error": {"message": "x" * 3000 + "SECRET-TAIL", "type": "invalid_request_error"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_upstream_body_is_only_excerpted():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Verbose)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        ok, msg = check_connection(f"http://127.0.0.1:{srv.server_address[1]}/v1", "m", "k", timeout=5)
    finally:
        srv.shutdown()
        srv.server_close()
    assert not ok and "SECRET-TAIL" not in msg and len(msg) < UPSTREAM_EXCERPT + 100, msg
