"""Latency the LLM multi-query adds to a question, against the scripted OpenAI-compatible server, old and new in
one run.

    python -m tools.bench.bench_multi_query [--docs 6] [--questions 40] [--rounds 2] [--llm-ms 0]

A fresh engine (the configured embedding model) on a temp dir holds the regulations the first `--docs` distinct
files of tests/data/regulations_dev name; its answerable questions are asked through `Engine.ask` with the
scripted LLM of the tests (tests/fake_llm.py) configured, alternately with `llm_multi_query` off (old) and on
(new). Per question: retrieval = from the call to the `trace` event (query rewrite, multi-query call, embedding,
both routes, fusion, gate, rerank), total = to `done`; the LLM calls the question made (new must make exactly one
more). The scripted server answers the multi-query call at once (or after `--llm-ms`): the rows show what the
app adds around the call — the extra embeddings, route searches and completions — and the call's own wall time
over local HTTP; a real model adds its own response time on top (about one short completion).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline import events as ev
from pipeline.conversation.multi_query import EXPAND_SYSTEM

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "tests" / "data" / "regulations_dev" / "questions.json"
REGULATIONS = Path("/work/shared/data/regulations")


def scripted_server(llm_ms: float):
    # the scripted server is the tests' own (tests/fake_llm.py)
    import jieba

    from tests.fake_llm import FakeLLMServer

    server = FakeLLMServer().start()

    def respond(body: dict) -> str:
        if body["messages"][0]["content"] != EXPAND_SYSTEM:
            return "依据资料，答案见第一份资料[1]。"
        time.sleep(llm_ms / 1000)
        q = body["messages"][-1]["content"].split("<question>\n", 1)[-1].split("\n</question>", 1)[0]
        words = [w for w in jieba.lcut(q) if len(w) >= 2][:4]
        return json.dumps({"queries": [f"关于{q}的规定", f"{q}的法律依据"], "keywords": words}, ensure_ascii=False)

    server.responder = respond
    return server


def ask_once(engine, question: str) -> tuple[float, float, float | None]:
    """(ms to the trace, ms to done, the multi-query call's ms or None)"""
    t0 = time.perf_counter()
    retrieval, call = None, None
    for e in engine.ask(question):
        if e.type is ev.EventType.TRACE and retrieval is None:
            retrieval = (time.perf_counter() - t0) * 1000
            call = ((e.data.get("query") or {}).get("expansion") or {}).get("ms")
        elif e.type is ev.EventType.ERROR:
            raise RuntimeError(e.data)
    return retrieval or 0.0, (time.perf_counter() - t0) * 1000, call


def _p(xs: list[float]) -> str:
    return f"{np.percentile(xs, 50):8.1f} {np.percentile(xs, 95):8.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.bench_multi_query", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=6, help="distinct regulation files ingested")
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llm-ms", type=float, default=0.0, help="the scripted multi-query call's own delay")
    args = ap.parse_args(argv)

    from pipeline.engine import Engine

    items = json.loads(QUESTIONS.read_text(encoding="utf-8"))["answerable"]
    files = list(dict.fromkeys(it["file"] for it in items))[:args.docs]
    questions = [it["question"] for it in items if it["file"] in files][:args.questions]
    server = scripted_server(args.llm_ms)
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Path(tmp) / "data")
        try:
            res = engine.upload([(f, REGULATIONS / f) for f in files])
            assert all(r.ok for r in res), res
            t0 = time.perf_counter()
            assert engine.wait_idle(1800), "ingest did not finish"
            print(f"embedding model {engine.components.models.embedding.model_id}; "
                  f"{len(files)} regulations, {engine.health()['chunks']} chunks, ingest {time.perf_counter() - t0:.0f} s;"
                  f" {len(questions)} questions × {args.rounds} rounds; scripted multi-query delay {args.llm_ms:g} ms")
            engine.update_settings({"llm": {"llm_api_url": server.base_url, "llm_model": "fake-model"}})
            engine.reload()
            while engine.state != "ready":
                time.sleep(0.1)
            rows: dict[str, dict[str, list[float]]] = {m: {"retrieval": [], "total": [], "calls": [], "call_ms": []}
                                                        for m in ("old", "new")}
            ask_once(engine, questions[0])  # warm both paths
            for r in range(args.rounds):
                for i, q in enumerate(questions):
                    order = ("old", "new") if (i + r) % 2 == 0 else ("new", "old")
                    for mode in order:
                        engine.update_settings({"llm": {"llm_multi_query": mode == "new"}})
                        server.reset()
                        ret, total, call = ask_once(engine, q)
                        if call is not None:
                            rows[mode]["call_ms"].append(call)
                        rows[mode]["retrieval"].append(ret)
                        rows[mode]["total"].append(total)
                        rows[mode]["calls"].append(len(server.chat_requests))
        finally:
            engine.close()
            server.stop()
    print(f"{'':22}{'p50 ms':>8} {'p95 ms':>8}   LLM calls per question")
    for mode, label in (("old", "multi-query off (old)"), ("new", "multi-query on (new)")):
        calls = sorted(set(rows[mode]["calls"]))
        print(f"retrieval {label:12} {_p(rows[mode]['retrieval'])}   {calls}")
        print(f"total     {label:12} {_p(rows[mode]['total'])}")
    added = np.array(rows["new"]["retrieval"]) - np.array(rows["old"]["retrieval"])
    print(f"added to retrieval (new − old, paired) p50 {np.percentile(added, 50):.1f} ms, "
          f"p95 {np.percentile(added, 95):.1f} ms")
    print(f"of which the multi-query LLM call (scripted, local HTTP) {_p(rows['new']['call_ms'])}")
    extra = {n - o for n, o in zip(rows["new"]["calls"], rows["old"]["calls"])}
    print(f"LLM calls added per question: {sorted(extra)}")
    return 0 if extra == {1} else 1


if __name__ == "__main__":
    sys.exit(main())
