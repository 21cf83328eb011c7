"""The load table of docs/benchmarks.md: tools.bench.bench_load at several client counts, without and with an ingest.

    python -m tools.bench.bench_load_matrix --questions FILE --ingest NOVEL [--levels 1,4,8,16] [--duration 30]
                                            [--url URL] [--json OUT]

Against a running app. For each "with ingest" cell a fresh copy of NOVEL (its text plus one marker line, so
the upload is not deduplicated) is uploaded first, so embedding runs during the whole cell; the cell reports
how many chunks the worker embedded meanwhile (from the 向量化 k/n progress of the processing documents).
"""
from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tools.bench.bench_load import load_questions, run
from tools.eval.cli import command_parser, write_json
from tools.ops.app_client import DEFAULT_URL

PROGRESS = re.compile(r"向量化 (\d+)/(\d+)")


def embedded_so_far(client: httpx.Client) -> tuple[int, int]:
    """(chunks embedded, documents processing) over the documents now 处理中."""
    items = client.get("/api/kb/documents", params={"size": 200}).json()["data"]["items"]
    busy = [d for d in items if d["status"] == "processing"]
    return sum(int(m.group(1)) for d in busy if (m := PROGRESS.search(d.get("progress") or ""))), len(busy)


def upload_copy(client: httpx.Client, novel: Path, tag: str, tmp: Path) -> None:
    copy = tmp / f"{novel.stem}-{tag}{novel.suffix}"
    copy.write_bytes(novel.read_bytes() + f"\n负载测试副本 {tag}\n".encode("gb18030"))
    with open(copy, "rb") as f:
        r = client.post("/api/kb/documents", files={"file": (copy.name, f, "text/plain")}).json()
    assert r["code"] == 0 and r["data"][0]["ok"], r


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_load_matrix", __doc__)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--ingest", required=True, help="a long document to ingest during the 'with ingest' cells")
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    questions = load_questions(Path(args.questions))
    levels = [int(x) for x in args.levels.split(",")]
    rows = []
    with httpx.Client(base_url=args.url.rstrip("/"), timeout=120) as client, \
            tempfile.TemporaryDirectory(prefix="kbqa-load-") as tmp:
        run(args.url, questions[:4], 1, None, 120)  # warm-up (first query embeds, caches)
        for ingest in (False, True):
            for n in levels:
                if ingest:
                    upload_copy(client, Path(args.ingest), f"c{n}-{int(time.time())}", Path(tmp))
                    time.sleep(3)  # past parsing, into embedding
                e0, _ = embedded_so_far(client)
                r = run(args.url, questions, n, args.duration, 120)
                e1, busy = embedded_so_far(client)
                r["ingest"] = ingest
                r["ingest_chunks_per_s"] = round(max(0, e1 - e0) / r["wall_s"], 1) if ingest else None
                r["ingest_still_running"] = bool(busy) if ingest else None
                rows.append(r)
                print(f"{'with' if ingest else 'no'} ingest, {n} clients: {r['successes']}/{r['requests']} ok, "
                      f"done p50 {r['done_s']['p50']} s, {r['throughput_per_s']}/s", file=sys.stderr, flush=True)
    print("| clients | ingest | requests | ok | failures | first event p50 / p95 / p99 s | first text p50 / p95 s "
          "| done p50 / p95 / p99 s | answers/s | ingest chunks/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f, d, t = r["first_event_s"], r["done_s"], r["first_text_s"]
        fails = ", ".join(f"{k}: {v}" for k, v in sorted(r["failures_by_code"].items())) or "0"
        print(f"| {r['concurrency']} | {'yes' if r['ingest'] else 'no'} | {r['requests']} | {r['successes']} | {fails} "
              f"| {f['p50']} / {f['p95']} / {f['p99']} | {t['p50']} / {t['p95']} | {d['p50']} / {d['p95']} / {d['p99']} "
              f"| {r['throughput_per_s']} | {r['ingest_chunks_per_s'] if r['ingest'] else '—'} |")
    write_json(args.json, rows)
    return 0 if all(not r["failures"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
