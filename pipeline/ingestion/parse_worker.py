"""Parsing in a child process under a wall-time and memory budget (issue 27: one file must not stall the service).

Why a process: python-docx / lxml / openpyxl / pdfium run long C calls holding the GIL that no thread can
interrupt, and their memory stays in the process that parsed. A child can be killed at once — on the time
budget, the memory budget, or when the document is deleted or cancelled — and its memory goes with it.

Why resident memory polled by the parent, not RLIMIT_AS alone: measured on this stack, a child that has loaded
the OCR engine (onnxruntime, its thread arenas) has VmSize ≈ 900 MB for VmRSS ≈ 310 MB, and pdfium alone
reserves ~190 MB of address space for 66 MB resident. An address-space limit at the budget would refuse
legitimate OCR while saying nothing about the RAM actually used, so the budget (`parse_memory_mb`) is on
VmRSS, read from /proc/<pid>/statm every POLL_S. RLIMIT_AS is still set in the child at AS_FACTOR × the
budget: a backstop for an allocation spike between two polls (a MemoryError there is reported as the same
「超出资源限制」).

Queue policy: a budget per document, not parallel parse workers. The machine has 2 cores and embedding already
uses both, so parallel parses would only share the same CPU; what must not happen is a single document holding
the queue indefinitely, and the time budget bounds that to `parse_timeout_s` (the documents behind it then
proceed). Element counts are bounded in the parsers too (pipeline/ingestion/parsing/limits.py), so the known
bombs fail in well under a second, before the budget is reached.

The child is reused between documents (start-up and imports cost ~0.5 s, the OCR models ~2 s) and replaced
after a kill, a crash, a change of the memory budget, or once it has grown past half the budget (glibc keeps
freed memory: a later small document must not be charged for an earlier big one).

How the child starts: a fresh interpreter (`python -m pipeline.ingestion.parse_worker FD MB`, a spawn: nothing
inherited from the parent's threads and locks, unlike fork) talking over a socket pair wrapped in
multiprocessing's Connection. Not multiprocessing's own spawn/forkserver start: both import the parent's
`__main__` again in the child, and a script without a `__main__` guard (tests/test_ingest.py's crash script,
any ops script) then ran again there — a second Engine on the same data dir inside the parse worker. The child
exits when the parent's end of the socket closes (the app exited or was killed).
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection
from pathlib import Path

from pipeline.ingestion.parsing import ParsedDocument, ParseError, Progress

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often the parent looks at the child (messages, RSS, time, cancellation)
CANCEL_POLL_S = 0.5  # the cancelled() callback may query the database: not every POLL_S
AS_FACTOR = 3  # RLIMIT_AS backstop, × the memory budget (see the module docstring)
AS_MIN_MB = 2048
CHILD_NICE = 5  # parsing is background work: questions keep the CPU first
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def r_timeout(seconds: float) -> str:
    return f"解析超时：超过 {seconds:g} 秒（parse_timeout_s）"


def r_memory(mb: int) -> str:
    return f"超出资源限制：解析占用内存超过 {mb} MB（parse_memory_mb）"


class ParseCancelled(Exception):
    """The document was deleted or cancelled while it parsed; its child was killed."""


class ParseStopped(Exception):
    """The worker was closed (the engine is stopping): the document is left as it was, its job is taken up again."""


class ParseCrashed(RuntimeError):
    """The parser raised something else than ParseError (a bug or a library failure), or the child died."""


def _child_main(conn, memory_mb: int) -> None:  # runs in the child process
    try:
        os.nice(CHILD_NICE)
    except OSError:
        pass
    try:
        import resource

        limit = max(AS_FACTOR * memory_mb, AS_MIN_MB) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # not Linux, or a lower hard limit already set
        pass
    from pipeline.ingestion.parsing import parse_file

    conn.send(("ready",))  # imports done: the parent takes the resident size now as this child's baseline

    def progress(msg) -> None:
        if isinstance(msg, Progress):
            conn.send(("progress", str(msg), msg.stage, msg.done, msg.total))
        else:
            conn.send(("note", str(msg)))

    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if job is None:
            return
        path, file_type, kwargs = job
        try:
            parsed = parse_file(path, file_type, progress=progress, **kwargs)
            conn.send(("ok", parsed))
        except ParseError as exc:
            conn.send(("parse_error", exc.reason))
        except MemoryError:
            conn.send(("memory",))
            return  # the heap may be in a bad state: the parent starts a new child
        except BaseException as exc:  # noqa: BLE001 — everything is reported, the parent decides
            conn.send(("error", type(exc).__name__, str(exc)[:500]))


_ROOT = Path(__file__).resolve().parents[2]  # the project root: the child imports `pipeline` from there


class _Child:
    def __init__(self, memory_mb: int):
        self.memory_mb = memory_mb
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.ingestion.parse_worker",
                                          str(theirs.fileno()), str(memory_mb)],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, cwd=str(_ROOT),
                                         env=env)
        finally:
            theirs.close()
        self.cancelled = False
        self.base_mb: float | None = None  # resident size once started (interpreter + parsing imports)

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as fh:
                return int(fh.read().split()[1]) * _PAGE / (1024 * 1024)
        except (OSError, ValueError, IndexError):
            return 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> bool:
        """True once the process has ended (within `timeout`)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        try:
            self.proc.kill()
        except Exception:  # already gone
            pass

    def close(self) -> None:
        self.kill()
        self.wait(2)
        try:
            self.conn.close()
        except OSError:
            pass


