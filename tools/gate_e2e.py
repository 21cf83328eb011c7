"""End-to-end outcome in extractive mode (no LLM): the gate, then the extractive picker's 「资料中未找到…」.

    python -m tools.gate_e2e --kb-cache DIR --dumps GATE_DIR [--answerable 150] [NAME ...]

The gate's own refusals are decided exactly as in tools/calibrate_gate.py's leave-one-set-out (the left-out
set's model is fitted on the other sets); a question the gate lets through (answer or weak) is retrieved on the
left-out set's knowledge base and handed to the shipped extractive picker, which either quotes sentences or says
「资料中未找到直接回答该问题的内容」. Reported per left-out set, for its out-of-KB questions and a sample of its
answerable ones, as separate columns: the gate's refusals are NOT relabelled — "no answer end to end" is gate
refusals plus 「未找到」 after the gate. (The picker's parameters are the shipped ones, fitted on all sets by
tools/calibrate_extractive.py; its own leave-one-set-out numbers are in docs/retrieval-eval.md.)
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from tools.calibrate_gate import leave_one_set_out, load
from tools.cli import print_md_table


def _picker_found(engine, question: str) -> bool:
    c, s = engine.components, engine.settings
    res = c.retrieval.retrieve(question, s)
    nodes = res.final or res.fused[: s.final_top_k]  # the app's gate may differ from the left-out model
    return bool(nodes) and c.picker.pick(question, nodes, res.query_embedding).found


def run_set(name: str, rows: list[dict], model, root: Path, answerable: int) -> dict:
    from pipeline.retrieval.gate import REFUSE, GateModel, decide
    from tools.kb_cache import DEV_SETS, open_copy

    m = GateModel(**{k: tuple(v) if isinstance(v, list) else v for k, v in model.items()})
    bg = rows[0]["bg"]
    ook = [r for r in rows if r["kind"] == "out_of_kb"]
    ans = [r for r in rows if r["kind"] == "answerable"]
    ans = random.Random(14).sample(ans, min(answerable, len(ans)))
    out = {"out_of_kb": len(ook), "answerable": len(ans)}
    with tempfile.TemporaryDirectory(prefix="kbqa-e2e-") as tmp:
        engine, _ = open_copy(root, DEV_SETS[name], Path(tmp) / name)
        engine.wait_idle()
        for kind, group in (("ook", ook), ("ans", ans)):
            refused = not_found = 0
            for r in group:
                if decide(r["feat"], bg, 0.0, True, m).outcome == REFUSE:
                    refused += 1
                elif not _picker_found(engine, r["q"]):
                    not_found += 1
            out[f"{kind}_refused"], out[f"{kind}_not_found"] = refused / len(group), not_found / len(group)
        engine.close()
    return out


def main(argv=None) -> int:
    from tools.cli import add_kb_cache, kb_cache_root

    ap = argparse.ArgumentParser(prog="python -m tools.gate_e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_kb_cache(ap)
    ap.add_argument("--dumps", required=True, type=Path, help="folder of tools.gate_dataset outputs")
    ap.add_argument("--answerable", type=int, default=150, help="answerable questions sampled per set")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    rows, bg = load(args.dumps)
    loso = leave_one_set_out(rows, bg)
    table = []
    for name in args.names or sorted(bg):
        own = [r | {"bg": bg[name]} for r in rows if r["kb"] == name]
        m = run_set(name, own, loso[name]["model"], root, args.answerable)
        table.append([name, m["out_of_kb"], f"{m['ook_refused']:.1%}", f"{m['ook_not_found']:.1%}",
                      f"{m['ook_refused'] + m['ook_not_found']:.1%}", m["answerable"], f"{m['ans_refused']:.1%}",
                      f"{m['ans_not_found']:.1%}", f"{1 - m['ans_refused'] - m['ans_not_found']:.1%}"])
        print(f"{name}: done", file=sys.stderr)
    print_md_table(["left-out set", "out-of-KB", "gate refused", "passed gate → 「未找到」",
                    "no answer end to end", "answerable (sample)", "gate refused", "passed gate → 「未找到」",
                    "answered with sentences"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
