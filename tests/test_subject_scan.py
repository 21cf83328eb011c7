"""The subject-coverage signals of tools/eval/subject_scan.py on hand-made passages, and its left-out protocol.

Issue 25 item 6: 「网约车司机…」 answered from a general rule of a transport regulation that never names 网约车 is
the case the signals look for; the scan (docs/retrieval-eval.md, "Do not answer from the neighbouring rule")
measured that none of them separates such answers from right ones on the formal family. Pure functions: no model.
"""
from __future__ import annotations

import math

import pytest

from pipeline.retrieval.lexical import TermWeights, normalize
from tools.eval.subject_scan import (
    fit,
    in_order_nearby,
    left_out,
    missing,
    passages,
    plain_terms,
    weights_of,
)

GENERAL_RULE = normalize("第二十二条 从事道路旅客运输经营的驾驶人员，应当取得相应的从业资格证件，并遵守运输规定。")
SPECIFIC_RULE = normalize("网约车驾驶员应当取得网络预约出租汽车驾驶员证，方可从事网约车经营服务。")
N = 1000
DF = {"网约车": 3, "司机": 40, "驾驶": 200, "资格": 120, "证件": 90, "冷静期": 0}


def _weights() -> TermWeights:
    words = list(DF)
    return TermWeights({w: i for i, w in enumerate(words)}, [DF[w] for w in words], N)


def test_the_specific_subject_missing_from_a_general_rule_is_found_and_weighed_by_the_kb_idf():
    w = _weights()
    terms = ["网约车", "司机", "资格", "证件"]
    got = missing(terms, GENERAL_RULE, w, lambda t, x: t in x)
    assert got["words"] == ["网约车", "司机"]
    idf = {t: math.log(1 + (N - DF[t] + 0.5) / (DF[t] + 0.5)) for t in terms}
    assert got["share"] == pytest.approx((idf["网约车"] + idf["司机"]) / sum(idf.values()))
    assert got["max"] == pytest.approx(idf["网约车"] / w.max_idf)  # the rarest missing word: the subject
    assert got["known_max"] == got["max"]  # the KB does hold 网约车 (df 3): elsewhere, not in this passage
    assert got["unseen_share"] == 0.0
    covered = missing(terms, SPECIFIC_RULE, w, lambda t, x: t in x)
    assert "网约车" not in covered["words"] and covered["share"] < got["share"]


def test_a_word_the_kb_never_saw_counts_as_unseen_not_as_the_neighbouring_rule():
    got = missing(["冷静期", "驾驶"], GENERAL_RULE, _weights(), lambda t, x: t in x)
    assert got["words"] == ["冷静期"]
    assert got["known_max"] == 0.0 and got["unseen_share"] > 0.8  # df 0 weighs most


def test_an_abbreviation_is_present_when_its_characters_stand_in_order_nearby():
    text = normalize("男女双方在结婚登记前应当进行婚前医学检查，并领取结婚证。")
    assert in_order_nearby("婚检", text)           # 婚前医学检查
    assert in_order_nearby("领证", text)           # 领取结婚证
    assert not in_order_nearby("冷静期", text)
    assert not in_order_nearby("检婚", text)       # out of order
    assert not in_order_nearby("男证", text)       # too far apart (3 × its length)


def test_plain_words_drop_question_fragments_and_single_characters():
    segments = ["抢救", "的", "时候", "来不及", "写", "病历", "，", "事后", "多长时间", "内", "要", "补上", "？"]
    assert plain_terms(segments) == ["抢救", "来不及", "病历", "事后", "补上"]  # 时候 is a stopword


def test_passages_are_those_the_answer_cites_or_all_six():
    row = {"sources": [{"text": "甲"}, {"text": "乙"}, {"text": "丙"}], "cited": [2]}
    assert passages(row, "cited") == "乙" and passages(row, "all") == "甲\n乙\n丙"


def test_weights_of_a_dump_row_are_the_kb_idf_of_its_words():
    w = weights_of({"df": DF, "n_docs": N})
    assert w.idf("网约车") == pytest.approx(_weights().idf("网约车"))
    assert w.df_of("没有的词") == 0 and w.idf("没有的词") == pytest.approx(w.max_idf)


def _row(family: str, kind: str, s: float, gate: str = "answer", hit: bool = True, name: str | None = None) -> dict:
    return {"family": family, "set": name or family, "kind": kind, "gate": gate, "found": True, "hit": hit, "s": s}


def test_thresholds_come_from_the_other_families_only():
    # encyclopedic: answerable up to 0.4; web: answerable up to 0.6; the formal rows are scored left out
    rows = ([_row("encyclopedic", "answerable", x / 10) for x in range(5)] + [_row("encyclopedic", "gold_removed", 0.9)]
            + [_row("web", "answerable", x / 10) for x in range(7)] + [_row("web", "gold_removed", 0.95)])
    sig = {id(r): r["s"] for r in rows}
    weak_at, refuse_at = fit(rows, sig)
    assert weak_at == pytest.approx(0.65) and refuse_at == pytest.approx(0.65)  # the first grid point above 0.6
    c = [_row("formal", "answerable", 0.99, name="c1"), _row("formal", "unanswerable", 0.7, name="c1")]
    table = left_out(rows + c, {**sig, **{id(r): r["s"] for r in c}})
    got = {r[1]: r for r in table}
    assert got["c1"][2] == "0.65"  # fitted on the other two families: the formal rows play no part
    assert got["c1"][4] == "0.000 → 1.000"  # its answerable question is refused: the left-out cost shows
    assert got["c1"][9] == "1.000 → 0.000"  # and its unanswerable one is no longer answered as if
