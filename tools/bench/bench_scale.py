"""The growth curve of issue 29 in team mode, one run: 50k → 200k → 1M chunks on PostgreSQL + a Chroma server.

    python -m tools.bench.bench_scale --database-url postgresql://postgres@127.0.0.1:55432/kbqa_scale \\
        --chroma-url http://127.0.0.1:58000 --files-dir /tmp/kbqa-scale-files \\
        [--sizes 50000,200000,1000000] [--base 1000] [--queries 100] [--web 2] [--json scale.json]

The database and the Chroma database must be empty (the command refuses otherwise). Throw-away servers on loopback
ports, as tests/servers.py starts them (as root, run the PostgreSQL commands through `runuser -u postgres --` and
give the cluster's folder to postgres first):

    initdb -D /tmp/kbqa-scale-pg -A trust -U postgres -E UTF8 --locale=C.UTF-8
    pg_ctl -D /tmp/kbqa-scale-pg -l /tmp/kbqa-scale-pg/log -w start \\
        -o "-p 55432 -k /tmp/kbqa-scale-pg -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
    createdb -h 127.0.0.1 -p 55432 -U postgres kbqa_scale
    ANONYMIZED_TELEMETRY=False chroma run --path /tmp/kbqa-scale-chroma --host 127.0.0.1 --port 58000

(`pg_ctl -D /tmp/kbqa-scale-pg -m immediate stop` and stopping `chroma run` end them; delete both folders after.)

The corpus is bench_retrieval's: `--base` real chunks (CMRC 2018 + CRUD-RAG news) embedded once by the packaged
model, replicated with a per-copy marker word and a perturbed vector. This process fills the team deployment
through its stores (SQL rows with stored tokens in PostgreSQL, vectors in Chroma, each document's BM25 segment in
the shared files dir written before it turns 就绪 and merged, as a worker's ingest does) up to the first size, then
moves the knowledge-base generation as the app does after a change (SearchableChanges.changed), and measures;
then fills on to the next size, and so on. At each size:

- fill: chunks added, seconds, Chroma insert rate (chunks/s of the vector inserts alone);
- `--web` real web processes (`python app.py --role web` with DATABASE_URL, CHROMA_URL, KBQA_FILES_DIR set, each
  on a free loopback port, its own data dir kept from one size to the next) are started one after another:
  seconds from start to /api/health ready (the BM25 index is built or loaded there: the log's `BM25 rebuilt:`
  ms are shown);
- `--queries` CMRC questions round-robin over them through /api/qa/ask/sync (the only endpoint whose trace has
  `ms` per stage including the query embedding; /api/kb/search lacks it). Stage p50/p95, retrieval without
  rerank (embed + bm25 + vector + fusion), and the whole offline (extractive) answer and HTTP time apart;
- RSS (VmRSS) of each web process after the questions, and its peak (VmHWM);
- change cost: one new document with a word no chunk has is uploaded through web process 1 (a web process only
  queues it; one `--role worker` process, started once, ingests it); seconds until each web process's keyword
  route (/api/kb/search, the bm25 list) finds it, and the log lines of each that announce a full BM25 build
  (`BM25 rebuilt:`) or an incremental one (`BM25 segment`) meanwhile;
- restart: each web process stopped and started again with nothing changed (it loads what it persisted).

It prints a table per size, then the growth table and issue 29's goals at the largest size (retrieval without
rerank p95 ≤ 150 ms; a new document searchable by keyword in every process within 5 s with no full build; RSS
≤ 1.5 GB per web process). Every process started here is stopped at the end, also on error. Expect an hour or
more at 1M: the fill runs at the Chroma insert rate printed per step.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import httpx
import numpy as np

from tools.bench.bench_restart_ingest import wait_ready
from tools.bench.bench_retrieval import _fill, _questions, _replicas, _texts, pct, rss_mb
from tools.bench.bench_workers import _free_port
from tools.eval.cli import command_parser, write_json

ROOT = Path(__file__).resolve().parents[2]
PER_DOC = 500          # chunks per benchmark document (as bench_retrieval)
FILL_BATCH = 10_000    # replicas built and inserted at a time (a whole 800k step held at once would be ~3 GB)
START_TIMEOUT_S = 3600
CHANGE_TIMEOUT_S = 1800  # today every process rebuilds BM25 in full on a change: minutes at 1M
FULL_BUILD, SEGMENT = "BM25 rebuilt:", "BM25 segment"
BUILD_MS = re.compile(r"BM25 rebuilt: (\d+) chunks in (\d+) ms")
STAGES = ("embed", "bm25", "vector", "fusion", "rerank", "gate")
GOALS = {"retrieval_p95_ms": 150, "visible_s": 5, "rss_mb": 1536}


class App:
    """One `python app.py --role …` process of the team deployment, in a process group of its own (so stopping
    it also ends what it started), its output in `log`."""

    def __init__(self, role: str, data_dir: Path, log: Path, env: dict):
        self.log, self.port = log, (_free_port() if role == "web" else None)
        cmd = [sys.executable, str(ROOT / "app.py"), "--role", role, "--data-dir", str(data_dir)]
        if self.port:
            cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.url = f"http://127.0.0.1:{self.port}"
        self.t0 = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, "KBQA_ROLE": role}, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def text(self, start: int = 0) -> str:
        with open(self.log, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def wait_ready(self, http: httpx.Client) -> float:
        """Seconds from the process's start to /api/health ready (polled every 0.5 s)."""
        try:
            wait_ready(http, self.proc, START_TIMEOUT_S)
        except SystemExit as exc:
            raise SystemExit(f"{exc}\n{self.text()[-3000:]}") from None
        return round(time.monotonic() - self.t0, 1)

    def wait_log(self, marker: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while marker not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.log.name}: no {marker!r}:\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_web(name: str, work: Path, env: dict) -> tuple[App, dict]:
    app = App("web", work / name, work / f"{name}-{time.monotonic_ns()}.log", env)
    try:
        with httpx.Client(base_url=app.url, timeout=30) as health:
            ready_s = app.wait_ready(health)
            chunks = health.get("/api/health").json()["data"]["chunks"]
    except BaseException:
        app.stop()
        raise
    # every full build logged until ready (none: the persisted index was loaded)
    return app, {"ready_s": ready_s, "bm25_builds_ms": [int(ms) for _, ms in BUILD_MS.findall(app.text())],
                 "chunks": chunks}


