"""Everyday questions against formal documents (issue 25): the regulations dev set through the real answer path.

    python -m tools.eval.formal_eval --kb-cache /work/cache/kb [--limit N] [--json OUT] [--questions FILE | --all-sets]

Builds once (tools/eval/kb_cache: flock, READY) the knowledge base `regulations` of the 160 files of
../shared/data/regulations (uploaded as the .md files they are, the packaged default embedding model), then asks
offline, as a user would through `ask_sync` (gate → extractive answer):
- the answerable questions of tests/data/regulations_dev/questions.json: deciding span among the 6 sources, right
  document first, extractive answer-hit, refused (gate or 「资料中未找到」) — overall and per question type;
- the unanswerable ones (the rule lives in a law not in the KB): refused / weak / answered as if;
- everyday off-topic questions (tests/data/offtopic_everyday.txt): refused / weak / answered;
- the follow-up pairs: the follow-up asked in its conversation (first question, then the follow-up with the same
  conversation_id: the app's rewrite runs) and asked alone: its gold span among the sources;
- new questions inside a conversation (the guard of the follow-up rules): after each pair's first question, the
  first question of the next pair on another regulation (its gold span among the sources, in the conversation and
  alone) and an unanswerable question of the set (its outcome, in the conversation and alone).
The rules of each outcome: tools/eval/formal_metrics.py. `--limit N` keeps N of each list (seeded sample).
`regulations` is not in tools/eval/devsets.DEV_SETS: calibration does not fit on it (it is the held-out family).
`--questions` asks another set of the same form over the same knowledge base (tests/data/regulations_dev2 and
regulations_holdout: written blind by other writers, on regulations the dev set does not use, development material
since; tests/data/regulations_holdout2: the blind one, on regulations no other set uses). `--all-sets` asks the four
sets in one run over one copy of the knowledge base and ends with their summary side by side, beside issue 25's goals
(the table a closing note reports); the JSON then holds each set's metrics and rows under its name.
"""
from __future__ import annotations

import random
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from tools.eval.answer_eval import open_for_eval
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root, print_md_table, write_json
from tools.eval.devsets import REPO
from tools.eval.formal_metrics import answer_hit, bold_hit, outcome, right_doc_first, share_of, span_in_sources
from tools.eval.regulations_devset import OTHER_SETS, QUESTIONS, REGULATIONS, DevItems, load_items

OFF_TOPIC = REPO / "tests" / "data" / "offtopic_everyday.txt"


def load_lines(path: Path) -> list[str]:
    """One question a line; '#' lines are comments."""
    return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.startswith("#")]


def _brief(r: dict) -> dict:
    return {"answer": r["answer"], "sources": [s.get("doc_name") for s in r["sources"]], "weak": r["weak"]}


class Asker:
    """The engine asked as the harness asks: a question on its own is asked once, however many lists ask it (the
    switch rows and the follow-ups' "alone" ask again what the lists asked); a conversation is always a new one."""

    def __init__(self, engine):
        self.engine = engine
        self._alone: dict[str, dict] = {}

    def alone(self, question: str) -> dict:
        if question not in self._alone:
            self._alone[question] = self.engine.ask_sync(question)
        return self._alone[question]

    def after(self, first: str, question: str) -> dict:
        """`question` asked right after `first`, in a conversation of their own."""
        conv = self.engine.ask_sync(first)["conversation_id"]
        return self.engine.ask_sync(question, conversation_id=conv)


def ask_answerable(ask: Asker, items, key_to_doc: dict[str, int]) -> list[dict]:
    rows = []
    for a in items:
        r = ask.alone(a.question)
        rows.append({"id": a.id, "type": a.type, "q": a.question, "span": a.gold.span, "file": a.gold.file,
                     "in_sources": span_in_sources(r["sources"], a.gold.span),
                     "doc_first": right_doc_first(r["sources"], key_to_doc.get(a.gold.file)),
                     "hit": answer_hit(r["answer"], a.gold.span) if r["sources"] else False,
                     "bold_hit": bold_hit(r["answer"], a.gold.span) if r["sources"] else False,
                     "outcome": outcome(r), "gate_refused": not r["sources"]} | _brief(r))
    return rows


