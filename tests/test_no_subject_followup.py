"""A follow-up that names no subject of its own (「去报到要带些什么？」) is left as typed, and when the gate refuses it
outright it is searched again within the documents the last answer cited (pipeline/conversation/rewrite.py
`names_no_subject`, `Rewrite.searches_cited_after`; pipeline/services/answering.py). The real engine (packaged
embedding model, offline) over four real regulations of ../shared/data/regulations."""
from __future__ import annotations

import pytest

from tests.shared_data import DATA, needs

REGS = DATA / "regulations"
VETERANS = "退役士兵安置条例(2011-10-29).md"
PERMITS = "排污许可管理条例(2021-01-24).md"
MARRIAGE = "婚姻登记条例(2003-08-08).md"
CREDIT = "征信业管理条例(2013-01-21).md"
FILES = (VETERANS, PERMITS, MARRIAGE, CREDIT)
FLOOR = 0.875

pytestmark = [pytest.mark.slow, needs(*(REGS / f for f in FILES))]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tests.live import backgrounds_measured, engine_with_texts

    e = engine_with_texts(tmp_path_factory.mktemp("nosubject"),
                          {f: (REGS / f).read_text(encoding="utf-8") for f in FILES})
    backgrounds_measured(e, (1,))
    # The refusal these tests start from must not rest on the calibrated gate's margin: the packaged model's int8
    # kernels differ by CPU, and on one machine 「去报到要带些什么？」 alone scored −0.833 against the refusal threshold
    # −0.843 (weak, not refused). The admin's hard floor (min_similarity: below it the gate refuses whatever its score)
    # is set between that question's best cosine alone (≈ .86) and the search within the veterans regulation with the
    # last question in front (≈ .90), so the path under test — a refusal, then the search within the cited documents —
    # is the same on every machine.
    e.update_settings({"min_similarity": FLOOR})
    yield e
    e.close()


def _after(engine, first: str, question: str) -> dict:
    return engine.ask_sync(question, conversation_id=engine.ask_sync(first)["conversation_id"])


def test_refused_alone_it_is_answered_from_the_document_the_last_answer_cited(engine):
    alone = engine.ask_sync("去报到要带些什么？")
    assert alone["sources"] == [] and alone["trace"]["gate"]["max_similarity"] < FLOOR  # alone: refused
    res = _after(engine, "当兵两年退伍了，选择自己找工作，要在多少天内去报到？", "去报到要带些什么？")
    trace = res["trace"]
    assert trace["query"]["kind"] == "no_subject" and trace["query"]["query"] == "去报到要带些什么？"  # as typed
    assert trace["filter"]["doc_names"] == [VETERANS] and "within_cited_docs" in trace["ms"]
    assert {s["doc_name"] for s in res["sources"]} == {VETERANS}
    assert any("退出现役证件和介绍信" in s["text"] for s in res["sources"]), res["sources"]  # article 13
    permit = _after(engine, "工厂的排污许可证管几年？", "快到期了还要接着排，怎么办？")
    assert any("有效期届满60日前" in s["text"] for s in permit["sources"]), permit["answer"]


def test_after_an_unrelated_question_it_stays_refused(engine):
    res = _after(engine, "工厂的排污许可证管几年？", "去报到要带些什么？")
    assert res["trace"]["query"]["kind"] == "no_subject" and "within_cited_docs" in res["trace"]["ms"]  # tried
    assert res["sources"] == [] and not res["trace"].get("filter")  # 排污许可 holds nothing it asks: refused


def test_one_the_gate_lets_through_is_not_searched_again(engine):
    question = "两个人去登记离婚，提交申请后反悔了还能撤回吗？"  # names no subject the tagger knows as a noun
    alone = engine.ask_sync(question)
    assert alone["sources"]  # the gate lets it through on its own
    res = _after(engine, "工厂的排污许可证管几年？", question)
    assert res["trace"]["query"]["kind"] == "no_subject"
    assert "within_cited_docs" not in res["trace"]["ms"] and not res["trace"].get("filter")
    assert [s["doc_id"] for s in res["sources"]] == [s["doc_id"] for s in alone["sources"]]
