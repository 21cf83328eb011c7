"""Answer-level evaluation: what a user gets from the full answer path (gate → extractive answer), per question.

    python -m tools.eval.answer_eval --kb-cache DIR --set NAME [--limit N]     # on a cached dev-set KB
    python -m tools.eval.evaluate --squad FILE --answers                       # on the KB evaluate builds

answer-hit: the answer text (bold marks and [n] removed) holds a gold answer string (DuReader: an answer
sentence shares ≥ 12 characters in a row with a gold answer span, tools/eval/devsets.holds_answer);
top-1-source-hit: the first source holds one — the ceiling of an extractive answer. Also: refused by the gate,
weak-evidence banner, 「资料中未找到…」, sentences per answer, and the answer path's p50/p95 latency.
"""
from __future__ import annotations

import random
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root, write_json
from tools.eval.devsets import DEV_SETS, DevSet, dureader_spans, holds_answer, load_corpus, shared_data_dir
from tools.eval.kb_cache import open_copy

_MARKS = re.compile(r"\*\*|\[\d{1,3}\]")


def open_for_eval(root: Path, ds: DevSet, into: Path):
    """A copy of the cached KB of `ds` (built first if needed; its gate background measured on all its chunks:
    kb_cache.open_copy), idle, on the shipped gate floor; (engine, key_to_doc)."""
    engine, key_to_doc = open_copy(root, ds, into)
    # the stored settings of a cached KB may predate the current defaults: evaluate the shipped ones
    engine.update_settings({"min_similarity": engine.default_settings().min_similarity})
    return engine, key_to_doc


def answer_metrics(engine, questions, spans: dict[str, list[str]] | None = None, keep_rows: bool = False) -> dict:
    """The metrics below over `questions`; keep_rows adds each question's row (outcome flags, gate score, the answer)."""
    spans = spans or {}
    rows = []
    for q in questions:
        t0 = time.perf_counter()
        r = engine.ask_sync(q.text)
        ms = (time.perf_counter() - t0) * 1000
        sp = spans.get(q.text, [])
        lines = [_MARKS.sub("", ln).lstrip("- ").strip() for ln in r["answer"].split("\n")[1:]]
        refused = not r["sources"]
        not_found = bool(r["no_answer"]) and not refused  # the reader's 「资料中未找到…」, its sources kept
        hit = not refused and not not_found and any(holds_answer(ln, q.answers, sp) for ln in lines if ln)
        top1 = bool(r["sources"]) and holds_answer(r["sources"][0]["text"], q.answers, sp)
        rows.append({"q": q.text, "hit": hit, "top1": top1, "refused": refused, "weak": bool(r.get("weak")),
                     "not_found": not_found, "sentences": 0 if refused or not_found else len(lines), "ms": ms,
                     "score": ((r.get("trace") or {}).get("gate") or {}).get("score"), "answer": r["answer"]})
    n = max(len(rows), 1)
    answered = [x for x in rows if not x["refused"] and not x["not_found"]]
    return {
        "questions": len(rows),
        "answer_hit": round(sum(x["hit"] for x in rows) / n, 4),
        "top1_source_hit": round(sum(x["top1"] for x in rows) / n, 4),
        "refused": round(sum(x["refused"] for x in rows) / n, 4),
        "weak": round(sum(x["weak"] for x in rows) / n, 4),
        "not_found": round(sum(x["not_found"] for x in rows) / n, 4),
        "sentences": round(float(np.mean([x["sentences"] for x in answered])), 2) if answered else 0.0,
        "p50_ms": round(float(np.percentile([x["ms"] for x in rows], 50)), 1) if rows else None,
        "p95_ms": round(float(np.percentile([x["ms"] for x in rows], 95)), 1) if rows else None,
    } | ({"rows": rows} if keep_rows else {})


def print_answers(name: str, m: dict) -> None:
    print(f"\nanswers on {name} ({m['questions']} questions, extractive mode)")
    print("| answer-hit | top-1-source-hit | refused | weak | 未找到 | sentences | p50 ms | p95 ms |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {m['answer_hit']:.3f} | {m['top1_source_hit']:.3f} | {m['refused']:.1%} | {m['weak']:.1%} | "
          f"{m['not_found']:.1%} | {m['sentences']} | {m['p50_ms']} | {m['p95_ms']} |")


def main(argv=None) -> int:
    ap = command_parser("tools.eval.answer_eval", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--set", required=True, choices=list(DEV_SETS))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rows", action="store_true", help="keep every question's row (its answer too) in --json")
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    ds = DEV_SETS[args.set]
    qs = [q for q in load_corpus(ds).questions if q.text.strip()]  # cmrc_trial has 2 blank ones: ask_sync refuses them
    if args.limit and args.limit < len(qs):
        qs = random.Random(13).sample(qs, args.limit)
    spans = dureader_spans(shared_data_dir() / ds.path) if ds.kind == "dureader" else {}
    with tempfile.TemporaryDirectory(prefix="kbqa-ans-") as tmp:
        engine, _ = open_for_eval(root, ds, Path(tmp) / args.set)
        m = answer_metrics(engine, qs, spans, keep_rows=args.rows)
        engine.close()
    print_answers(args.set, m)
    write_json(args.json, m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
