"""Process roles (app.py --role, docs/deploy.md#roles): a web process queues uploads and claims nothing, a worker
process claims and finishes them with no UI and no port, the default `both` does both, and the data dir lock
lets only safe combinations share one dir.

The end-to-end test runs real `python app.py` processes — on one SQLite data dir with vectors on a real Chroma
server, and in team mode (PostgreSQL + Chroma server, a data dir each; tests/servers.py): web first (the upload
stays queued), then a worker (it ingests; the web process answers from it).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.ops.deployment import Deployment
from store.dirlock import DataDirLock
from tests.live import AppProcess, engine_with_texts
from tests.waiting import holds_for, wait_until

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("青松水务公司的客服热线是 400-820-3366，每天 7 点到 22 点接听。"
        "青松水务公司的总部位于苏州工业园区星湖街 88 号。")


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (its socket inodes matched against /proc/net/tcp{,6} in LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A = LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def test_data_dir_lock_lets_only_safe_roles_share_a_dir(tmp_path):
    both, w1, w2, web, web2, tool = (DataDirLock(tmp_path) for _ in range(6))
    assert both.acquire("both")
    assert not w1.acquire("worker") and not web.acquire("web")  # nothing shares a dir with a `both` process
    both.release()
    assert w1.acquire("worker") and w2.acquire("worker")  # workers side by side
    assert web.acquire("web")  # one web process beside them
    assert not web2.acquire("web")  # a second one would write the same BM25 files
    assert not tool.acquire("both") and not both.acquire("both")  # offline tools and `both` stay out
    for lock in (w1, w2, web):
        lock.release()
    assert tool.acquire("both")


@pytest.mark.slow  # starts app processes (python app.py …): the full run, not the fast loop
def test_split_roles_need_a_chroma_server(tmp_path):
    """Embedded Chroma is opened by one process only: web / worker without --chroma-url are refused, clearly."""
    assert Deployment.from_sources(env={}).role == "both"
    assert Deployment.from_sources(env={"KBQA_ROLE": "worker", "CHROMA_URL": "http://127.0.0.1:9/x"}).role == "worker"
    for role in ("web", "worker"):
        r = subprocess.run([sys.executable, str(ROOT / "app.py"), "--role", role, "--data-dir", str(tmp_path / "d")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"--role {role} 需要 Chroma 服务（--chroma-url）" in r.stderr
        assert not (tmp_path / "d").exists()  # refused before anything was opened


@pytest.mark.slow  # starts an app process
def test_default_role_both_ingests_in_its_own_process(tmp_path):
    engine = engine_with_texts(tmp_path, {"青松水务.txt": TEXT})  # wait_idle: this process claimed and finished it
    try:
        assert engine.components.deployment.role == "both" and engine.components.ingest.claim_jobs
        found = engine.search("青松水务公司客服热线", 3)
        assert found["bm25"] and "400-820-3366" in found["bm25"][0]["text"], found
    finally:
        engine.close()


def _doc(app: AppProcess, name: str) -> dict | None:
    with app.http() as c:
        items = c.get("/api/kb/documents", params={"size": 200}).json()["data"]["items"]
    return next((d for d in items if d["file_name"] == name), None)


def _sqlite_owner(data: Path):
    def owner(doc_id: int):
        """The ingest_job row of the document in the shared SQLite (None: no job)."""
        import sqlite3

        with sqlite3.connect(data / "app.db", timeout=30) as conn:
            return conn.execute("SELECT owner FROM ingest_job WHERE doc_id = ?", (doc_id,)).fetchone()
    return owner


def _pg_owner(url: str):
    def owner(doc_id: int):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT owner FROM ingest_job WHERE doc_id = %s", (doc_id,)).fetchone()
        return None if row is None else tuple(row)
    return owner


@pytest.fixture(params=["sqlite-dir", "team"])
def split(request, chroma_server, tmp_path):
    """(web data dir, worker data dir, common flags, job owner reader): one SQLite data dir shared by both with
    vectors on a Chroma server, or team mode (PostgreSQL + Chroma server + files dir, a data dir each)."""
    if request.param == "sqlite-dir":
        data = tmp_path / "data"
        return data, data, ["--chroma-url", chroma_server.create_database()], _sqlite_owner(data)
    from tests.servers import fresh_deployment

    dep = fresh_deployment(request.getfixturevalue("pg_server"), chroma_server, tmp_path / "files")
    flags = ["--database-url", dep.database_url, "--chroma-url", dep.chroma_url, "--files-dir", str(dep.files_dir)]
    return tmp_path / "web" / "data", tmp_path / "worker" / "data", flags, _pg_owner(dep.database_url)


@pytest.mark.slow
def test_web_queues_worker_ingests(split, tmp_path):
    web_dir, worker_dir, args, job_owner = split
    web = AppProcess(web_dir, "--role", "web", *args, log_path=tmp_path / "web.log")
    worker = None
    try:
        web.wait_ready()
        with web.http() as c:
            rec = c.post("/api/kb/documents", files=[("file", ("青松水务.txt", TEXT.encode()))]).json()["data"][0]
        assert rec["ok"] and rec["status"] == "processing", rec
        doc_id = rec["doc_id"]
        # the web process claims nothing: the job stays in the queue, unowned, and the document 处理中
        holds_for(lambda: job_owner(doc_id) == (None,), 3.0, 0.2, "the job queued and unowned")
        queued = _doc(web, "青松水务.txt")
        assert queued["status"] == "processing" and queued["stage"] == "queued" and queued["position"] == 1, queued

        log = open(tmp_path / "worker.log", "wb")
        worker = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--role", "worker", "--data-dir",
                                   str(worker_dir), *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        done = wait_until(lambda: (d := _doc(web, "青松水务.txt")) and d["status"] != "processing" and d, 300, 0.3,
                          "the worker to finish the upload")
        assert done["status"] == "ready" and done["chunk_count"] > 0, done
        assert job_owner(doc_id) is None  # the job is gone from the queue
        with web.http() as c:  # the web process answers from what the worker wrote (BM25 rebuilt, vectors shared)
            found = wait_until(lambda: (s := c.post("/api/kb/search", json={"query": "青松水务公司客服热线",
                                                                            "top_k": 3}).json()["data"])["bm25"] and s,
                               30, 0.2, "the web process to search the new document by keyword")
        assert "400-820-3366" in found["bm25"][0]["text"] and found["vector"][0]["doc_id"] == doc_id

        assert worker.poll() is None
        assert listening_ports(worker.pid) == set()  # no UI, no HTTP port
        out = (tmp_path / "worker.log").read_text(errors="replace")
        assert "入库进程已启动（--role worker" in out and "本地地址" not in out
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
        assert "入库进程已停止" in (tmp_path / "worker.log").read_text(errors="replace")
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        web.stop()
