"""What a team gets from a small knowledge base of whole articles — the setting the issues measure on.

    python -m tools.eval.small_kb_check [--squad FILE] [--articles 30] [--seed 0] [--search FILE] [--commas] [--json OUT]

The dev-set knowledge bases of tools/eval/kb_cache.py hold every passage of a set as its own document (240 to 8,800
chunks). A team's knowledge base is often a few dozen whole documents, and the gate's per-KB background, the
IDF and the fusion's min-max all see a different population there. This command builds one such knowledge base
in a temp dir — N whole articles of a SQuAD-format set (one document each, its paragraphs joined), drawn with
--seed — and asks, through the engine's answer path in extractive mode (no LLM):
  * answerable: questions of those articles — false refusals, weak banner, answer-hit, top-1-source-hit;
  * out of KB, same style: questions of the set's other articles (dropped when one of their answer strings
    stands in the fused top 6 here: not a clean negative, as in tools/eval/calibrate_gate.py);
  * out of KB, search questions: DuReader search questions (--search; default the demo dev file).
It prints the routes' retrieval metrics on that KB (tools.eval.evaluate), the outcomes at the shipped gate, and the
gate's trade-off on this KB: the out-of-KB refusals a threshold placed at this KB's own 1/2/3/5% quantile of
answerable scores would give (a per-KB oracle: it needs labels; it shows whether a shortfall is the threshold's
place or the evidence itself). Nothing here is fitted: it is a check, not a calibration.

--commas asks the same questions of the same articles with every sentence end (。！？；) turned into a comma: text
whose sentences are separated by commas only, as court judgments and text pasted from OCR run, where a sentence
splitter finds whole paragraphs (the answer's clause runs, pipeline/generation/sentences.py, are what it checks).
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

from tools.eval.answer_eval import answer_metrics
from tools.eval.cli import command_parser, print_md_table, write_json
from tools.eval.devsets import Corpus, Question, load_dureader, shared_data_dir
from tools.eval.evaluate import evaluate
from tools.eval.kb_cache import build_kb

ORACLE_FR = (0.01, 0.02, 0.03, 0.05)
ROUTES = ("bm25", "vector", "rrf", "fused_no_prior", "fused", "union_oracle")  # fused_no_prior: without the prior


_SENTENCE_END = str.maketrans({"。": "，", "！": "，", "？": "，", "；": "，"})


def comma_only(text: str) -> str:
    """The text with its sentences separated by commas only."""
    return text.translate(_SENTENCE_END)


def articles_corpus(path: Path, articles: int, seed: int, commas: bool = False) -> tuple[Corpus, list[Question]]:
    """N whole articles as documents with their questions, and the questions of the set's other articles;
    `commas`: the articles' text and every answer string comma-only."""
    fix = comma_only if commas else (lambda t: t)
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    order = random.Random(seed).sample(range(len(data)), len(data))
    inside, outside = order[:articles], order[articles:]
    docs: dict[str, str] = {}
    qs: list[Question] = []
    for ai in inside:
        key = f"article{ai}"
        docs[key] = "\n\n".join(fix(p["context"]) for p in data[ai]["paragraphs"])
        qs += [Question(qa["question"], {key}, [fix(a) for a in answers]) for qa, answers in _qas(data[ai])]
    others = [Question(qa["question"], set(), [fix(a) for a in answers]) for ai in outside
              for qa, answers in _qas(data[ai])]
    return Corpus(docs, qs), others


def _qas(article: dict):
    for p in article["paragraphs"]:
        for qa in p["qas"]:
            answers = [a["text"] for a in qa.get("answers", []) if a.get("text")]
            if answers:
                yield qa, answers


def outcome(row: dict) -> str:
    """refused / not_found / weak / answered, from one tools.eval.answer_eval row's flags."""
    return ("refused" if row["refused"] else "not_found" if row["not_found"] else "weak" if row["weak"]
            else "answered")


def answer_here(engine, q: Question) -> bool:
    """One of the question's answer strings stands in the fused top 6 of this KB (not a clean negative). Read
    from the retrieval itself, not from the answer's sources: a refused answer has none, and dropping only the
    negatives the gate let through would count the refused ones as right."""
    _, fusion, _ = engine.components.retrieval.recall(q.text, engine.settings)
    return any(a in n.node.get_content() for n in fusion.fused[:6] for a in q.answers)


def clean_negatives(engine, questions: list[Question]) -> list[Question]:
    return [q for q in questions if not answer_here(engine, q)]


def outcomes(rows: list[dict]) -> list[dict]:
    """Each asked question's outcome and gate score (tools.eval.answer_eval rows)."""
    return [{"q": r["q"], "outcome": outcome(r), "score": r["score"]} for r in rows]


def asked(engine, questions: list[Question]) -> list[dict]:
    return outcomes(answer_metrics(engine, questions, keep_rows=True)["rows"])


def shares(rows: list[dict]) -> dict[str, float]:
    n = max(len(rows), 1)
    return {k: round(sum(r["outcome"] == k for r in rows) / n, 4) for k in ("refused", "weak", "not_found",
                                                                           "answered")}


