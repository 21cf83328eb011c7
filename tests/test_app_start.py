"""`python app.py` starts on a temp data dir, binds 127.0.0.1, serves the page and the API."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.live import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # each test starts `python app.py` (imports gradio + llama-index); the first loads e5

ROOT = Path(__file__).resolve().parents[1]




def test_app_starts_and_serves_locally(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "app.py", "--data-dir", str(tmp_path / "data"), "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 120
        url = None
        lines = []
        while time.time() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if f"http://127.0.0.1:{port}/" in line:
                url = f"http://127.0.0.1:{port}"
                break
            if proc.poll() is not None:
                break
        assert url, "".join(lines)
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
        # the engine loads in the background; health says loading, then ready
        def health_once_ready():
            h = httpx.get(url + "/api/health", timeout=10).json()["data"]
            return h if h["engine"] == "ready" else None

        h = wait_until(health_once_ready, 120, 0.5, "the engine to load (health: ready)")
        assert h["engine"] == "ready" and h["chunks"] == 0
        assert "multilingual-e5-small" in h["embedding_model"]
        # bound to loopback only: every listening socket on our port is 127.0.0.1 (from /proc, no tools needed)
        listening = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    listening.add(addr)
        assert listening == {"0100007F"}, listening  # 127.0.0.1, little-endian hex
        assert (tmp_path / "data" / "app.db").exists() and (tmp_path / "data" / "chroma").is_dir()
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_share_without_auth_is_refused(tmp_path):
    r = subprocess.run([sys.executable, "app.py", "--share", "--data-dir", str(tmp_path / "d"), "--port",
                        str(free_port())], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--auth" in r.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was written


def test_bad_auth_argument_is_refused(tmp_path):
    r = subprocess.run([sys.executable, "app.py", "--auth", "nopassword", "--data-dir", str(tmp_path / "d"),
                        "--port", str(free_port())],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "USER:PASS" in r.stderr