def ask_all(webs: list[App], questions: list[str], http: httpx.Client) -> dict:
    """The questions round-robin over the web processes: per-stage ms of the trace, answer and HTTP time."""
    got: dict[str, list[float]] = {}
    failed = 0
    for w in webs:  # warm-up, not counted: a process's first question pays one-off costs
        http.post(f"{w.url}/api/qa/ask/sync", json={"question": questions[0]})
    for i, q in enumerate(questions):
        t0 = time.perf_counter()
        r = http.post(f"{webs[i % len(webs)].url}/api/qa/ask/sync", json={"question": q})
        wall = (time.perf_counter() - t0) * 1000
        d = r.json()["data"] if r.status_code == 200 else None
        ms = ((d or {}).get("trace") or {}).get("ms")
        if not ms:
            failed += 1
            continue
        for k, v in ms.items():
            if isinstance(v, int | float):
                got.setdefault(k, []).append(v)
        got.setdefault("retrieval_no_rerank", []).append(sum(ms.get(k, 0.0) for k in STAGES[:4]))
        got.setdefault("answer", []).append(d["elapsed_ms"])
        got.setdefault("http", []).append(wall)
    if not got:
        raise SystemExit(f"no question got a trace; the last answer: {r.text[:1000]}")
    return {"failed": failed, **{k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in got.items()}}


def change_cost(webs: list[App], size: int, http: httpx.Client) -> dict:
    """Upload one document with a never-seen word through web process 1; poll every process's keyword route."""
    word = f"zqprobe{size}x{uuid.uuid4().hex[:8]}"  # one jieba token, in no chunk of the corpus
    name = f"probe-{size}.txt"
    text = f"规模基准新增的文档（{size} 块时加入）：{word} 是一个从未出现过的词，只在这份文档里。"
    marks = [w.log.stat().st_size for w in webs]
    t0 = time.monotonic()
    rec = http.post(f"{webs[0].url}/api/kb/documents", files=[("file", (name, text.encode()))]).json()["data"][0]
    if not rec.get("ok"):
        raise SystemExit(f"the probe upload was refused: {rec}")
    doc_id = rec["doc_id"]

    def until(found) -> float | None:
        """Seconds from the upload until found() holds (None: not within CHANGE_TIMEOUT_S)."""
        while time.monotonic() - t0 < CHANGE_TIMEOUT_S:
            if found():
                return round(time.monotonic() - t0, 2)
            time.sleep(0.05)
        return None

    def ready() -> bool:
        items = http.get(f"{webs[0].url}/api/kb/documents", params={"keyword": name}).json()["data"]["items"]
        return any(d["doc_id"] == doc_id and d["status"] == "ready" for d in items)

    def searchable(w: App) -> bool:
        hits = http.post(f"{w.url}/api/kb/search", json={"query": word, "top_k": 3}).json()["data"]["bm25"]
        return any(h["doc_id"] == doc_id for h in hits)

    # a thread per process: a search that waits for its process's BM25 refresh delays no other process's poll
    with ThreadPoolExecutor(len(webs) + 1) as pool:
        ingested = pool.submit(until, ready)
        seen = list(pool.map(lambda w: until(lambda: searchable(w)), webs))
    ready_s = ingested.result()
    logs = [w.text(m) for w, m in zip(webs, marks)]
    return {"word": word, "ready_s": ready_s, "visible_s": seen,
            "last_s": None if None in seen else max(seen),
            "full_builds": [t.count(FULL_BUILD) for t in logs], "segment_lines": [t.count(SEGMENT) for t in logs]}


