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


def test_saving_such_an_llm_url_is_refused_and_a_stored_one_is_not_used(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from pipeline.generation.llm_client import build_llm
    from pipeline.settings import SettingsError
    from tests.tiny_engine import tiny_engine, tiny_model

    real = socket.getaddrinfo
    monkeypatch.setattr(llm_target.socket, "getaddrinfo", lambda host, *a, **kw: (
        [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))] if host == "llm.example.test"
        else real(host, *a, **kw)))
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        for url in ("http://169.254.169.254/v1", "http://llm.example.test/v1", "http://metadata.google.internal/v1"):
            with pytest.raises(SettingsError) as exc:
                engine.update_settings({"llm_api_url": url, "llm_model": "m"})
            assert "llm_api_url" in exc.value.errors and "不允许连接" in exc.value.errors["llm_api_url"]
            assert engine.check_settings({"llm_api_url": url}).get("llm_api_url")  # the tab marks it red
        assert engine.settings.llm_api_url == ""  # nothing saved
        engine.update_settings({"llm_api_url": "http://127.0.0.1:9/v1", "llm_model": "m"})  # loopback is fine
    finally:
        engine.close()
    stored = SimpleNamespace(llm_api_url="http://169.254.169.254/v1", llm_model="m", llm_api_key="", llm_timeout=5,
                             llm_temperature=0.3)
    assert build_llm(stored) is None  # saved before the check existed: answers stay extractive
