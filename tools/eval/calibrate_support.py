"""Calibrate the citation support check (pipeline/generation/support.py) with leave-one-set-out.

    python -m tools.eval.calibrate_support --kb-cache DIR [--per-set 150] [--json OUT]

No LLM is needed to make claims: a dev question with its gold answer put in place of the question word is the
sentence an answer would say (「刘备三顾茅庐请的是谁？」 + 诸葛亮 → 「刘备三顾茅庐请的是诸葛亮」). For questions
whose retrieved sources include the gold passage, the claim citing that source is a supported citation, and
the claim citing another retrieved source that does not state the answer is the wrong citation the check must
mark. Scores are the app's (SupportChecker.scores over the stored vectors, above the KB's background). The margin is kept ≥ 0.5 (≈ 0.05
cosine) by design: these claims restate the question, so they are easier than a model's paraphrase, and "another
source backs it better" must mean clearly better before a citation is called wrong. For each set in turn the thresholds
(floor, margin, hard_floor on the support score) are chosen on the other sets — the most wrong citations caught
with at most MAX_FALSE_MARKS of the right ones marked on every training set — and scored on the left-out set.
"""
from __future__ import annotations

import itertools
import random
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.generation.support import SupportParams
from pipeline.retrieval.lexical import normalize
from tools.eval.cli import add_kb_cache, command_parser, kb_cache_root, report_fit
from tools.eval.devsets import DEV_SETS, gold_ids, load_corpus
from tools.eval.kb_cache import open_copy

SETS = ("cmrc_trial", "xquad_zh", "cmrc_dev_news")  # the sets with answer strings to build claims from
MAX_FALSE_MARKS = 0.05
MARGINS = (0.5, 0.75, 1.0)
_QWORD = re.compile(r"什么时候|何时|哪一年|哪年|哪个|哪些|哪里|哪儿|哪位|什么|多少|多大|多长|几|谁|哪")


def claim_of(question: str, answer: str) -> str:
    q = question.strip().rstrip("？?。 ")
    if _QWORD.search(q):
        return _QWORD.sub(answer, q, count=1)
    return f"{q}：{answer}"


def collect(name: str, root: Path, per_set: int) -> list[dict]:
    """(score by the cited source, best score by the other sources) for right and wrong citations, scored by the
    engine's own support check (its embedding model's calibration profile gives the weights: row["weights"])."""
    rows = []
    qs = random.Random(14).sample(load_corpus(DEV_SETS[name]).questions, per_set * 2)
    with tempfile.TemporaryDirectory(prefix="kbqa-sup-") as tmp:
        engine, key_to_doc = open_copy(root, DEV_SETS[name], Path(tmp) / name)
        checker = engine.components.support
        for q in qs:
            if len(rows) >= 2 * per_set:
                break
            gold = gold_ids(q, key_to_doc)
            final = engine.retrieve(q.text).final
            texts = [n.node.get_content() for n in final]
            right = [i for i, (n, t) in enumerate(zip(final, texts), 1)
                     if n.node.metadata.get("doc_id") in gold and any(a in t for a in q.answers)]
            wrong = [i for i, t in enumerate(texts, 1) if not any(a in t for a in q.answers)]
            if not right or not wrong:
                continue
            vecs = np.asarray(checker.source_vectors(final), dtype=np.float32)
            claim = claim_of(q.text, q.answers[0])
            sc = checker.scores(claim, [normalize(t) for t in texts], vecs / np.linalg.norm(vecs, axis=1,
                                                                                            keepdims=True))
            for cited, ok in ((right[0], True), (wrong[0], False)):
                rows.append({"set": name, "ok": ok, "cited": sc[cited],
                             "other": max(v for m, v in sc.items() if m != cited), "claim": claim,
                             "weights": checker.params})
        engine.close()
    return rows


def marks(rows: list[dict], floor: float, margin: float, hard: float) -> np.ndarray:
    c = np.array([r["cited"] for r in rows])
    o = np.array([r["other"] for r in rows])
    return (c < hard) | ((c < floor) & (o - c >= margin))


def fit(train: dict[str, list[dict]], weights: SupportParams) -> SupportParams:
    """The thresholds on the scores of `weights` (the checker's w_cos, w_cov, w_phrase, which the rows were scored
    with: fixed by design, not fitted)."""
    best, best_key = None, None
    for floor, margin, hard in itertools.product(np.arange(-1.0, 4.01, 0.1), MARGINS,
                                                 np.arange(-2.0, 3.01, 0.1)):
        if hard > floor:
            continue
        ok_rates, caught = [], []
        for rows in train.values():
            m = marks(rows, floor, margin, hard)
            good = np.array([r["ok"] for r in rows])
            ok_rates.append(m[good].mean())
            caught.append(m[~good].mean())
        if max(ok_rates) > MAX_FALSE_MARKS:
            continue
        key = (round(float(np.mean(caught)), 4), -float(np.mean(ok_rates)))
        if best_key is None or key > best_key:
            best_key, best = key, (float(floor), margin, float(hard))
    floor, margin, hard = best
    return SupportParams(weights.w_cos, weights.w_cov, weights.w_phrase, round(floor, 2), margin, round(hard, 2))


def score(rows: list[dict], p: SupportParams) -> dict:
    m = marks(rows, p.floor, p.margin, p.hard_floor)
    good = np.array([r["ok"] for r in rows])
    return {"right": int(good.sum()), "right_marked": round(float(m[good].mean()), 4),
            "wrong": int((~good).sum()), "wrong_marked": round(float(m[~good].mean()), 4)}


def main(argv=None) -> int:
    ap = command_parser("tools.eval.calibrate_support", __doc__)
    add_kb_cache(ap)
    ap.add_argument("--per-set", type=int, default=150)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    data = {n: collect(n, root, args.per_set) for n in SETS}
    print("| left-out set | right citations | marked unsupported | wrong citations | marked unsupported | params |")
    print("|---|---|---|---|---|---|")
    out = {}
    weights = next(r["weights"] for rows in data.values() for r in rows)
    for name, rows in data.items():
        p = fit({n: r for n, r in data.items() if n != name}, weights)
        m = score(rows, p)
        out[name] = m | {"params": p.__dict__}
        print(f"| {name} | {m['right']} | {m['right_marked']:.1%} | {m['wrong']} | {m['wrong_marked']:.1%} | "
              f"floor {p.floor}, margin {p.margin}, hard_floor {p.hard_floor} |")
    report_fit("SupportParams", fit(data, weights), out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
