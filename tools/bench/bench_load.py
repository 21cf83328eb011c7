"""Load benchmark of a running app over HTTP: N clients asking questions through the SSE answer stream.

    python -m tools.bench.bench_load --concurrency N --questions FILE [--duration S] [--url URL] [--user U]
                                     [--timeout T] [--json OUT]

FILE: one question per line (.txt) or a JSON list of strings. Without --duration every question is asked
once, spread over the clients; with it, each client cycles through the questions (client i starting at
question i) until S seconds have passed (requests in flight then finish). A request succeeds only when its
stream ends with a `done` event; anything else is a failure, counted by code: the `error` event's code
(2001 LLM, 2002 engine busy …), `http_<status>` (with the envelope code when there is one), `no_done`
(stream ended early), `timeout`, `connect`. Never retries. Prints successes, failures by code, p50/p95/p99
time to the first event and to `done` (and to the first answer text, `delta`), and throughput (successes per
second of wall time).
Exit status 1 on any failure (or when nothing was asked).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from tools.eval.cli import command_parser, write_json
from tools.ops.app_client import DEFAULT_URL


@dataclass
class Outcome:
    ok: bool
    code: str = ""
    first_s: float | None = None  # time to the first complete SSE event
    done_s: float | None = None
    text_s: float | None = None  # time to the first answer text (`delta`): what a reader waits for


def load_questions(path: Path) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    if Path(path).suffix == ".json":
        qs = json.loads(text)
        if not isinstance(qs, list) or not all(isinstance(q, str) for q in qs):
            raise ValueError(f"{path}: 需要一个字符串列表")
    else:
        qs = text.splitlines()
    qs = [q.strip() for q in qs if q.strip()]
    if not qs:
        raise ValueError(f"{path}: 没有问题")
    return qs


def ask(client: httpx.Client, question: str, timeout: float) -> Outcome:
    """One question through POST /api/qa/ask; no retry. Events are parsed as they arrive."""
    t0 = time.perf_counter()
    first = text = None
    last_event = None
    try:
        with client.stream("POST", "/api/qa/ask", json={"question": question}, timeout=timeout) as r:
            if r.status_code != 200:
                body = r.read()
                try:
                    code = json.loads(body).get("code")
                except ValueError:
                    code = None
                return Outcome(False, f"http_{r.status_code}" + (f"_{code}" if code else ""))
            event, data = None, None
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
                elif line == "" and event:
                    if first is None:
                        first = time.perf_counter() - t0
                    if text is None and event == "delta":
                        text = time.perf_counter() - t0
                    last_event = event
                    if event == "error":
                        try:
                            return Outcome(False, str(json.loads(data or "{}").get("code", "error")), first)
                        except ValueError:
                            return Outcome(False, "error", first)
                    if event == "done":
                        return Outcome(True, "", first, time.perf_counter() - t0, text)
                    event, data = None, None
    except httpx.TimeoutException:
        return Outcome(False, "timeout", first)
    except httpx.HTTPError:
        return Outcome(False, "connect" if first is None else "broken_stream", first)
    return Outcome(False, "no_done" if last_event != "done" else "", first)


def run(url: str, questions: list[str], concurrency: int, duration: float | None, timeout: float,
        auth: tuple[str, str] | None = None) -> dict:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    t_start = time.perf_counter()
    deadline = t_start + duration if duration else None
    shared = iter(range(len(questions)))  # without --duration: each question once, first come first served

    def client_loop(i: int) -> None:
        with httpx.Client(base_url=url.rstrip("/"), auth=auth) as client:
            k = i
            while True:
                if deadline is None:
                    with lock:
                        k = next(shared, None)
                    if k is None:
                        return
                elif time.perf_counter() >= deadline:
                    return
                out = ask(client, questions[k % len(questions)], timeout)
                with lock:
                    outcomes.append(out)
                k += 1

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    ok = [o for o in outcomes if o.ok]

    def pcts(xs: list[float]) -> dict:
        if not xs:
            return {"p50": None, "p95": None, "p99": None}
        return {f"p{p}": round(float(np.percentile(xs, p)), 3) for p in (50, 95, 99)}

    return {"url": url, "concurrency": concurrency, "duration_s": duration, "requests": len(outcomes),
            "successes": len(ok), "failures": len(outcomes) - len(ok),
            "failures_by_code": dict(Counter(o.code for o in outcomes if not o.ok)),
            "first_event_s": pcts([o.first_s for o in ok]), "done_s": pcts([o.done_s for o in ok]),
            "first_text_s": pcts([o.text_s for o in ok if o.text_s is not None]),
            "done_s_in_order": [round(o.done_s, 3) for o in ok],  # as they finished
            "throughput_per_s": round(len(ok) / wall, 2) if wall else 0.0, "wall_s": round(wall, 2)}


def render(r: dict) -> str:
    f, d, t = r["first_event_s"], r["done_s"], r["first_text_s"]
    codes = ", ".join(f"{k}: {v}" for k, v in sorted(r["failures_by_code"].items())) or "无"
    return (f"并发 {r['concurrency']} · 请求 {r['requests']} · 成功 {r['successes']} · 失败 {r['failures']}（{codes}）\n"
            f"首个事件 p50/p95/p99 {f['p50']} / {f['p95']} / {f['p99']} s · 首段答案 p50/p95 {t['p50']} / {t['p95']} s"
            f" · done p50/p95/p99 "
            f"{d['p50']} / {d['p95']} / {d['p99']} s · 吞吐 {r['throughput_per_s']} 问/秒 · 用时 {r['wall_s']} s")


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_load", __doc__)
    ap.add_argument("--concurrency", type=int, required=True, help="parallel clients")
    ap.add_argument("--questions", required=True, help="questions file (.txt lines or a .json list)")
    ap.add_argument("--duration", type=float, default=None, help="seconds to keep asking (default: each once)")
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--user", default=None, help="login when the app runs with --auth (password: KBQA_PASSWORD)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or (args.duration is not None and args.duration <= 0):
        ap.error("--concurrency 必须 ≥ 1，--duration 必须 > 0")
    try:
        questions = load_questions(Path(args.questions))
    except (OSError, ValueError) as exc:
        print(f"无法读取问题文件：{exc}", file=sys.stderr)
        return 1
    auth = (args.user, os.environ.get("KBQA_PASSWORD", "")) if args.user else None
    result = run(args.url, questions, args.concurrency, args.duration, args.timeout, auth)
    print(render(result))
    write_json(args.json, result)
    return 0 if result["requests"] and not result["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
