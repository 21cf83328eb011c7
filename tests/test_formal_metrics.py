"""The outcome rules of the formal-documents evaluation (tools/eval/formal_metrics.py) on tiny inputs: no model."""
from __future__ import annotations

from tools.eval.formal_eval import OFF_TOPIC, load_lines, summarize
from tools.eval.formal_metrics import (
    answer_hit,
    answer_lines,
    content,
    longest_common_run,
    outcome,
    right_doc_first,
    span_in_sources,
    span_share,
)

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


def test_off_topic_list_has_its_fifty_questions():
    qs = load_lines(OFF_TOPIC)
    assert len(qs) >= 50 and len(set(qs)) == len(qs)