def ask_plain(ask: Asker, questions: list[tuple[str, str]]) -> list[dict]:
    """(id, question) pairs asked alone; the outcome only (unanswerable and off-topic questions)."""
    return [{"id": i, "q": q, "outcome": outcome(r)} | _brief(r)
            for i, q in questions for r in [ask.alone(q)]]


def ask_followups(ask: Asker, items) -> list[dict]:
    rows = []
    for f in items:
        within, alone = ask.after(f.first, f.followup), ask.alone(f.followup)
        rows.append({"id": f.id, "q": f.followup, "span": f.followup_gold.span,
                     "rewritten": within.get("rewritten_query"),
                     "in_conversation": span_in_sources(within["sources"], f.followup_gold.span),
                     "alone": span_in_sources(alone["sources"], f.followup_gold.span),
                     "hit_in_conversation": answer_hit(within["answer"], f.followup_gold.span)
                     if within["sources"] else False} | _brief(within))
    return rows


def topic_switches(items, off_topic: Sequence[str] = (), every: bool = False) -> list[tuple]:
    """New questions asked inside a conversation, the guard of every follow-up rule. By default, after the first
    question of each follow-up pair: the first question of the next pair on another regulation (answerable) and an
    unanswerable question of the set. `every`: each answerable question after the answerable question before it on
    another regulation, and each unanswerable and off-topic question after an answerable one. Each a (kind, first,
    question id, question, gold span or None)."""
    if every:
        ans = items.answerable
        if not ans:  # every new question comes after an answerable one
            return []
        rows = []
        for i, a in enumerate(ans):
            before = [b for b in ans[:i][::-1] + ans[i + 1:][::-1] if b.gold.file != a.gold.file]
            prev = before[0] if before else None
            if prev is not None:
                rows.append(("answerable", prev.question, f"{prev.id}>{a.id}", a.question, a.gold.span))
        rows += [("unanswerable", ans[i % len(ans)].question, f"{ans[i % len(ans)].id}>{u.id}", u.question, None)
                 for i, u in enumerate(items.unanswerable)]
        rows += [("off_topic", ans[i % len(ans)].question, f"{ans[i % len(ans)].id}>o{i + 1:03d}", q, None)
                 for i, q in enumerate(off_topic)]
        return rows
    fol, rows = items.followups, []
    for i, f in enumerate(fol):
        other = next((g for g in fol[i + 1:] + fol[:i] if g.first_gold.file != f.first_gold.file), None)
        if other is not None:
            rows.append(("answerable", f.first, f"{f.id}>{other.id}", other.first, other.first_gold.span))
    return rows + [("unanswerable", f.first, f"{f.id}>{u.id}", u.question, None)
                   for f, u in zip(fol, items.unanswerable)]


def ask_switches(ask: Asker, switches: list[tuple]) -> list[dict]:
    """Each new question asked after its first question in one conversation, and alone: for the answerable ones,
    is its gold span in the sources both ways; for the others, the outcome both ways."""
    rows = []
    for kind, first, qid, q, span in switches:
        within, alone = ask.after(first, q), ask.alone(q)
        row = {"id": qid, "q": q, "kind": kind, "rewritten": within.get("rewritten_query"),
               "outcome_in_conversation": outcome(within), "outcome_alone": outcome(alone)}
        if span is not None:
            row |= {"in_conversation": span_in_sources(within["sources"], span),
                    "alone": span_in_sources(alone["sources"], span)}
        row["changed"] = (row["outcome_in_conversation"] != row["outcome_alone"]
                          or row.get("in_conversation") != row.get("alone"))
        rows.append(row | _brief(within))
    return rows


OUTCOMES = ("refused", "weak", "answered")


def outcomes(rows: list[dict]) -> dict:
    return {k: share_of(rows, "outcome", k) for k in OUTCOMES}


def switch_summary(rows: list[dict]) -> dict:
    """Answerable new questions: gold span in sources in the conversation / alone; unanswerable and off-topic ones:
    the outcomes in the conversation / alone; `changed`: how many came out otherwise than asked alone."""
    ans = [r for r in rows if r["kind"] == "answerable"]
    out = {"n": len(ans), "in_conversation": share_of(ans, "in_conversation"), "alone": share_of(ans, "alone"),
           "changed": sum(1 for r in rows if r["changed"]), "asked": len(rows)}
    for kind in ("unanswerable", "off_topic"):
        rs = [r for r in rows if r["kind"] == kind]
        if rs:
            out[kind] = {"n": len(rs),
                         "in_conversation": {k: share_of(rs, "outcome_in_conversation", k) for k in OUTCOMES},
                         "alone": {k: share_of(rs, "outcome_alone", k) for k in OUTCOMES}}
    return out


