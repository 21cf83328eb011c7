"""Ingest scale-out: 1 and then 2 (`--workers 1,2`) `python app.py --role worker` processes on the same corpus.

    python -m tools.bench.bench_workers [--docs 24] [--doc-chars 3000] [--workers 1,2] [--threads 1]
                                        [--group 1] [--chroma-url http://host:port] [--database-url postgresql://…]

Each configuration gets a fresh data dir and a fresh Chroma database; vectors go to a Chroma server (started here
on a loopback port unless `--chroma-url` names one), metadata to SQLite in the shared data dir (or to
`--database-url`'s PostgreSQL, each process then on a data dir of its own). The workers start first and load
their model (each embedding `--threads` texts at once, one thread each, KBQA_EMBED_THREADS); then this process, a `--role web`
engine, uploads the corpus (CMRC 2018 contexts joined into documents of ~`--doc-chars` characters) and the clock
runs until every document reads 就绪. Prints chunks/s per configuration and the speedup over the first one, with
the machine's load average (other processes on the same cores show up there, not in the numbers).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tools.eval.cli import command_parser, write_json

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _corpus(n_docs: int, doc_chars: int) -> list[tuple[str, str]]:
    from tools.eval.devsets import shared_data_dir

    cm = json.loads((shared_data_dir() / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    contexts = [p["context"] for a in cm["data"] for p in a["paragraphs"]]
    docs, cur, i = [], "", 0
    while len(docs) < n_docs and i < len(contexts):
        cur += contexts[i] + "\n"
        i += 1
        if len(cur) >= doc_chars:
            docs.append((f"bench-{len(docs):03d}.txt", cur))
            cur = ""
    return docs


class Chroma:
    """`chroma run` on a loopback port for the benchmark's life (or an existing server's URL)."""

    def __init__(self, url: str | None, tmp: Path):
        self.proc = None
        if url:
            self.url = url.rstrip("/")
            return
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(tmp / "chroma.log", "wb")
        self.proc = subprocess.Popen([shutil.which("chroma") or "chroma", "run", "--path", str(tmp / "chroma"),
                                      "--host", "127.0.0.1", "--port", str(port)], stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/api/v2/heartbeat", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"chroma server did not start: {(tmp / 'chroma.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def database(self) -> str:
        return f"{self.url}/bench_{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


def _start_workers(n: int, data_dirs: list[Path], args_common: list[str], threads: int, logs: Path):
    procs = []
    env = {**os.environ, "KBQA_EMBED_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    for i in range(n):
        log = logs / f"worker-{i}.log"
        procs.append((subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--role", "worker", "--data-dir",
                                        str(data_dirs[i]), *args_common], cwd=ROOT, env=env,
                                       stdout=open(log, "wb"), stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + 600
    for proc, log in procs:  # each has loaded its model and waits on the queue
        while "入库进程已启动" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
    return procs


def run_config(n_workers: int, corpus, chroma: Chroma, args, tmp: Path) -> dict:
    from pipeline.engine import Engine
    from pipeline.ops.deployment import Deployment

    root = tmp / f"workers-{n_workers}"
    root.mkdir()
    chroma_url = chroma.database()
    common = ["--chroma-url", chroma_url, "--ingest-group", str(args.group)]
    if args.database_url:  # team mode: one database per configuration, a data dir per process, shared files
        db_url = _fresh_pg_database(args.database_url)
        common += ["--database-url", db_url, "--files-dir", str(root / "files")]
        dirs = [root / f"w{i}" / "data" for i in range(n_workers)]
        web_dir = root / "web" / "data"
        dep = Deployment(database_url=db_url, chroma_url=chroma_url, files_dir=root / "files", role="web")
    else:  # one SQLite data dir: the workers and this web process share it (store/dirlock.py)
        dirs = [root / "data"] * n_workers
        web_dir = root / "data"
        dep = Deployment(chroma_url=chroma_url, role="web")
    web = Engine(web_dir, deployment=dep)  # creates the schema and the collection before the workers open them
    procs = []
    try:
        procs = _start_workers(n_workers, dirs, common, args.threads, root)
        files = []
        for name, text in corpus:
            p = root / name
            p.write_text(text, encoding="utf-8")
            files.append((name, p))
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        for i in range(0, len(files), 10):  # the upload API takes 10 files per call
            web.upload(files[i:i + 10])
        docs = web.components.docs
        while web.components.jobs.count():
            for proc, log in procs:
                if proc.poll() is not None:
                    raise SystemExit(f"a worker exited:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        seconds = time.perf_counter() - t0
        rows = docs.all_docs()
        chunks = sum(d["chunk_count"] or 0 for d in rows if d["status"] == "ready")
        failed = [d["file_name"] for d in rows if d["status"] != "ready"]
        return {"workers": n_workers, "docs": len(rows), "chunks": chunks, "seconds": round(seconds, 1),
                "chunks_per_s": round(chunks / seconds, 2), "failed": failed,
                "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        web.close()


def _fresh_pg_database(admin_url: str) -> str:
    import psycopg

    name = "bench_" + uuid.uuid4().hex[:8]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_workers", __doc__)
    ap.add_argument("--docs", type=int, default=24)
    ap.add_argument("--doc-chars", type=int, default=3000)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--threads", type=int, default=1, help="ONNX intra-op threads per worker")
    ap.add_argument("--group", type=int, default=1, help="documents per claim (--ingest-group)")
    ap.add_argument("--chroma-url", default=None, help="an existing Chroma server (default: start one here)")
    ap.add_argument("--database-url", default=None,
                    help="PostgreSQL admin URL (…/postgres): team mode, a fresh database per configuration")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    corpus = _corpus(args.docs, args.doc_chars)
    results = []
    with tempfile.TemporaryDirectory(prefix="kbqa-workers-") as tmp_name:
        tmp = Path(tmp_name)
        chroma = Chroma(args.chroma_url, tmp)
        try:
            for n in (int(x) for x in args.workers.split(",")):
                r = run_config(n, corpus, chroma, args, tmp)
                results.append(r)
                print(f"{n} worker(s): {r}", flush=True)
        finally:
            chroma.stop()
    mode = "PostgreSQL + Chroma server" if args.database_url else "SQLite data dir + Chroma server"
    print(f"\nIngest with worker processes ({mode}; {len(corpus)} documents of ~{args.doc_chars} characters, "
          f"{args.threads} embedding thread(s) per worker, {args.group} document(s) per claim, "
          f"{os.cpu_count()} CPUs)")
    print("| workers | chunks | seconds | chunks/s | vs first | load avg before → after |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['workers']} | {r['chunks']} | {r['seconds']} | {r['chunks_per_s']} | "
              f"{r['chunks_per_s'] / results[0]['chunks_per_s']:.2f}× | {r['load_before']} → {r['load_after']} |")
    if any(r["failed"] for r in results):
        print("- not 就绪:", {r["workers"]: r["failed"] for r in results if r["failed"]})
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
