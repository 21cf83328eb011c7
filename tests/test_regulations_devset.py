"""The regulations dev sets (tests/data/regulations_dev, tests/data/regulations_dev2, and since session 25
tests/data/regulations_holdout) and the blind set (tests/data/regulations_holdout2), each written on its own regulations, against the real corpus in
../shared/data/regulations: the checker passes on all four, they hold the promised counts and ask about disjoint
regulations, and it does catch a wrong span, article or grep_absent term."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter

from tests.shared_data import DATA, needs
from tools.eval.devsets import REPO
from tools.eval.regulations_devset import QUESTIONS, TYPES, as_corpus, check, load_items, load_texts, main, norm

CORPUS = DATA / "regulations"
pytestmark = needs(CORPUS)


def test_the_set_checks_and_holds_its_counts(capsys):
    items, texts = load_items(), load_texts(CORPUS)
    assert len(texts) == 160
    assert check(items, texts) == []
    assert len(items.answerable) >= 80
    assert len(items.unanswerable) >= 30
    assert len(items.followups) >= 10
    assert len({a.gold.file for a in items.answerable}) >= 40
    types = Counter(a.type for a in items.answerable)
    assert set(types) == set(TYPES) and max(types.values()) <= 0.35 * len(items.answerable)
    assert main(["--corpus", str(CORPUS), "--quiet"]) == 0
    assert "ok:" in capsys.readouterr().out


HOLDOUT = REPO / "tests" / "data" / "regulations_holdout" / "questions.json"
DEV2 = REPO / "tests" / "data" / "regulations_dev2" / "questions.json"
HOLDOUT2 = REPO / "tests" / "data" / "regulations_holdout2" / "questions.json"


def _checked(path, counts: tuple[int, int, int]):
    """The set at `path`, after the checker passed on it and it holds `counts` (answerable, unanswerable, follow-up
    pairs) with every question type."""
    items = load_items(path)
    assert check(items, load_texts(CORPUS)) == []
    assert (len(items.answerable), len(items.unanswerable), len(items.followups)) == counts
    assert set(Counter(a.type for a in items.answerable)) == set(TYPES)
    return items


def _files(items) -> set[str]:
    return ({a.gold.file for a in items.answerable} | {f.first_gold.file for f in items.followups}
            | {f.followup_gold.file for f in items.followups})


def test_the_held_out_set_checks_and_asks_about_other_regulations():
    held, dev = _checked(HOLDOUT, (60, 20, 8)), load_items()
    used = {a.gold.file for a in dev.answerable} | {f.first_gold.file for f in dev.followups}
    held_files = {a.gold.file for a in held.answerable} | {f.first_gold.file for f in held.followups}
    assert len(held_files) >= 25 and not held_files & used  # regulations the dev set never asks about
    assert not {a.question for a in held.answerable} & {a.question for a in dev.answerable}


def test_the_checker_names_each_kind_of_violation(tmp_path, capsys):
    items, texts = load_items(), load_texts(CORPUS)
    a, b = items.answerable[0], items.answerable[1]
    wrong_span = dataclasses.replace(a, gold=dataclasses.replace(a.gold, span=a.gold.span + "并处罚款一百万元"))
    wrong_article = dataclasses.replace(b, gold=dataclasses.replace(b.gold, article="第一条"))
    u = items.unanswerable[0]
    present = dataclasses.replace(u, grep_absent=(*u.grep_absent[:1], "人民币"))  # in many files
    v = items.unanswerable[1]
    no_such_article = dataclasses.replace(v, near_article="第九百九十九条")
    bad = dataclasses.replace(items, answerable=[wrong_span, wrong_article, *items.answerable[2:]],
                              unanswerable=[present, no_such_article, *items.unanswerable[2:]])
    errors = check(bad, texts)
    assert any(e.startswith(f"{a.id}: span not found") for e in errors)
    assert any(e.startswith(f"{b.id}: span is in {b.gold.article}") for e in errors)
    assert any(e.startswith(f"{u.id}: grep_absent term '人民币'") for e in errors)
    assert any(e.startswith(f"{v.id}: ") and "第九百九十九条" in e for e in errors)
    assert len(errors) == 4

    # The command line exits non-zero on a broken file.
    raw = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    raw["answerable"][0]["file"] = "不存在的条例.md"
    broken = tmp_path / "questions.json"
    broken.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    assert main(["--questions", str(broken), "--corpus", str(CORPUS), "--quiet"]) == 1
    assert "不存在的条例.md" in capsys.readouterr().err


def test_as_corpus_gives_each_question_its_document_and_span():
    corpus = as_corpus(texts=load_texts(CORPUS))
    assert len(corpus.docs) == 160 and len(corpus.questions) == len(load_items().answerable)
    for q in corpus.questions:
        (doc,) = q.gold_docs
        assert norm(q.answers[0]) in norm(corpus.docs[doc])
    # a chunk holds the span although the text breaks a line inside it (the check's own whitespace rule)
    q = next(q for q in corpus.questions if len(q.answers[0]) > 20)
    a = q.answers[0]
    assert q.held_by(f"前文{a[:10]}\n{a[10:]}后文") and not q.held_by(a[:-1])


@needs(CORPUS)
def test_the_second_dev_set_checks_and_asks_about_regulations_of_its_own():
    dev2 = _checked(DEV2, (70, 40, 12))
    own = _files(dev2)
    assert len(own) >= 30 and not own & (_files(load_items()) | _files(load_items(HOLDOUT)))
    assert {u.domain_of for u in dev2.unanswerable} <= own


def test_the_blind_set_checks_and_asks_about_regulations_no_other_set_uses():
    blind = _checked(HOLDOUT2, (60, 20, 10))
    files = _files(blind)
    assert len(files) >= 25
    for other in (load_items(), load_items(DEV2), load_items(HOLDOUT)):
        assert not files & _files(other)
        assert not {a.question for a in blind.answerable} & {a.question for a in other.answerable}
