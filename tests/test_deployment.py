"""Where the state lives: flags vs environment, clear refusals of bad addresses, and an app that cannot reach its
configured servers stops with a message naming them (no traceback)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.ops.deployment import DEFAULT_LEASE_S, Deployment
from tests.live import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_embedded_is_the_default():
    d = Deployment.from_sources(env={})
    assert d == Deployment() and not d.shared and d.ingest_lease_s == DEFAULT_LEASE_S


def test_flags_win_over_environment(tmp_path):
    env = {"DATABASE_URL": "postgresql://env@127.0.0.1/a", "CHROMA_URL": "http://127.0.0.1:1",
           "KBQA_FILES_DIR": str(tmp_path / "env"), "KBQA_INGEST_LEASE_S": "30"}
    from_env = Deployment.from_sources(env=env)
    assert from_env.database_url == env["DATABASE_URL"] and from_env.chroma_url == env["CHROMA_URL"]
    assert from_env.files_dir == tmp_path / "env" and from_env.ingest_lease_s == 30 and from_env.shared
    flags = Deployment.from_sources("postgresql://flag@127.0.0.1/b", "http://127.0.0.1:2/kb", tmp_path / "flag", 9,
                                    env=env)
    assert (flags.database_url, flags.chroma_url, flags.files_dir, flags.ingest_lease_s) == \
        ("postgresql://flag@127.0.0.1/b", "http://127.0.0.1:2/kb", tmp_path / "flag", 9)


@pytest.mark.parametrize("kw,message", [
    ({"database_url": "mysql://u@h/db"}, "数据库地址无效"),
    ({"database_url": "app.db"}, "数据库地址无效"),
    ({"chroma_url": "127.0.0.1:8000"}, "Chroma 地址无效"),
    ({"chroma_url": "ftp://127.0.0.1:8000"}, "Chroma 地址无效"),
    ({"chroma_url": "http://127.0.0.1:notaport"}, "端口无效"),
    ({"chroma_url": "http://127.0.0.1:8000/a/b"}, "一个数据库名"),
    ({"ingest_lease_s": 0.5}, "租约"),
])
def test_bad_addresses_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        Deployment(**kw)


def _run_app(tmp_path, *args):
    return subprocess.run([sys.executable, str(ROOT / "app.py"), "--data-dir", str(tmp_path / "data"), "--port",
                           str(free_port()), *args], capture_output=True, text=True, timeout=180, cwd=ROOT)


@pytest.mark.slow
def test_app_stops_with_a_message_when_servers_are_unreachable(tmp_path):
    nobody = free_port()  # nothing listens there
    r = _run_app(tmp_path, "--database-url", f"postgresql://postgres@127.0.0.1:{nobody}/kb")
    assert r.returncode == 2 and "无法连接 PostgreSQL" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = _run_app(tmp_path, "--chroma-url", f"http://127.0.0.1:{nobody}")
    assert r.returncode == 2 and "无法连接 Chroma 服务" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = _run_app(tmp_path, "--database-url", "sqlite:///x.db")
    assert r.returncode == 2 and "数据库地址无效" in r.stderr