def measure(size: int, fill: dict, work: Path, env: dict, questions: list[str], n_web: int,
            http: httpx.Client) -> dict:
    webs: list[App] = []
    try:
        starts = []
        for i in range(n_web):  # one after another: each start's time is its own, not a share of the cores
            app, st = start_web(f"web{i + 1}", work, env)
            webs.append(app)
            starts.append(st)
        latency = ask_all(webs, questions, http)
        rss = [rss_mb(w.proc.pid) for w in webs]
        change = change_cost(webs, size, http)
        restarts = []
        for i in range(n_web):
            webs[i].stop()
            webs[i], st = start_web(f"web{i + 1}", work, env)
            restarts.append(st)
    finally:
        for w in webs:
            w.stop()
    per_web = [{"start": s, "restart": r, "rss_mb": m, "peak_rss_mb": p}
               for s, r, (m, p) in zip(starts, restarts, rss)]
    return {"chunks": size, "fill": fill, "web": per_web, "latency_ms": latency, "change": change,
            "load_avg": round(os.getloadavg()[0], 1)}


def builds(start: dict) -> str:
    return " + ".join(map(str, start["bm25_builds_ms"])) or "loaded"


def print_size(row: dict) -> None:
    f, lat, ch = row["fill"], row["latency_ms"], row["change"]
    print(f"\n## {row['chunks']} chunks (load average {row['load_avg']})")
    print(f"- fill: +{f['chunks']} chunks in {f['seconds']} s ({f['s_per_10k']} s per 10k); Chroma inserts "
          f"{f['vectors_s']} s → **{f['chroma_chunks_per_s']} chunks/s**")
    print("\n| stage | p50 ms | p95 ms |\n|---|---|---|")
    for k in [*(s for s in STAGES if s in lat), *(s for s in lat if s not in (*STAGES, "failed"))]:
        print(f"| {k} | {lat[k]['p50']} | {lat[k]['p95']} |")
    if lat["failed"]:
        print(f"- {lat['failed']} questions returned no trace")
    print(f"\nWeb processes served {row['web'][0]['start']['chunks']} chunks (/api/health); probe document "
          f"就绪 after {ch['ready_s']} s (worker ingest)")
    print("| web | start→ready s | BM25 builds at start ms | restart→ready s | BM25 builds at restart ms | RSS MB | "
          "peak RSS MB | change visible s | full builds | segment lines |\n|---|---|---|---|---|---|---|---|---|---|")
    for i, w in enumerate(row["web"]):
        print(f"| {i + 1} | {w['start']['ready_s']} | {builds(w['start'])} | {w['restart']['ready_s']} | "
              f"{builds(w['restart'])} | {w['rss_mb']} | {w['peak_rss_mb']} | {ch['visible_s'][i]} | "
              f"{ch['full_builds'][i]} | {ch['segment_lines'][i]} |")


