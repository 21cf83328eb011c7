"""The outcome rules of the formal-documents evaluation (tools/eval/formal_metrics.py) on tiny inputs: no model."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tests.shared_data import DATA, needs
from tools.eval.formal_eval import (
    ALL_SETS,
    OFF_TOPIC,
    load_lines,
    main,
    print_summary,
    summarize,
    switch_summary,
    topic_switches,
)
from tools.eval.formal_metrics import (
    answer_hit,
    answer_lines,
    bold_hit,
    content,
    longest_common_run,
    outcome,
    right_doc_first,
    span_in_sources,
    span_share,
)

REGS = DATA / "regulations"
SPAN = "无偿为公众兑换残缺、污损的人民币"
LABEL = "原文摘录（未配置大模型）：\n"


def test_span_in_sources_ignores_whitespace_and_stops_at_k():
    sources = [{"text": "第二十二条 办理人民币存取款业务的金融机构应当按照中国人民银行的规定，"},
               {"text": "应当按照规定，无偿为公众兑换残缺、\n污损的人民币，挑剔残缺。"}]
    assert span_in_sources(sources, SPAN)
    assert not span_in_sources(sources, SPAN, k=1)
    assert not span_in_sources([], SPAN)


def test_right_doc_first_is_source_one_only():
    assert right_doc_first([{"doc_id": 7}, {"doc_id": 3}], 7)
    assert not right_doc_first([{"doc_id": 3}, {"doc_id": 7}], 7)
    assert not right_doc_first([], 7)
    assert not right_doc_first([{"doc_id": 7}], None)


def test_answer_lines_drop_label_marks_and_citations():
    ans = LABEL + "- 金融机构应当**无偿为公众兑换残缺、污损的人民币**[1]。\n- 另一句[2]。"
    assert answer_lines(ans) == ["金融机构应当无偿为公众兑换残缺、污损的人民币。", "另一句。"]


def test_content_keeps_cjk_letters_digits_only():
    assert content("**第3条**：30日内，A、B。[2]") == "第3条30日内AB"


def test_longest_common_run_is_contiguous():
    assert longest_common_run("abcdef", "xxabcyyef") == 3
    assert longest_common_run("", "abc") == 0


def test_answer_hit_whole_span_partial_span_and_scattered_words():
    whole = LABEL + "- 金融机构应当**无偿为公众兑换残缺，污损的人民币**[1]。"  # 、 vs ，: punctuation does not decide
    assert answer_hit(whole, SPAN)
    # 13 of the span's 15 content characters in a row (为公众兑换残缺污损的人民币): ≥ 0.6 of them
    part = LABEL + "- 银行为公众兑换残缺、污损的人民币时不收费[1]。"
    assert span_share(answer_lines(part)[0], SPAN) >= 0.6 and answer_hit(part, SPAN)
    # the same characters scattered over the line do not make a hit
    scattered = LABEL + "- 人民币的残缺由公众无偿兑换，污损者为之[1]。"
    assert not answer_hit(scattered, SPAN)
    # split over two lines, neither holding 60% in a row
    split = LABEL + "- 无偿为公众[1]。\n- 兑换残缺[1]。"
    assert not answer_hit(split, SPAN)


def test_bold_hit_counts_the_clause_the_picker_chose_not_what_else_the_line_quotes():
    article = LABEL + "- 《人民币管理条例》第二十二条：办理存取款业务的金融机构应当按照规定，无偿为公众兑换残缺、污损的人民币，" \
                      "**挑剔残缺、污损的人民币**[1]。"
    assert answer_hit(article, SPAN) and not bold_hit(article, SPAN)  # on screen, but not the clause chosen
    chosen = article.replace("**挑剔残缺、污损的人民币**", "挑剔残缺、污损的人民币").replace(
        "无偿为公众兑换残缺、污损的人民币", "**无偿为公众兑换残缺、污损的人民币**")
    assert bold_hit(chosen, SPAN) and answer_hit(chosen, SPAN)
    assert not bold_hit(LABEL + f"资料中未找到直接回答该问题的内容。**{SPAN}**", SPAN)


def test_not_found_is_no_hit_and_a_refusal():
    nf = LABEL + f"资料中未找到直接回答该问题的内容。最接近的资料见 [1]，请查看原文。{SPAN}"
    assert not answer_hit(nf, SPAN)
    assert outcome({"answer": nf, "sources": [{"text": SPAN}]}) == "refused"
    assert outcome({"answer": "", "sources": []}) == "refused"
    assert outcome({"answer": "x", "sources": [{}], "weak": True}) == "weak"
    assert outcome({"answer": "x", "sources": [{}], "weak": False}) == "answered"


def test_summarize_counts_each_list():
    ans = [{"type": "yesno", "in_sources": True, "doc_first": True, "hit": True, "outcome": "answered",
            "gate_refused": False},
           {"type": "who", "in_sources": False, "doc_first": False, "hit": False, "outcome": "refused",
            "gate_refused": True}]
    m = summarize(ans, [{"outcome": "weak"}, {"outcome": "refused"}], [{"outcome": "refused"}],
                  [{"in_conversation": True, "alone": False, "hit_in_conversation": False}])
    assert m["answerable"]["answer_hit"] == 0.5 and m["answerable"]["gate_refused"] == 0.5
    assert m["answerable"]["by_type"]["yesno"]["answer_hit"] == 1.0
    assert m["unanswerable"] == {"n": 2, "refused": 0.5, "weak": 0.5, "answered": 0.0}
    assert m["off_topic"]["refused"] == 1.0
    assert m["followups"]["in_conversation"] == 1.0 and m["followups"]["alone"] == 0.0


def test_the_summary_puts_the_sets_side_by_side_with_each_goal(capsys):
    def one(hit: bool) -> dict:
        ans = [{"type": "yesno", "in_sources": hit, "doc_first": True, "hit": hit, "bold_hit": False,
                "outcome": "answered" if hit else "refused", "gate_refused": False}]
        return summarize(ans, [{"outcome": "refused"}, {"outcome": "answered"}], [{"outcome": "refused"}],
                         [{"in_conversation": hit, "alone": False, "hit_in_conversation": hit}])

    print_summary({"regulations_dev": one(True), "regulations_holdout2": one(False)})
    lines = capsys.readouterr().out.splitlines()
    assert "| what | regulations_dev | regulations_holdout2 | goal |" in lines
    assert "| extractive answer-hit | 1.000 | 0.000 | ≥ .80 |" in lines
    assert "| answerable refused | 0.000 | 1.000 | ≤ .03 |" in lines
    assert "| unanswerable refused / weak / as if | 0.500 / 0.000 / 0.500 | 0.500 / 0.000 / 0.500 | ≥ .60 / – / ≤ .10 |" in lines
    # every written set over the regulations KB, the blind one last
    assert list(ALL_SETS) == ["regulations_dev", "regulations_dev2", "regulations_holdout", "regulations_holdout2"]
    assert all(p.is_file() for p in ALL_SETS.values())


def test_all_sets_and_one_question_file_are_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--kb-cache", str(tmp_path), "--all-sets", "--questions", str(ALL_SETS["regulations_dev2"])])
    assert e.value.code == 2


def test_topic_switches_pair_each_first_question_with_another_regulation_and_an_unanswerable_one():
    from tools.eval.regulations_devset import load_items

    items = load_items()
    rows = topic_switches(items)
    by_id = {f.id: f for f in items.followups}
    answerable = [r for r in rows if r[0] == "answerable"]
    assert len(answerable) == len(items.followups) and len(rows) == 2 * len(items.followups)
    for _, first, qid, q, span in answerable:
        a, b = (by_id[x] for x in qid.split(">"))
        assert first == a.first and q == b.first and span == b.first_gold.span
        assert a.first_gold.file != b.first_gold.file  # a new topic, not the pair's own regulation
    others = [r for r in rows if r[0] == "unanswerable"]
    assert all(span is None for *_, span in others)
    assert {q for _, _, _, q, _ in others} <= {u.question for u in items.unanswerable}


def test_every_switch_asks_each_question_after_one_on_another_regulation():
    from tools.eval.regulations_devset import load_items

    items = load_items()
    rows = topic_switches(items, ["今天天气怎么样？"], every=True)
    by_q = {a.question: a for a in items.answerable}
    kinds = [r[0] for r in rows]
    assert kinds.count("answerable") == len(items.answerable)
    assert kinds.count("unanswerable") == len(items.unanswerable) and kinds.count("off_topic") == 1
    for kind, first, _, q, span in rows:
        assert first in by_q  # always after an answerable question
        if kind == "answerable":
            assert by_q[first].gold.file != by_q[q].gold.file and span == by_q[q].gold.span
    assert topic_switches(replace(items, answerable=[]), ["今天天气怎么样？"], every=True) == []


def test_switch_summary_compares_the_conversation_with_the_question_alone():
    rows = [{"kind": "answerable", "in_conversation": False, "alone": True, "changed": True},
            {"kind": "answerable", "in_conversation": True, "alone": True, "changed": False},
            {"kind": "unanswerable", "outcome_in_conversation": "answered", "outcome_alone": "refused",
             "changed": True}]
    w = switch_summary(rows)
    assert (w["n"], w["in_conversation"], w["alone"], w["changed"], w["asked"]) == (2, 0.5, 1.0, 2, 3)
    assert w["unanswerable"]["in_conversation"]["answered"] == 1.0 and w["unanswerable"]["alone"]["refused"] == 1.0
    assert "off_topic" not in w


def test_off_topic_list_has_its_fifty_questions():
    qs = load_lines(OFF_TOPIC)
    assert len(qs) >= 50 and len(set(qs)) == len(qs)


@pytest.mark.slow
@needs(REGS / "人民币管理条例(2018-03-19).md", REGS / "婚姻登记条例(2003-08-08).md")
def test_harness_end_to_end_on_two_regulations(tmp_path):
    """The real answer path (packaged e5) on a KB of two regulations uploaded as .md: every list is asked, the
    follow-up inside its conversation, and the gold document comes first for most answerable questions."""
    from pipeline.engine import Engine
    from tools.eval.devsets import Corpus, load_folder
    from tools.eval.formal_eval import evaluate
    from tools.eval.kb_cache import build_kb
    from tools.eval.regulations_devset import DevItems, load_items

    files = {"人民币管理条例(2018-03-19).md", "婚姻登记条例(2003-08-08).md"}
    docs = {k: v for k, v in load_folder(REGS).items() if k in files}
    items = load_items()
    small = DevItems([a for a in items.answerable if a.gold.file in files][:6], items.unanswerable[:2],
                     [f for f in items.followups if f.first_gold.file in files and f.followup_gold.file in files][:1])
    assert len(small.answerable) == 6 and len(small.followups) == 1
    engine = Engine(tmp_path / "data")
    try:
        key_to_doc = build_kb(engine, Corpus(docs, []), tmp_path)
        engine.wait_idle()
        m, rows = evaluate(engine, key_to_doc, small, load_lines(OFF_TOPIC)[:2])
    finally:
        engine.close()
    assert all(r["sources"] and r["sources"][0].endswith(".md") for r in rows["answerable"] if r["outcome"] != "refused")
    assert m["answerable"]["n"] == 6 and m["unanswerable"]["n"] == 2 and m["off_topic"]["n"] == 2
    assert m["answerable"]["doc_first"] >= 0.5  # two documents: the gold one is first for most questions
    assert m["followups"]["n"] == 1 and rows["followups"][0]["rewritten"]  # asked inside its conversation
    assert m["switches"]["unanswerable"]["n"] == 1 and rows["switches"][0]["outcome_alone"] in ("refused", "weak", "answered")


@pytest.mark.slow
@needs(REGS)
def test_all_sets_over_one_kb_built_with_another_embedding_model(tmp_path, capsys):
    """`--all-sets` end to end on the 160 regulations, in a cache built with an embedding model other than the packaged
    one (a tiny random BERT, where a stronger Chinese model would go): every set asked over the one copy, each
    reported under its own name, the summary printed, each set's metrics and rows in the JSON."""
    import json

    from tests.tiny_models import make_tiny_bert_embedding
    from tools.eval.kb_cache import ensure_built
    from tools.eval.regulations_devset import REGULATIONS

    ensure_built(tmp_path / "kb", REGULATIONS, str(make_tiny_bert_embedding(tmp_path / "tiny")))
    out_json = tmp_path / "out.json"
    assert main(["--kb-cache", str(tmp_path / "kb"), "--all-sets", "--limit", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert all(f"formal documents ({name})" in out for name in ALL_SETS)
    assert "| what | regulations_dev | regulations_dev2 | regulations_holdout | regulations_holdout2 | goal |" in out
    got = json.loads(out_json.read_text(encoding="utf-8"))
    assert list(got) == list(ALL_SETS)
    for m in got.values():
        assert m["answerable"]["n"] == len(m["rows"]["answerable"]) == 2
        assert m["unanswerable"]["n"] == 2 and m["off_topic"]["n"] == 2 and len(m["rows"]["followups"]) == 2