def summarize(ans: list[dict], unans: list[dict], off: list[dict], fol: list[dict],
              switches: list[dict] | None = None) -> dict:
    by_type = defaultdict(list)
    for r in ans:
        by_type[r["type"]].append(r)
    return {
        "answerable": {"n": len(ans), "span_in_sources": share_of(ans, "in_sources"),
                       "doc_first": share_of(ans, "doc_first"), "answer_hit": share_of(ans, "hit"),
                       "bold_hit": share_of(ans, "bold_hit"),
                       "refused": share_of(ans, "outcome", "refused"), "gate_refused": share_of(ans, "gate_refused"),
                       "weak": share_of(ans, "outcome", "weak"),
                       "by_type": {t: {"n": len(rs), "answer_hit": share_of(rs, "hit"),
                                       "span_in_sources": share_of(rs, "in_sources")}
                                   for t, rs in sorted(by_type.items())}},
        "unanswerable": {"n": len(unans)} | outcomes(unans),
        "off_topic": {"n": len(off)} | outcomes(off),
        "followups": {"n": len(fol), "in_conversation": share_of(fol, "in_conversation"),
                      "alone": share_of(fol, "alone"), "answer_hit_in_conversation": share_of(fol, "hit_in_conversation")},
    } | ({"switches": switch_summary(switches)} if switches is not None else {})


def print_report(m: dict, name: str = "regulations_dev") -> None:
    a, u, o, f = m["answerable"], m["unanswerable"], m["off_topic"], m["followups"]
    print(f"\nformal documents ({name}), extractive mode; answerable {a['n']}, unanswerable {u['n']}, "
          f"off-topic {o['n']}, follow-up pairs {f['n']}")
    print_md_table(["what", "measured"], [
        ["the deciding span is among the 6 sources", f"{a['span_in_sources']:.3f}"],
        ["right document first", f"{a['doc_first']:.3f}"],
        ["answer holds the deciding words (extractive answer-hit)", f"{a['answer_hit']:.3f}"],
        ["its bold holds them (stricter: the clause the picker chose)", f"{a['bold_hit']:.3f}"],
        ["answerable questions refused (gate / 未找到)",
         f"{a['refused']:.3f} ({a['gate_refused']:.3f} / {a['refused'] - a['gate_refused']:.3f})"],
        ["answerable questions weak", f"{a['weak']:.3f}"],
        ["same-domain unanswerable: refused / weak / answered as if",
         f"{u['refused']:.3f} / {u['weak']:.3f} / {u['answered']:.3f}"],
        ["everyday off-topic: refused / weak / answered", f"{o['refused']:.3f} / {o['weak']:.3f} / {o['answered']:.3f}"],
        ["follow-up in its conversation: deciding span in sources (asked alone)",
         f"{f['in_conversation']:.3f} ({f['alone']:.3f})"],
        *_switch_lines(m.get("switches")),
    ])
    print("\nanswerable by question type")
    print_md_table(["type", "n", "span in sources", "answer-hit"],
                   [[t, v["n"], f"{v['span_in_sources']:.3f}", f"{v['answer_hit']:.3f}"]
                    for t, v in a["by_type"].items()])


def _switch_lines(w: dict | None) -> list[list[str]]:
    if not w:
        return []
    lines = [[f"a new question inside a conversation: deciding span in sources (asked alone), n={w['n']}",
              f"{w['in_conversation']:.3f} ({w['alone']:.3f})"]]
    for kind in ("unanswerable", "off_topic"):
        if kind in w:
            c, a = w[kind]["in_conversation"], w[kind]["alone"]
            lines.append([f"{kind.replace('_', '-')} inside a conversation: refused / weak / answered (alone), "
                          f"n={w[kind]['n']}", " / ".join(f"{c[k]:.3f}" for k in OUTCOMES)
                          + " (" + " / ".join(f"{a[k]:.3f}" for k in OUTCOMES) + ")"])
    lines.append(["new questions whose outcome the conversation changed", f"{w['changed']} of {w['asked']}"])
    return lines