def print_growth(rows: list[dict]) -> None:
    def pp(lat, k):
        return f"{lat[k]['p50']} / {lat[k]['p95']}" if k in lat else "–"

    print("\n## Growth (p50 / p95 ms; per web process: max over them)\n")
    print("| chunks | retrieval no rerank | embed | bm25 | vector | fusion | answer | start→ready s | restart s | "
          "RSS MB | change visible s (full builds) | Chroma insert chunks/s |\n" + "|---" * 12 + "|")
    for r in rows:
        lat, ch, web = r["latency_ms"], r["change"], r["web"]
        print(f"| {r['chunks']} | {' | '.join(pp(lat, k) for k in ('retrieval_no_rerank', *STAGES[:4], 'answer'))} | "
              f"{max(w['start']['ready_s'] for w in web)} | {max(w['restart']['ready_s'] for w in web)} | "
              f"{max(w['rss_mb'] for w in web)} | {ch['last_s']} ({sum(ch['full_builds'])}) | "
              f"{r['fill']['chroma_chunks_per_s']} |")
    r = rows[-1]
    p95, ch, rss = r["latency_ms"]["retrieval_no_rerank"]["p95"], r["change"], max(w["rss_mb"] for w in r["web"])
    visible = ch["last_s"] is not None and ch["last_s"] <= GOALS["visible_s"] and not sum(ch["full_builds"])
    print(f"\nIssue 29 goals at {r['chunks']} chunks: retrieval p95 {p95} ms ≤ {GOALS['retrieval_p95_ms']}: "
          f"{'yes' if p95 <= GOALS['retrieval_p95_ms'] else 'NO'}; new document visible everywhere in "
          f"{ch['last_s']} s ≤ {GOALS['visible_s']} with no full build: {'yes' if visible else 'NO'}; "
          f"RSS {rss} MB ≤ {GOALS['rss_mb']}: {'yes' if rss <= GOALS['rss_mb'] else 'NO'}")


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_scale", __doc__)
    ap.add_argument("--sizes", default="50000,200000,1000000", help="chunk counts, increasing")
    ap.add_argument("--base", type=int, default=1000, help="real chunks embedded by the model")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--database-url", required=True, help="an empty PostgreSQL database (postgresql://…)")
    ap.add_argument("--chroma-url", required=True, help="an empty Chroma server / database (http://host:port[/db])")
    ap.add_argument("--files-dir", required=True, help="the team deployment's shared files dir")
    ap.add_argument("--web", type=int, default=2, help="web processes")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if sizes != sorted(set(sizes)) or sizes[0] < 1 or args.web < 1:
        ap.error("--sizes must be increasing positive chunk counts, --web at least 1")

    from pipeline.engine import Engine
    from pipeline.ops.deployment import Deployment

    files = Path(args.files_dir).resolve()
    files.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DATABASE_URL": args.database_url, "CHROMA_URL": args.chroma_url,
           "KBQA_FILES_DIR": str(files), "PYTHONUNBUFFERED": "1"}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kbqa-scale-") as tmp, httpx.Client(timeout=600) as http:
        work = Path(tmp)
        # This process fills as a worker-role engine whose own ingest is stopped: it keeps no BM25 index (a web
        # one would rebuild it here after every step) and claims no job (the worker process ingests the probes).
        dep = Deployment(database_url=args.database_url, chroma_url=args.chroma_url, files_dir=files, role="worker")
        engine = Engine(work / "bench", deployment=dep)
        engine.components.ingest.stop()
        worker = None
        try:
            c = engine.components
            if c.vectors.count() or c.docs.counts()["docs"]:
                raise SystemExit("the PostgreSQL database and the Chroma database must start empty")
            worker = App("worker", work / "worker", work / "worker.log", env)
            base = _texts(args.base)
            t0 = time.perf_counter()
            base_emb = np.asarray(c.models.embedding.embed_model.get_text_embedding_batch(base), dtype=np.float32)
            print(f"embedded {len(base)} base chunks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            replicas = _replicas(base, base_emb, [c.tokenizer(t) for t in base], sizes[-1],
                                 np.random.default_rng(7))  # one stream: copy k carries the marker 副本k
            worker.wait_log("入库进程已启动")
            questions = _questions(args.queries)
            filled = next_doc = 0
            for size in sizes:
                timing: dict = {}
                before, t0 = filled, time.perf_counter()
                while filled < size:
                    part = list(islice(replicas, min(FILL_BATCH, size - filled)))
                    _fill(engine, part, PER_DOC, next_doc, timing, segments=True)  # as the ingest writes them
                    next_doc += -(-len(part) // PER_DOC)
                    filled += len(part)
                engine.components.bm25.wait_idle(3600)  # the merges of what it wrote (a worker's job)
                seconds = time.perf_counter() - t0
                added = size - before
                engine.services.changes.changed()  # the KB generation moves: every process follows, as in the app
                fill = {"chunks": added, "seconds": round(seconds, 1), "s_per_10k": round(seconds / added * 1e4, 1),
                        "vectors_s": round(timing["vectors_s"], 1),
                        "chroma_chunks_per_s": round(added / timing["vectors_s"], 1)}
                rows.append(measure(size, fill, work, env, questions, args.web, http))
                print_size(rows[-1])
                write_json(args.json, rows)  # after every size: a long run that fails later keeps what it measured
        finally:
            if worker is not None:
                worker.stop()
            engine.close()
    print_growth(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
