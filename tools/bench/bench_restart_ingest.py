"""Questions right after a restart while a batch of documents ingests: the case where answers used to wait behind
the gate background's re-measurement (docs/benchmarks.md "Load"; docs/security.md "availability").

    python -m tools.bench.bench_restart_ingest --data-dir KB_DIR --docs DIR --questions FILE
        [--documents 40] [--concurrency 8] [--requests 60] [--port 7893] [--prime] [--app-root DIR]

A copy of KB_DIR (a data dir that already holds a knowledge base, e.g. a dev-set KB of tools.eval.kb_cache) is
served by a fresh `python app.py` (the restart); as soon as its engine is ready, the first `--documents` files of
DIR are uploaded in one request and `--requests` questions (from FILE, each asked once) are sent by
`--concurrency` clients through the SSE answer stream (tools.bench.bench_load). Prints time to `done` p50/p95/p99,
how long the ingest ran, and every gate-background measurement the app logged meanwhile (it changes with the
knowledge base and is re-measured in the background; questions must not wait for it). `--prime`: the copy is
first served once until its gate background is measured in full and stored (a data dir of a running
installation); without it, a data dir that never stored one is a first start (the quick estimate).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from tools.bench.bench_load import load_questions, run
from tools.eval.cli import command_parser, write_json

MEASURED = re.compile(r"gate background of kb (\d+): (quick estimate from )?(\d+) probes.*?\((\d+) ms\)")


ROOT = Path(__file__).resolve().parents[2]


def start_app(data: Path, port: int, log, root: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "app.py", "--data-dir", str(data), "--port", str(port)], cwd=root,
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})


def prime(data: Path, port: int, log_path: Path, http: httpx.Client, question: str) -> None:
    """Serve the data dir once until its gate background is measured in full (logged with all its probes)."""
    with open(log_path, "w") as log:
        proc = start_app(data, port, log)
        try:
            wait_ready(http, proc)
            http.post("/api/qa/ask/sync", json={"question": question})
            t0 = time.monotonic()
            while not any(not quick for _, quick, _, _ in MEASURED.findall(log_path.read_text(errors="replace"))):
                if time.monotonic() - t0 > 900:
                    raise SystemExit("the gate background was not measured while priming")
                time.sleep(1)
        finally:
            proc.terminate()
            proc.wait(60)


def wait_ready(http: httpx.Client, proc: subprocess.Popen, timeout: float = 600) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"app exited with {proc.returncode}")
        try:
            if http.get("/api/health").json()["data"].get("engine") == "ready":
                return time.monotonic() - t0
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit("app not ready in time")


def ingest_seconds(http: httpx.Client, t_upload: float, timeout: float = 1800) -> float:
    while time.monotonic() - t_upload < timeout:
        h = http.get("/api/health").json()["data"]
        if not h["processing"] and not h["queued"]:
            return time.monotonic() - t_upload
        time.sleep(1)
    return float("nan")


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_restart_ingest", __doc__)
    ap.add_argument("--data-dir", required=True, help="a data dir holding a knowledge base (copied, never changed)")
    ap.add_argument("--docs", required=True, help="folder of documents to ingest after the restart")
    ap.add_argument("--questions", required=True)
    ap.add_argument("--documents", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--port", type=int, default=7893)
    ap.add_argument("--prime", action="store_true", help="serve the copy once first, until its gate background is stored")
    ap.add_argument("--app-root", default=str(ROOT),
                    help="serve with the app.py of this checkout (e.g. an older revision unpacked by git archive, with "
                         "models/ linked): old and new measured by the same benchmark")
    ap.add_argument("--log", default=None, help="keep the served app's log here")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    files = sorted(p for p in Path(args.docs).iterdir() if p.suffix in {".md", ".txt"})[:args.documents]
    questions = load_questions(Path(args.questions))[:args.requests]
    url = f"http://127.0.0.1:{args.port}"
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kbqa-restart-")))
        data = tmp / "data"
        shutil.copytree(args.data_dir, data, ignore=shutil.ignore_patterns("*.lock", "app.lock"))
        log_path = tmp / "app.log"
        log = stack.enter_context(open(log_path, "w"))
        http = stack.enter_context(httpx.Client(base_url=url, timeout=300))
        if args.prime:
            prime(data, args.port, tmp / "prime.log", http, questions[0])
        proc = start_app(data, args.port, log, Path(args.app_root))
        stack.callback(lambda: (proc.terminate(), proc.wait(60)))
        ready_s = wait_ready(http, proc)
        t_upload = time.monotonic()
        accepted = 0
        for i in range(0, len(files), 10):  # the upload route takes up to 10 files per request
            batch = files[i:i + 10]
            r = http.post("/api/kb/documents", files=[("file", (p.name, p.read_bytes(), "text/plain"))
                                                     for p in batch]).json()
            accepted += sum(1 for x in r["data"] if x["ok"]) if r.get("code") == 0 else 0
        result = run(url, questions, args.concurrency, None, 300)
        asked_s = time.monotonic() - t_upload
        ingest_s = ingest_seconds(http, t_upload)
        measured = [(int(k), ("quick " if quick else "") + n, int(ms))
                    for k, quick, n, ms in MEASURED.findall(log_path.read_text(errors="replace"))]
        if args.log:
            shutil.copy(log_path, args.log)
    d = result["done_s"]
    out = {"ready_s": round(ready_s, 1), "documents": len(files), "accepted": accepted,
           "requests": result["requests"], "successes": result["successes"],
           "failures_by_code": result["failures_by_code"], "done_s": d, "first_text_s": result["first_text_s"],
           "questions_wall_s": round(asked_s, 1), "ingest_s": round(ingest_s, 1),
           "gate_background_measurements_ms": measured}
    print(f"ready after restart {out['ready_s']} s; {accepted}/{len(files)} documents accepted; "
          f"{result['successes']}/{result['requests']} answered by {args.concurrency} clients in {out['questions_wall_s']} s "
          f"(ingest done after {out['ingest_s']} s)" + (f"; failures by code: {out['failures_by_code']}"
                                                       if out["failures_by_code"] else ""))
    print(f"done p50 / p95 / p99: {d['p50']} / {d['p95']} / {d['p99']} s; first text p50 / p95: "
          f"{result['first_text_s']['p50']} / {result['first_text_s']['p95']} s")
    wave, rest = result["done_s_in_order"][:args.concurrency], result["done_s_in_order"][args.concurrency:]
    if rest:  # the first wave pays what is cold after the restart; the rest is the steady closed loop
        print(f"first wave of {len(wave)}: max {max(wave)} s; the other {len(rest)}: p50 {sorted(rest)[len(rest) // 2]}, "
              f"max {max(rest)} s")
    print(f"gate background measured meanwhile (kb, probes, ms): {measured or 'none'}")
    write_json(args.json, out)
    return 0 if not result["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
