"""The regulations dev set (tests/data/regulations_dev/questions.json): everyday questions against 160 Chinese
administrative regulations (../shared/data/regulations), its loader and its checker.

    python -m tools.eval.regulations_devset            # check it; exits 1 naming every violation
    python -m tools.eval.regulations_devset --quiet    # only violations and the totals

What the check guarantees (the gold has to be right before any score on it means something):
- every `file` exists in the corpus folder;
- every `span` is a substring of its file once whitespace is removed from both (the Markdown wraps nothing, but a
  span may run over a line break between two clauses), and it lies inside the article named by `article`: the
  article heading is a line starting with 「第…条」, and the span sits between that heading and the next one;
- every `grep_absent` term of an unanswerable question occurs in no file of the corpus (again whitespace-free),
  so the answer really is not in the knowledge base;
- ids are unique, the fields and types are the ones the README lists.

Stdlib only; imports nothing of the pipeline. `load_items()` is what the evaluation tools use; `as_corpus()` turns
the answerable part into a tools.eval.devsets.Corpus (gold document = file name, gold answer = the span).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tools.eval.devsets import REPO, Corpus, DevSet, Question, load_folder, norm, shared_data_dir

QUESTIONS = REPO / "tests" / "data" / "regulations_dev" / "questions.json"
# the other question sets written over the same knowledge base (regulations_holdout2 written blind: only measured)
OTHER_SETS = {name: REPO / "tests" / "data" / name / "questions.json"
              for name in ("regulations_dev2", "regulations_holdout", "regulations_holdout2")}
# its knowledge base: the 160 files uploaded as the .md files they are (tools/eval/kb_cache)
REGULATIONS = DevSet("regulations", "folder", "regulations", style="everyday questions, Chinese regulations")
TYPES = ("yesno", "howlong", "howmuch", "who", "whatif", "how")
WRITERS = ("citizen", "clerk", "shop_owner", "farmer", "doctor", "hr")
_HEADING = re.compile(r"^(第[一二三四五六七八九十百零〇]+条)(?=[\s\u3000])", re.M)


def corpus_dir(data: Path | None = None) -> Path:
    return (data or shared_data_dir()) / "regulations"


@dataclass(frozen=True)
class Gold:
    """Where an answer is decided: the file, its article and the deciding text copied from it."""
    file: str
    article: str
    span: str


@dataclass(frozen=True)
class Answerable:
    id: str
    question: str
    type: str
    gold: Gold
    answer: str
    writer: str


@dataclass(frozen=True)
class Unanswerable:
    id: str
    question: str
    domain_of: str  # the corpus file it is near
    why_unanswerable: str  # which law (not in the corpus) holds the answer
    grep_absent: tuple[str, ...]  # terms verified to occur in no corpus file
    near_article: str = ""  # a near miss: the article of domain_of holding the general rule, not the point asked


@dataclass(frozen=True)
class FollowUp:
    id: str
    first: str
    first_gold: Gold
    followup: str
    followup_gold: Gold
    followup_answer: str
    followup_standalone: str  # a hand-written standalone form (what a good rewrite gives), as in followups.json
    first_id: str = ""  # the answerable item the first question is, when it is one


@dataclass
class DevItems:
    answerable: list[Answerable] = field(default_factory=list)
    unanswerable: list[Unanswerable] = field(default_factory=list)
    followups: list[FollowUp] = field(default_factory=list)


def _gold(d: dict, prefix: str = "") -> Gold:
    return Gold(d[prefix + "file"], d[prefix + "article"], d[prefix + "span"])


def load_items(path: Path = QUESTIONS) -> DevItems:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    return DevItems(
        [Answerable(d["id"], d["question"], d["type"], _gold(d), d["answer"], d["writer"]) for d in raw["answerable"]],
        [Unanswerable(d["id"], d["question"], d["domain_of"], d["why_unanswerable"], tuple(d["grep_absent"]),
                      d.get("near_article", "")) for d in raw["unanswerable"]],
        [FollowUp(d["id"], d["first"], _gold(d, "first_"), d["followup"], _gold(d, "followup_"),
                  d["followup_answer"], d["followup_standalone"], d.get("first_id", "")) for d in raw["followups"]],
    )


def load_texts(folder: Path | None = None) -> dict[str, str]:
    """file name → text of every regulation (README.md and SOURCE.txt are not documents)."""
    return load_folder(folder or corpus_dir())


def as_corpus(items: DevItems | None = None, texts: dict[str, str] | None = None) -> Corpus:
    """The answerable questions over the whole corpus, in the shape of the other dev sets."""
    items = items or load_items()
    texts = texts if texts is not None else load_texts()
    return Corpus(dict(texts), [Question(a.question, {a.gold.file}, [norm(a.gold.span)], whitespace_free=True)
                                for a in items.answerable])


def articles(text: str) -> list[tuple[str, str]]:
    """(heading, whitespace-free text) of each article, in order; the text before the first heading is left out."""
    heads = list(_HEADING.finditer(text))
    return [(m.group(1), norm(text[m.start():heads[i + 1].start() if i + 1 < len(heads) else len(text)]))
            for i, m in enumerate(heads)]


def check_gold(where: str, g: Gold, texts: dict[str, str], arts: dict[str, list[tuple[str, str]]]) -> list[str]:
    if g.file not in texts:
        return [f"{where}: file {g.file!r} is not in the corpus"]
    out = []
    span = norm(g.span)
    if not 10 <= len(span) <= 120:
        out.append(f"{where}: span has {len(span)} characters (10–120 wanted)")
    if span not in norm(texts[g.file]):
        return out + [f"{where}: span not found in {g.file}: {g.span!r}"]
    named = [a for a in arts[g.file] if a[0] == g.article]
    if not named:
        return out + [f"{where}: {g.file} has no article heading {g.article!r}"]
    if not any(span in body for _, body in named):
        inside = [h for h, body in arts[g.file] if span in body]
        out.append(f"{where}: span is in {'/'.join(inside) or 'no single article'}, not {g.article} of {g.file}")
    return out


def check(items: DevItems, texts: dict[str, str]) -> list[str]:
    """Every violation, as a readable line; empty when the set is sound."""
    errors: list[str] = []
    arts = {name: articles(t) for name, t in texts.items()}
    ids = [a.id for a in items.answerable] + [u.id for u in items.unanswerable] + [f.id for f in items.followups]
    errors += [f"duplicate id {i}" for i, n in Counter(ids).items() if n > 1]
    by_id = {a.id: a for a in items.answerable}
    for a in items.answerable:
        if a.type not in TYPES:
            errors.append(f"{a.id}: type {a.type!r} not one of {TYPES}")
        if a.writer not in WRITERS:
            errors.append(f"{a.id}: writer {a.writer!r} not one of {WRITERS}")
        if not a.question.strip() or not a.answer.strip():
            errors.append(f"{a.id}: empty question or answer")
        errors += check_gold(a.id, a.gold, texts, arts)
    flat = {name: norm(t) for name, t in texts.items()}
    for u in items.unanswerable:
        if u.domain_of not in texts:
            errors.append(f"{u.id}: domain_of {u.domain_of!r} is not in the corpus")
        elif u.near_article and u.near_article not in {h for h, _ in arts[u.domain_of]}:
            errors.append(f"{u.id}: {u.domain_of} has no article heading {u.near_article!r}")
        if not 2 <= len(u.grep_absent) <= 4:
            errors.append(f"{u.id}: {len(u.grep_absent)} grep_absent terms (2–4 wanted)")
        for term in u.grep_absent:
            hits = [name for name, t in flat.items() if norm(term) in t]
            if hits:
                errors.append(f"{u.id}: grep_absent term {term!r} occurs in {', '.join(hits[:3])}")
    for f in items.followups:
        errors += check_gold(f"{f.id} (first)", f.first_gold, texts, arts)
        errors += check_gold(f"{f.id} (follow-up)", f.followup_gold, texts, arts)
        if not f.followup.strip() or not f.followup_standalone.strip() or not f.followup_answer.strip():
            errors.append(f"{f.id}: empty follow-up, standalone form or answer")
        if f.first_id and (f.first_id not in by_id or by_id[f.first_id].question != f.first):
            errors.append(f"{f.id}: first_id {f.first_id} is not the answerable item with this first question")
    return errors


def summary(items: DevItems) -> str:
    a = items.answerable
    lines = [f"answerable {len(a)} over {len({x.gold.file for x in a})} regulations, "
             f"unanswerable {len(items.unanswerable)} ({sum(1 for u in items.unanswerable if u.near_article)} near misses), "
             f"follow-up pairs {len(items.followups)}",
             "types: " + ", ".join(f"{t} {n}" for t, n in Counter(x.type for x in a).most_common()),
             "writers: " + ", ".join(f"{w} {n}" for w, n in Counter(x.writer for x in a).most_common()),
             "most used files: " + ", ".join(f"{f.split('(')[0]} {n}"
                                              for f, n in Counter(x.gold.file for x in a).most_common(8))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=Path, default=QUESTIONS)
    ap.add_argument("--corpus", type=Path, default=None, help="the regulations folder (default: shared data)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    folder = args.corpus or corpus_dir()
    if not folder.is_dir():
        print(f"regulations corpus not found: {folder} ($KBQA_SHARED_DATA or ../shared/data)", file=sys.stderr)
        return 2
    items = load_items(args.questions)
    errors = check(items, load_texts(folder))
    for e in errors:
        print("VIOLATION", e, file=sys.stderr)
    if not args.quiet or errors:
        print(summary(items))
    print(f"{len(errors)} violation(s)" if errors else "ok: every file, article, span and grep_absent term checks")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
