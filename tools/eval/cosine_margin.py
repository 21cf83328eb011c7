"""How far the embedding model sets the answering chunk apart: per question, the cosine of the best gold chunk minus
that of the best other chunk among the candidates both routes retrieved, summarised per set and family.

    python -m tools.eval.cosine_margin --dumps DIR [--eps 0.01] [--json OUT]

DIR is the `--dump-dir` of `python -m tools.eval.evaluate --cv` (one NAME.jsonl per set: every candidate of the
union of both routes' top 50 with its cosine and gold flag). Nothing is fitted and no model runs: the numbers are
the cosines the app itself measured. Every stage that reads a cosine — the vector route, the fusion's α, the gate,
the picker — can only tell the answer from its neighbours by about this much; a set whose median margin is near 0
(the gold chunk within ±eps of a wrong one for most questions) is beyond what any weighting of that cosine can rank.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median

from tools.eval.cli import command_parser, print_md_table, write_json
from tools.eval.devsets import family_of

EPS = 0.01  # a hundredth of cosine: one unit of the scale the gate reads a question against its background in


def margin(row: dict) -> float | None:
    """Best gold cosine − best non-gold cosine of one dumped question; None when it has no gold candidate or no
    other one (the union missed the gold: a recall miss, not a ranking one)."""
    gold = [c[4] for c in row["cands"] if c[4] is not None and c[5]]
    other = [c[4] for c in row["cands"] if c[4] is not None and not c[5]]
    return max(gold) - max(other) if gold and other else None


def summarize(margins: list[float], eps: float = EPS) -> dict:
    """n, the median margin, and the shares of questions whose gold is ahead by more than eps, within ±eps, or
    behind by more than eps."""
    n = len(margins)
    if not n:
        return {"n": 0, "median": None, "ahead": None, "within": None, "behind": None}
    return {"n": n, "median": round(median(margins), 4),
            "ahead": round(sum(m > eps for m in margins) / n, 3),
            "within": round(sum(abs(m) <= eps for m in margins) / n, 3),
            "behind": round(sum(m < -eps for m in margins) / n, 3)}


def set_margins(path: Path) -> tuple[list[float], int]:
    """The margins of one dump file, and how many of its questions have none (gold not among the candidates)."""
    out, missed = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = margin(json.loads(line))
            if m is None:
                missed += 1
            else:
                out.append(m)
    return out, missed


def report(dumps: Path, eps: float = EPS) -> dict:
    """{"sets": {name: summary + family + no_margin}, "families": {family: summary over its sets' questions}}."""
    sets, pooled = {}, {}
    for path in sorted(Path(dumps).glob("*.jsonl")):
        margins, missed = set_margins(path)
        fam = family_of(path.stem)
        sets[path.stem] = {"family": fam, **summarize(margins, eps), "no_margin": missed}
        pooled.setdefault(fam, []).extend(margins)
    return {"eps": eps, "sets": sets, "families": {f: summarize(m, eps) for f, m in pooled.items()}}


def print_report(r: dict) -> None:
    """One markdown row per set, then one per family over all its sets' questions (the docs take it as printed)."""
    def cells(s: dict) -> list:
        if not s["n"]:
            return [0, "–", "–", "–", "–"]
        return [s["n"], f"{s['median']:+.4f}", f"{s['ahead']:.2f}", f"{s['within']:.2f}", f"{s['behind']:.2f}"]

    print(f"gold cosine − best other cosine (candidates: both routes' top 50); ±{r['eps']} counts as a tie")
    rows = [[s["family"], name, *cells(s), s["no_margin"]]
            for name, s in sorted(r["sets"].items(), key=lambda kv: (kv[1]["family"], kv[0]))]
    rows += [[fam, "(all its sets)", *cells(s), ""] for fam, s in sorted(r["families"].items()) if s["n"]]
    print_md_table(["family", "set", "n", "median", "ahead", "within", "behind", "no gold"], rows)


def main(argv=None) -> int:
    ap = command_parser("tools.eval.cosine_margin", __doc__)
    ap.add_argument("--dumps", type=Path, required=True, help="the --dump-dir of tools.eval.evaluate --cv")
    ap.add_argument("--eps", type=float, default=EPS, help=f"a margin within ±eps is a tie (default {EPS})")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = ap.parse_args(argv)
    if not any(args.dumps.glob("*.jsonl")):
        ap.error(f"--dumps {args.dumps}: no NAME.jsonl dump there (python -m tools.eval.evaluate --cv --dump-dir …)")
    r = report(args.dumps, args.eps)
    print_report(r)
    write_json(args.json, r, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
