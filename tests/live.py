"""Shared test plumbing: free ports, the real app served by uvicorn in a thread or as a process, a launched UI.

Every server a test starts listens on 127.0.0.1 on a port of its own: the in-thread app on a socket bound to
port 0, `launch_local` / AppProcess on a probed free port. Never Gradio's default 7860+ scan, which other apps
on the same machine use too (a launch that landed on a busy one failed with 「When localhost is not accessible,
a shareable link must be created」).
"""
from __future__ import annotations

import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import uvicorn

from pipeline.access.policy import AccessPolicy
from tests.waiting import wait_until


def free_port() -> int:
    """A port nothing listens on now (for a server that takes a port number, not a socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveApp:
    """The real app (app.build_app: REST API + Gradio mounted at /) served by uvicorn in a thread.

    `LiveApp(engine)` serves an engine the test made (stop(close_engine=True) closes it);
    `LiveApp.on_data_dir(dir)` makes its own engine there and closes it on stop()."""

    def __init__(self, engine, policy: AccessPolicy | None = None, *, owns_engine: bool = False):
        import app as app_module

        self.engine = engine
        self.owns_engine = owns_engine
        self.app, self.blocks = app_module.build_app(engine, policy or AccessPolicy())
        # Bound here, handed to uvicorn: the port is ours from the start (no probe-then-bind race).
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        # streams a test left open (the page's event stream of a gradio_client) get 1 s, not the app's 5
        self.server = uvicorn.Server(app_module.server_config(self.app, "127.0.0.1", self.port, grace_s=1.0))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), 60, 0.05, "the app to start")
        assert self.server.started, "app did not start (its thread ended)"
        self.url = f"http://127.0.0.1:{self.port}/"

    @classmethod
    def on_data_dir(cls, data_dir: Path, policy: AccessPolicy | None = None, deployment=None) -> "LiveApp":
        """The app on a new engine in `data_dir` (`deployment`: where its state lives; None: embedded)."""
        from pipeline.engine import Engine

        return cls(Engine(data_dir, deployment=deployment), policy, owns_engine=True)

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url.rstrip("/"), timeout=120, **kw)

    def client(self, **kw):
        return ui_client(self.url, **kw)

    def stop(self, close_engine: bool | None = None):
        """Stop serving; close the engine when asked, or by default when this app made it."""
        self.server.should_exit = True
        self.thread.join(15)
        self._sock.close()
        if close_engine or (close_engine is None and self.owns_engine):
            self.engine.close()


def live_with_doc(tmp_path_factory, name: str, policy: AccessPolicy | None = None, deployment=None):
    """For a module fixture (`yield from`): the app over a fresh engine holding the one-document KB of
    tests/test_ui_chat.py; the engine closes with it. `deployment`: where its state lives (None: embedded)."""
    from tests.test_ui_chat import make_engine

    app = LiveApp(make_engine(tmp_path_factory.mktemp(name), deployment=deployment), policy)
    try:
        yield app
    finally:
        app.stop(close_engine=True)


def launch_local(demo, **kw) -> int:
    """`demo.launch(**kw)` on 127.0.0.1, on a free port chosen here, without blocking; returns the port. A port
    taken between the probe and Gradio's bind is tried again with another."""
    for attempt in range(3):
        port = free_port()
        try:
            demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kw)
            return port
        except OSError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def ui_client(url: str, **kw):
    """gradio_client over the page's own events. Only ui.DOCUMENTED_EVENTS are in the API description a
    client reads by default; the page's other events (what a browser session calls) are undocumented, and the
    server describes them on request (`all_endpoints`), so this client can call them by name as the page does."""
    from gradio_client import Client

    class PageEventsClient(Client):
        def _get_api_info(self):
            r = httpx.get(self.src_prefixed + "info", params={"serialize": "False", "all_endpoints": "True"},
                          headers=self.headers, cookies=self.cookies, verify=self.ssl_verify, **self.httpx_kwargs)
            r.raise_for_status()
            return r.json()

    return PageEventsClient(url, analytics_enabled=False, verbose=False, **kw)


@contextmanager
def launched_ui(engine):
    """build_ui(engine) launched on 127.0.0.1 with the page look; yields (demo, gradio client)."""
    from ui import build_ui, page_kwargs

    demo = build_ui(engine)
    launch_local(demo, show_error=True, **page_kwargs())
    try:
        yield SimpleNamespace(demo=demo, client=ui_client(demo.local_url))
    finally:
        demo.close()


def engine_with_texts(tmp: Path, docs: dict[str, str], timeout: float = 300):
    """A real Engine on tmp/data holding `docs` (file name → text) as ready documents (files written to tmp)."""
    from pipeline.engine import Engine

    engine = Engine(tmp / "data")
    items = []
    for name, text in docs.items():
        p = tmp / name
        p.write_text(text, encoding="utf-8")
        items.append((name, p))
    engine.upload(items)
    assert engine.wait_idle(timeout), "ingest did not finish"
    backgrounds_measured(engine, timeout=timeout)
    return engine


def backgrounds_measured(engine, kb_ids=(1,), timeout: float = 300) -> None:
    """Wait for the gate backgrounds the post-ingest refresh measures in full (seconds after an ingest; until
    then questions use a quick estimate: pipeline/retrieval/gate_background.py)."""
    c = engine.components

    def stored(kb_id: int) -> bool:
        row = c.gate_stats.load(kb_id)
        return row is not None and row[0] == c.gate_background.of(kb_id).fingerprint()

    wait_until(lambda: all(stored(k) for k in kb_ids), timeout, 0.2, "the gate backgrounds to be measured")


class AppProcess:
    """`python app.py …` as a real separate process on a free port (team-mode tests run two of them)."""

    def __init__(self, data_dir, *args: str, log_path=None):
        import subprocess
        import sys
        from pathlib import Path

        root = Path(__file__).resolve().parents[1]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path or Path(data_dir).with_suffix(".log"))
        Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(root / "app.py"), "--host", "127.0.0.1", "--port",
                                      str(self.port), "--data-dir", str(data_dir), *args], cwd=root,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300) -> "AppProcess":
        def ready() -> bool:
            assert self.proc.poll() is None, f"app exited with {self.proc.returncode}"
            h = httpx.get(f"{self.url}/api/health", timeout=5).json()["data"]
            assert h["state"] != "error", h
            return h["state"] == "ready"

        try:
            wait_until(ready, timeout, 0.3, "the app process to read ready", ignoring=(httpx.HTTPError,))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tail()}") from None
        return self

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kw)

    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def kill9(self) -> None:
        import signal

        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
