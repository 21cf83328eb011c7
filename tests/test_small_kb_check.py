"""tools/eval/small_kb_check.py: whole-article knowledge bases, the outcome counts and the per-KB oracle curve."""
from __future__ import annotations

import json

import pytest

from tests.shared_data import DATA, needs
from tools.eval import small_kb_check as sk

XQUAD = DATA / "xquad" / "xquad.zh.json"


@needs(XQUAD)
def test_whole_articles_become_one_document_each_and_negatives_come_from_the_others():
    corpus, others = sk.articles_corpus(XQUAD, 3, seed=5)
    data = json.loads(XQUAD.read_text(encoding="utf-8"))["data"]
    assert len(corpus.docs) == 3
    by_key = {f"article{i}": a for i, a in enumerate(data)}
    for key, text in corpus.docs.items():
        paragraphs = [p["context"] for p in by_key[key]["paragraphs"]]
        assert text == "\n\n".join(paragraphs)  # the article whole, not one passage
    inside_q = {q.text for q in corpus.questions}
    assert all(next(iter(q.gold_docs)) in corpus.docs for q in corpus.questions)
    assert inside_q and others and not inside_q & {q.text for q in others}
    assert len(corpus.questions) + len(others) == sum(1 for a in data for _ in sk._qas(a))
    again, _ = sk.articles_corpus(XQUAD, 3, seed=5)
    assert list(again.docs) == list(corpus.docs)  # the seed decides the draw


@needs(XQUAD)
def test_comma_only_articles_keep_their_text_and_answers_with_commas_for_sentence_ends():
    plain, _ = sk.articles_corpus(XQUAD, 3, seed=5)
    commas, _ = sk.articles_corpus(XQUAD, 3, seed=5, commas=True)
    assert list(commas.docs) == list(plain.docs)
    for key, text in commas.docs.items():
        assert not set("。！？；") & set(text) and text == sk.comma_only(plain.docs[key])
        assert len(text) == len(plain.docs[key])  # one character for one: the answers stand where they stood
    assert [q.text for q in commas.questions] == [q.text for q in plain.questions]
    assert all(a in commas.docs[next(iter(q.gold_docs))] for q in commas.questions for a in q.answers)
    assert sk.comma_only("甲。乙！丙？丁；戊，") == "甲，乙，丙，丁，戊，"


def test_outcomes_and_oracle_curve_arithmetic():
    flags = {"refused": False, "not_found": False, "weak": False}
    assert sk.outcomes([{"q": "a", "score": -3.0, **flags, "refused": True}]) == \
        [{"q": "a", "outcome": "refused", "score": -3.0}]
    assert sk.outcome(flags | {"not_found": True}) == "not_found"
    assert sk.outcome(flags | {"weak": True}) == "weak" and sk.outcome(flags) == "answered"
    rows = [{"outcome": k} for k in ("refused", "refused", "weak", "answered")]
    assert sk.shares(rows) == {"refused": 0.5, "weak": 0.25, "not_found": 0.0, "answered": 0.25}
    answerable = [{"score": float(s)} for s in range(100)]  # quantiles 1% 0.99, 2% 1.98, 3% 2.97, 5% 4.95
    negatives = [{"score": s} for s in (0.5, 1.5, 3.0, 4.0, 10.0)]
    assert sk.oracle_curve(answerable, negatives) == {"1%": 0.2, "2%": 0.4, "3%": 0.4, "5%": 0.8}
    assert sk.oracle_curve([], negatives) == {}


@pytest.mark.slow
@needs(XQUAD)
def test_small_kb_run_end_to_end(tmp_path):
    out = tmp_path / "small.json"
    assert sk.main(["--squad", str(XQUAD), "--articles", "2", "--seed", "1", "--questions", "12",
                    "--negatives", "8", "--search", "", "--json", str(out)]) == 0
    m = json.loads(out.read_text(encoding="utf-8"))
    assert m["articles"] == 2 and m["chunks"] > 2
    assert m["answers"]["questions"] == 12
    assert m["routes"]["fused"]["hit@5"] >= 0.75  # two articles: the answer's chunk is near the top
    assert sum(m["answerable"].values()) == pytest.approx(1.0, abs=1e-3)
    assert m["out_of_kb_same_style"]["n"] <= 8 and m["out_of_kb_search"]["n"] == 0
    assert set(m["oracle_same_style"]) <= {"1%", "2%", "3%", "5%"}


@pytest.mark.slow
@needs(XQUAD)
def test_a_negative_whose_answer_stands_in_the_kb_is_dropped_even_when_refused(tmp_path):
    from pipeline.engine import Engine
    from tools.eval.devsets import Question
    from tools.eval.kb_cache import build_kb

    corpus, _ = sk.articles_corpus(XQUAD, 1, seed=3)
    engine = Engine(tmp_path / "data")
    try:
        build_kb(engine, corpus, tmp_path)
        engine.wait_idle()
        inside = corpus.questions[0]
        assert sk.answer_here(engine, inside)  # its answer is in this KB: not a clean negative
        off_topic = Question("红烧肉怎么做才好吃？", set(), ["冰糖"])
        assert not sk.answer_here(engine, off_topic)
        # the drop is decided before asking: the answer's sources (empty when refused) play no part
        kept = sk.asked(engine, sk.clean_negatives(engine, [inside, off_topic]))
        assert [r["q"] for r in kept] == [off_topic.text]
    finally:
        engine.close()