def oracle_curve(answerable: list[dict], negatives: list[dict]) -> dict[str, float]:
    """Out-of-KB refusals at thresholds placed at this KB's own answerable-score quantiles (needs labels)."""
    a = np.array([r["score"] for r in answerable if r["score"] is not None])
    o = np.array([r["score"] for r in negatives if r["score"] is not None])
    if not a.size or not o.size:
        return {}
    return {f"{fr:.0%}": round(float((o < np.quantile(a, fr)).mean()), 4) for fr in ORACLE_FR}


def run(squad: Path, articles: int, seed: int, search: Path | None, questions: int, negatives: int,
        commas: bool = False) -> dict:
    from pipeline.engine import Engine  # heavy (Chroma, the models): --help goes without it

    corpus, others = articles_corpus(squad, articles, seed, commas)
    rnd = random.Random(seed)
    corpus = Corpus(corpus.docs, rnd.sample(corpus.questions, min(questions, len(corpus.questions))))
    others = rnd.sample(others, min(negatives, len(others)))
    search_qs = load_dureader(search, None).questions if search else []
    with tempfile.TemporaryDirectory(prefix="kbqa-small-") as tmp:
        engine = Engine(Path(tmp) / "data")
        key_to_doc = build_kb(engine, corpus, Path(tmp))
        engine.wait_idle()
        retrieval = evaluate(engine, corpus, key_to_doc)
        answers = answer_metrics(engine, corpus.questions, keep_rows=True)
        answerable = outcomes(answers.pop("rows"))
        same_style = asked(engine, clean_negatives(engine, others))
        searched = asked(engine, search_qs)
        chunks = sum(len(engine.components.docs.chunks_of(d)) for d in set(key_to_doc.values()))
        engine.close()
    return {"set": Path(squad).name + (" (comma-only)" if commas else ""), "articles": articles, "seed": seed,
            "chunks": chunks,
            "routes": {k: retrieval["routes"][k] for k in ROUTES if k in retrieval["routes"]},
            "answers": answers, "answerable": shares(answerable),
            "out_of_kb_same_style": shares(same_style) | {"n": len(same_style)},
            "out_of_kb_search": shares(searched) | {"n": len(searched)},
            "oracle_same_style": oracle_curve(answerable, same_style),
            "oracle_search": oracle_curve(answerable, searched)}


def print_report(m: dict) -> None:
    print(f"\n{m['set']}: {m['articles']} whole articles (seed {m['seed']}), {m['chunks']} chunks")
    print_md_table(["route", "MRR@10", "Hit@1", "Hit@5"],
                   [[k, v["mrr@10"], v["hit@1"], v["hit@5"]] for k, v in m["routes"].items()])
    a = m["answers"]
    print()
    print_md_table(["questions", "n", "refused", "weak", "未找到", "answered", "answer-hit", "top-1-source-hit"],
                   [["answerable", a["questions"], f"{m['answerable']['refused']:.1%}",
                     f"{m['answerable']['weak']:.1%}", f"{m['answerable']['not_found']:.1%}",
                     f"{m['answerable']['answered']:.1%}", a["answer_hit"], a["top1_source_hit"]]] +
                   [[name, s["n"], f"{s['refused']:.1%}", f"{s['weak']:.1%}", f"{s['not_found']:.1%}",
                     f"{s['answered']:.1%}", "–", "–"]
                    for name, s in (("out of KB, same style", m["out_of_kb_same_style"]),
                                    ("out of KB, search", m["out_of_kb_search"]))])
    print("\nout-of-KB refusals with the refuse threshold at this KB's own answerable quantile (oracle):")
    print_md_table(["negatives", *[f"FR {k:.0%}" for k in ORACLE_FR]],
                   [[name, *[f"{v:.1%}" for v in curve.values()]]
                    for name, curve in (("same style", m["oracle_same_style"]), ("search", m["oracle_search"]))
                    if curve])


def main(argv=None) -> int:
    data = shared_data_dir()
    ap = command_parser("tools.eval.small_kb_check", __doc__)
    ap.add_argument("--squad", type=Path, default=data / "xquad" / "xquad.zh.json", help="SQuAD-format JSON")
    ap.add_argument("--articles", type=int, default=30, help="whole articles in the knowledge base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--questions", type=int, default=200, help="answerable questions asked (sampled)")
    ap.add_argument("--negatives", type=int, default=150, help="same-style out-of-KB questions asked")
    ap.add_argument("--search", default=str(data / "dureader2_demo" / "search.dev.json"),
                    help="DuReader JSON lines whose questions are asked as out-of-KB search questions ('' = none)")
    ap.add_argument("--commas", action="store_true", help="the articles' sentences separated by commas only")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.articles < 1:
        ap.error("--articles must be at least 1")
    m = run(args.squad, args.articles, args.seed, Path(args.search) if args.search else None, args.questions,
            args.negatives, args.commas)
    print_report(m)
    write_json(args.json, m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