class ParseWorker:
    """parse_file in a child process with a budget. Thread-safe: concurrent callers (the ingest worker and a
    full rebuild) get a child each; one idle child is kept for the next document."""

    def __init__(self):
        # a fresh interpreter, not fork: the app process has many threads (uvicorn, Gradio, Chroma, onnxruntime)
        # and locks a forked child could inherit held.
        self._lock = threading.Lock()
        self._idle: _Child | None = None
        self._active: dict[Hashable, _Child] = {}
        self._closed = False

    def parse(self, path, file_type: str, *, timeout_s: float, memory_mb: int, key: Hashable = None,
              progress: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None,
              **parse_kwargs) -> ParsedDocument:
        """Like parsing.parse_file (same keyword arguments), but in the child. Raises ParseError (also for the
        budgets: 「解析超时…」 / 「超出资源限制…」), ParseCancelled (kill(key) or cancelled() true), ParseStopped
        (close()) or ParseCrashed."""
        child = self._take(int(memory_mb))
        if key is not None:
            with self._lock:
                self._active[key] = child
        keep = False
        try:
            child.conn.send((str(path), file_type, parse_kwargs))
            deadline = time.monotonic() + float(timeout_s)
            next_cancel_check = 0.0
            while True:
                if child.cancelled:
                    raise ParseStopped() if self._closed else ParseCancelled()
                try:
                    ready = child.conn.poll(POLL_S)
                    msg = child.conn.recv() if ready else None
                except (EOFError, OSError):
                    msg = ("died",)
                if msg is not None:
                    kind = msg[0]
                    if kind == "ready":
                        child.base_mb = child.rss_mb()
                        continue
                    if kind == "progress":
                        if progress is not None:
                            progress(Progress(msg[1], msg[2], msg[3], msg[4]))
                        continue
                    if kind == "note":
                        if progress is not None:
                            progress(msg[1])
                        continue
                    if kind == "ok":
                        keep = True
                        return msg[1]
                    if kind == "parse_error":
                        keep = True
                        raise ParseError(msg[1])
                    if kind == "memory":
                        raise ParseError(r_memory(child.memory_mb))
                    if kind == "error":
                        keep = True
                        raise ParseCrashed(f"{msg[1]}: {msg[2]}")
                    # died: killed by cancel() or close(), the OOM killer, or a crash in a C library
                    if child.cancelled:
                        raise ParseStopped() if self._closed else ParseCancelled()
                    child.wait(1)
                    raise ParseCrashed(f"解析进程意外退出（exit code {child.proc.returncode}）")
                now = time.monotonic()
                if cancelled is not None and now >= next_cancel_check:
                    next_cancel_check = now + CANCEL_POLL_S
                    if cancelled():
                        raise ParseCancelled()
                if now > deadline:
                    log.warning("parse of %s over its %ss budget: worker killed", path, timeout_s)
                    raise ParseError(r_timeout(float(timeout_s)))
                rss = child.rss_mb()
                if rss > child.memory_mb:
                    log.warning("parse of %s at %.0f MB over its %s MB budget: worker killed", path, rss,
                                child.memory_mb)
                    raise ParseError(r_memory(child.memory_mb))
        finally:
            if key is not None:
                with self._lock:
                    self._active.pop(key, None)
            self._give_back(child, keep and not child.cancelled)

    def kill(self, key: Hashable) -> bool:
        """Kill the child parsing `key` now (document deleted / cancelled). True when one was running."""
        with self._lock:
            child = self._active.get(key)
        if child is None:
            return False
        child.cancelled = True
        child.kill()
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children = [c for c in [self._idle, *self._active.values()] if c is not None]
            self._idle = None
        for c in children:
            c.cancelled = True
            c.close()

    def _take(self, memory_mb: int) -> _Child:
        with self._lock:
            if self._closed:
                raise ParseStopped()  # stopping: the job is released and taken up again
            child, self._idle = self._idle, None
        if child is not None and child.alive() and child.memory_mb == memory_mb:
            return child
        if child is not None:
            child.close()
        return _Child(memory_mb)

    def _give_back(self, child: _Child, reusable: bool) -> None:
        grown = child.rss_mb() - (child.base_mb or 0.0)
        if reusable and child.alive() and grown <= child.memory_mb / 2:
            with self._lock:
                if self._idle is None and not self._closed:
                    self._idle = child
                    return
        child.close()


if __name__ == "__main__":  # the child: python -m pipeline.ingestion.parse_worker FD MEMORY_MB
    _child_main(Connection(int(sys.argv[1])), int(sys.argv[2]))
