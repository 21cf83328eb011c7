"""Real throw-away servers for the team-mode tests: a PostgreSQL cluster and a Chroma server on loopback ports.

    with PostgresServer() as pg, ChromaServer() as chroma:
        url = pg.create_database()          # postgresql://postgres@127.0.0.1:PORT/t_xxxx (a fresh database)
        curl = chroma.create_database()     # http://127.0.0.1:PORT/t_xxxx (a fresh Chroma database)

PostgreSQL comes from the Debian packages (`apt-get install -y postgresql`; .ci/run installs it when missing);
initdb refuses root, so the cluster runs as the `postgres` user via runuser when we are root. fsync is off: the
cluster lives for one test session.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import httpx

from tests.live import free_port
from tests.waiting import wait_until


class ServerUnavailable(RuntimeError):
    """The binaries are not installed here (a skip locally, a failure in CI)."""


def _pg_bindir() -> Path:
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(cand, "initdb").exists():
            return Path(cand)
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise ServerUnavailable("PostgreSQL binaries (initdb/pg_ctl) not found: apt-get install -y postgresql")


class PostgresServer:
    def __init__(self):
        self.bindir = _pg_bindir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="kbqa-pg-"))
        self.data = self.root / "data"
        self._as_postgres = os.geteuid() == 0
        self.user = "postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> "PostgresServer":
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "-E", "UTF8", "--locale=C.UTF-8",
                  "--no-sync")
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=400")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "-t", "60", "start")
        return self

    @property
    def admin_url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def create_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:10]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ChromaServer:
    def __init__(self):
        self.exe = shutil.which("chroma")
        if not self.exe:
            raise ServerUnavailable("the `chroma` CLI (chromadb package) is not on PATH")
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="kbqa-chroma-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ChromaServer":
        self.log = open(self.root / "server.log", "wb")
        self.proc = subprocess.Popen([self.exe, "run", "--path", str(self.root / "db"), "--host", "127.0.0.1",
                                      "--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
        def beating() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chroma exited: {(self.root / 'server.log').read_text(errors='replace')[-2000:]}")
            return httpx.get(f"{self.url}/api/v2/heartbeat", timeout=1).status_code == 200

        wait_until(beating, 60, 0.2, "the chroma server's heartbeat", ignoring=(httpx.HTTPError,))
        return self

    def create_database(self) -> str:
        """A fresh Chroma database on this server, as the URL form `--chroma-url` takes."""
        return f"{self.url}/t_{uuid.uuid4().hex[:10]}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def fresh_deployment(pg: PostgresServer, chroma: ChromaServer, files_dir: Path, **kw):
    """A new database on each server and a files dir: the shared state of one team-mode knowledge base."""
    from pipeline.ops.deployment import Deployment

    files_dir.mkdir(parents=True, exist_ok=True)
    return Deployment(database_url=pg.create_database(), chroma_url=chroma.create_database(), files_dir=files_dir,
                      **kw)