# every question set written over the regulations knowledge base, in the order the notes report them
ALL_SETS = {"regulations_dev": QUESTIONS, **OTHER_SETS}
# issue 25's goals for the formal family, beside the rows of the summary
_SUMMARY: list[tuple[str, str, Callable[[dict], str]]] = [
    ("deciding span in sources", "≥ .95", lambda m: f"{m['answerable']['span_in_sources']:.3f}"),
    ("right document first", "≥ .92", lambda m: f"{m['answerable']['doc_first']:.3f}"),
    ("extractive answer-hit", "≥ .80", lambda m: f"{m['answerable']['answer_hit']:.3f}"),
    ("answerable refused", "≤ .03", lambda m: f"{m['answerable']['refused']:.3f}"),
    ("unanswerable refused / weak / as if", "≥ .60 / – / ≤ .10",
     lambda m: " / ".join(f"{m['unanswerable'][k]:.3f}" for k in OUTCOMES)),
    ("off-topic refused", "≥ .98", lambda m: f"{m['off_topic']['refused']:.3f}"),
    ("follow-ups in conversation", "≥ .85", lambda m: f"{m['followups']['in_conversation']:.3f}"),
]


def print_summary(results: dict[str, dict]) -> None:
    """The sets side by side, one row per goal of issue 25."""
    blind = " (regulations_holdout2 written blind)" if "regulations_holdout2" in results else ""
    print(f"\nthe formal sets side by side{blind}")
    print_md_table(["what", *results, "goal"],
                   [[label, *(cell(m) for m in results.values()), goal] for label, goal, cell in _SUMMARY])


def sample(xs: list, limit: int | None) -> list:
    return random.Random(13).sample(xs, limit) if limit and limit < len(xs) else xs


def evaluate(engine, key_to_doc: dict[str, int], items: DevItems, off_topic: list[str],
             limit: int | None = None, every: bool = False) -> tuple[dict, dict]:
    items = replace(items, answerable=sample(items.answerable, limit), unanswerable=sample(items.unanswerable, limit),
                    followups=sample(items.followups, limit))
    off_topic = sample(off_topic, limit)
    ask = Asker(engine)
    ans = ask_answerable(ask, items.answerable, key_to_doc)
    unans = ask_plain(ask, [(u.id, u.question) for u in items.unanswerable])
    off = ask_plain(ask, [(f"o{i:03d}", q) for i, q in enumerate(off_topic, 1)])
    fol = ask_followups(ask, items.followups)
    sw = ask_switches(ask, topic_switches(items, off_topic, every))
    rows = {"answerable": ans, "unanswerable": unans, "off_topic": off, "followups": fol, "switches": sw}
    return summarize(ans, unans, off, fol, sw), rows


def main(argv=None) -> int:
    ap = command_parser("tools.eval.formal_eval", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--limit", type=int, default=None, help="ask N of each list (seeded sample)")
    ap.add_argument("--json", type=Path, default=None, help="write the metrics and every question's row here")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--questions", type=Path, default=QUESTIONS, help="the question set (default: regulations_dev)")
    which.add_argument("--all-sets", action="store_true", help="every set of ALL_SETS in one run, then their summary")
    ap.add_argument("--every-switch", action="store_true",
                    help="ask every answerable, unanswerable and off-topic question also right after an unrelated one")
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    sets = ALL_SETS if args.all_sets else {args.questions.parent.name: args.questions}
    results: dict[str, dict] = {}
    off_topic = load_lines(OFF_TOPIC)  # asked under every set
    with tempfile.TemporaryDirectory(prefix="kbqa-formal-") as tmp:
        engine, key_to_doc = open_for_eval(root, REGULATIONS, Path(tmp) / REGULATIONS.name)
        try:
            for name, path in sets.items():
                m, rows = evaluate(engine, key_to_doc, load_items(path), off_topic, args.limit, args.every_switch)
                print_report(m, name)
                results[name] = m | {"rows": rows}
        finally:
            engine.close()
    if args.all_sets:
        print_summary(results)
    write_json(args.json, results if args.all_sets else next(iter(results.values())), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
