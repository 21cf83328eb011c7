"""An answer whose best sentence hands the matter to a document the knowledge base does not hold says where the
rule is and is weak (pipeline/generation/referral.py): real articles of ../shared/data/regulations, the real picker,
and through the engine the real document store deciding what the knowledge base holds."""
from __future__ import annotations

import pytest
from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.generation.extractive import ELSEWHERE_TEXT, ExtractivePicker, extractive_deltas
from pipeline.generation.referral import handed_over_to, title_key
from tests.shared_data import DATA, needs

REGS = DATA / "regulations"
DISPUTES = "医疗纠纷预防和处理条例(2018-07-31).md"
QUESTION = "医院出了医疗事故，事故是怎么分级的？"


@pytest.mark.parametrize("sentence, title", [
    ("对诊疗活动中医疗事故的行政调查处理，依照《医疗事故处理条例》的相关规定执行。", "医疗事故处理条例"),
    ("导致接受人因人体器官移植手术感染疾病的，依照《医疗事故处理条例》的规定予以处罚。", "医疗事故处理条例"),
    ("所支付的报酬低于当地最低工资标准的，按照《中华人民共和国劳动合同法》的有关规定处理。", "中华人民共和国劳动合同法"),
    # the law named only as the ground of a rule the sentence itself states: no hand-over
    ("依照《中华人民共和国行政许可法》第三十条规定的程序，由省级人民政府负责审批。", None),
    ("《医疗事故处理条例》同时废止。", None),
    ("医疗事故分为四级。", None),
])
def test_handed_over_to(sentence, title):
    assert handed_over_to(sentence) == title


def test_title_key_drops_the_state_prefix():
    assert title_key("中华人民共和国劳动合同法") == "劳动合同法"
    assert title_key("医疗事故处理条例") == "医疗事故处理条例"


def article(file: str, heading: str) -> str:
    lines = (REGS / file).read_text(encoding="utf-8").splitlines()
    return next(line for line in lines if line.startswith(heading + " "))


@needs(REGS / DISPUTES)
def test_answer_handed_over_to_a_missing_document_says_where_the_rule_is():
    from pipeline.models.tokenize_zh import ChineseTokenizer

    asked: list[tuple[str, list[int]]] = []

    def holds(fragment, kb_ids, held=()):
        asked.append((fragment, list(kb_ids)))
        return fragment in held

    text = article(DISPUTES, "第五十五条")
    nodes = [NodeWithScore(node=TextNode(text=text, metadata={"doc_name": DISPUTES, "doc_id": 1, "kb_id": 3}),
                           score=1.0)]
    missing = extractive_deltas(QUESTION, nodes, ExtractivePicker(ChineseTokenizer(), holds_document=holds))
    lines = "".join(missing.deltas).split("\n")
    assert missing.elsewhere == "医疗事故处理条例" and missing.weak, lines
    assert lines[1] == ELSEWHERE_TEXT.format(title="医疗事故处理条例") and "依照《医疗事故处理条例》" in lines[2]
    assert asked == [("医疗事故处理条例", [3])]  # asked of the knowledge base the source comes from
    # a figure asked that the article lacks: still where the rule is, not a bare 「未找到」 (it says more)
    figure = extractive_deltas("医疗事故的行政调查处理要多少天办完？", nodes,
                               ExtractivePicker(ChineseTokenizer(), holds_document=holds))
    assert figure.elsewhere == "医疗事故处理条例" and figure.weak, figure.deltas

    def held(fragment, kb_ids):
        return holds(fragment, kb_ids, held=("医疗事故处理条例",))

    present = extractive_deltas(QUESTION, nodes, ExtractivePicker(ChineseTokenizer(), holds_document=held))
    assert present.elsewhere is None and not present.weak
    assert ELSEWHERE_TEXT.split("《")[0] not in "".join(present.deltas)


@pytest.mark.slow
@needs(REGS / DISPUTES)
def test_engine_answer_from_a_pointer_is_weak_until_the_document_is_searched(tmp_path):
    """The real engine (packaged embedding model, offline, SQLite store): the pointer answers as weak, naming the
    missing regulation, while no knowledge base the question searches holds it — also when another one it does not
    search does; searching that one too, or uploading the document here, the sentence is no pointer to a missing
    one."""
    from tests.live import backgrounds_measured, engine_with_texts

    engine = engine_with_texts(tmp_path, {DISPUTES: (REGS / DISPUTES).read_text(encoding="utf-8")})
    missing_line = ELSEWHERE_TEXT.format(title="医疗事故处理条例")
    try:
        res = engine.ask_sync(QUESTION)
        assert res["sources"], res["answer"]
        assert res["answer"].split("\n")[1] == missing_line and res["weak"], res["answer"]
        docs = engine.components.docs
        assert not docs.any_retrievable_named(title_key("医疗事故处理条例"), [1])
        other = tmp_path / "医疗事故处理条例(2002-04-04).md"
        # its text shares nothing with the question: searching both KBs, the sources still all come from KB 1, so
        # only the searched scope (not the sources' KBs) can tell the answer that the KBs hold the document
        other.write_text("第九十八条 本条例自2002年9月1日起施行。\n", encoding="utf-8")
        kb2 = engine.create_kb("医疗事故")["kb_id"]
        engine.upload([(other.name, other)], kb_id=kb2)
        assert engine.wait_idle(300), "ingest did not finish"
        backgrounds_measured(engine, (1, kb2))
        assert docs.any_retrievable_named("医疗事故处理条例", [kb2]) and not docs.any_retrievable_named(
            "医疗事故处理条例", [1])
        assert not any(docs.any_retrievable_named(w, [1, kb2]) for w in ("%", "_", "条例%年"))  # LIKE: literal
        only_here = engine.ask_sync(QUESTION, kb_ids=[1])
        assert only_here["answer"].split("\n")[1] == missing_line, only_here["answer"]
        both = engine.ask_sync(QUESTION, kb_ids=[1, kb2])
        assert both["sources"] and {src["kb_id"] for src in both["sources"]} == {1}, both["sources"]
        assert missing_line not in both["answer"], both["answer"]
        engine.upload([(other.name, other)], kb_id=1)
        assert engine.wait_idle(300), "ingest did not finish"
        again = engine.ask_sync(QUESTION, kb_ids=[1])
        assert again["sources"] and missing_line not in again["answer"], again["answer"]
    finally:
        engine.close()
