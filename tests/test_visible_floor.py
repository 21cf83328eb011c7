"""The extractive picker's not-found floor counts word coverage over the words the knowledge base holds
(pipeline/generation/extractive.py, `visible_score`): a question typed in words no chunk holds is quoted as a weak
answer that says so, instead of 「资料中未找到」, when its best sentence clears the floor on the words that can match;
the ranking of sentences and every question whose words the KB holds are unchanged."""
from __future__ import annotations

import numpy as np
import pytest
from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.generation.candidates import Candidate, Cues
from pipeline.generation.extractive import (
    LOOSE_TEXT,
    NOT_FOUND_TEXT,
    ExtractivePicker,
    PickerParams,
    render,
    score,
    visible_score,
)
from pipeline.generation.sentences import Piece
from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.lexical import TermWeights, content_terms
from tests.shared_data import DATA, needs

# the packaged e5 profile's picker (pipeline/calibration/packaged-multilingual-e5-small.json, `extractive`)
E5 = PickerParams(w_cos=10.0, w_cov=2.0, w_phrase=0.0, w_rank=0.1, margin=0.5, not_found_below=0.8305,
                  w_context=2.0, w_focus=0.25, w_fpart=0.25, w_type=0.5)
BG = 0.80  # the KB background's median best cosine: the floor is 8.0 + 0.8305 here


def cand(text: str, cosine: float, coverage: float, source: int = 1, position: int = 0, context: float = 0.0):
    return Candidate(Piece(text, "。", position), source, coverage, 0.0, cosine=cosine, context=context)


RULE = cand("个人不得购买第一类、第二类易制毒化学品", cosine=0.83, coverage=0.15, source=2, position=3)
OTHER = cand("申请经营第一类易制毒化学品，应当具备下列条件", cosine=0.82, coverage=0.10)


def test_visible_score_counts_word_shares_over_the_words_the_kb_holds():
    assert visible_score(RULE, E5, 1.0) == pytest.approx(score(RULE, E5))
    # a third of the question's weight is visible: 0.15 of it covered is 0.45 of what any sentence can cover
    assert visible_score(RULE, E5, 1 / 3) - score(RULE, E5) == pytest.approx(2.0 * (0.45 - 0.15))
    with_context = cand("该条例自公布之日起施行", cosine=0.8, coverage=0.3, context=0.2)
    assert visible_score(with_context, E5, 0.5) - score(with_context, E5) == pytest.approx(2.0 * 0.3 + 2.0 * 0.2)
    assert visible_score(cand("x", 0.8, 0.9), E5, 0.5) - score(cand("x", 0.8, 0.9), E5) == pytest.approx(0.2)  # ≤ 1


def test_below_the_floor_on_all_words_but_above_it_on_the_visible_ones_is_a_loose_answer():
    picker = ExtractivePicker(ChineseTokenizer())
    picker.params = E5  # the embedding picker's selection rule, on scored candidates (no model needed)
    assert score(RULE, E5) - 10 * BG < E5.not_found_below  # refused on every word of the question
    whole = picker.select([OTHER, RULE], 6, BG)
    assert not whole.found and not whole.loose
    loose = picker.select([OTHER, RULE], 6, BG, visible=0.4)
    assert loose.found and loose.loose and loose.best is RULE  # the ranking is the usual one
    assert [c.piece.text for c in loose.sentences] == [OTHER.piece.text, RULE.piece.text]  # within the margin
    ex = render(loose)
    lines = "".join(ex.deltas).split("\n")
    assert lines[1] == LOOSE_TEXT and ex.weak and ex.loose
    assert NOT_FOUND_TEXT[:6] not in "".join(ex.deltas)  # not the refusal's words: it quotes
    # a question whose words the KB does not hold anyway, and no sentence near it: still not found
    assert not picker.select([cand("本条例自公布之日起施行", 0.78, 0.0)], 6, BG, visible=0.4).found
    # a best sentence that clears the floor on every word is an ordinary answer, whatever the visible share
    strong = cand("个人不得购买第一类易制毒化学品", cosine=0.86, coverage=0.3)
    plain = picker.select([strong], 6, BG, visible=0.4)
    assert plain.found and not plain.loose and not render(plain).weak


def test_cues_read_the_visible_share_from_the_knowledge_base():
    tok = ChineseTokenizer()
    terms = content_terms(tok("个人能买乙醚吗"))
    held = [t for t in terms if t != "乙醚"]
    vocab = {t: i for i, t in enumerate(held)}
    weights = TermWeights(vocab, np.full(len(held), 5), 1000)
    cues = Cues.of("个人能买乙醚吗", tok, weights)
    assert "乙醚" in cues.terms and 0.0 < cues.visible < 1.0
    assert cues.visible == pytest.approx(weights.visible_share(terms))
    assert Cues.of("个人能买乙醚吗", tok, TermWeights.uniform()).visible == 1.0  # no index: nothing known hidden


def test_without_a_floor_nothing_is_loose():
    """No background measured yet (the embedding picker) or no embedding model (the lexical picker, whose only
    "not found" is no shared word): the visible share decides nothing, so no answer is marked loose."""
    picker = ExtractivePicker(ChineseTokenizer())
    picker.params = E5
    unmeasured = picker.select([OTHER, RULE], 6, None, visible=0.4)  # the same candidates, no background
    assert unmeasured.found and not unmeasured.loose and unmeasured.best is RULE
    tok = ChineseTokenizer()
    question = "个人能买乙醚吗？"
    held = [t for t in content_terms(tok(question)) if t != "乙醚"]
    weights = TermWeights({t: i for i, t in enumerate(held)}, np.full(len(held), 5), 1000)
    lexical = ExtractivePicker(tok, weights_of=lambda kb_ids: weights)
    assert lexical.cues(question, []).visible < 1.0

    def node(text):
        return NodeWithScore(node=TextNode(text=text, metadata={"doc_id": 1, "kb_id": 1}), score=1.0)

    shared = lexical.pick(question, [node("第十六条 个人不得购买第一类、第二类易制毒化学品。")])
    assert shared.found and not shared.loose  # 个人 is shared: found on its own, not through the visible share
    assert not lexical.pick(question, [node("第二条 本条例自公布之日起施行。")]).found


REGS = DATA / "regulations"
AVIATION = "民用航空安全保卫条例(2011-01-08).md"
CHEMICALS = "易制毒化学品管理条例(2018-09-18).md"
CURRENCY = "人民币管理条例(2018-03-19).md"


@pytest.mark.slow
@needs(REGS / AVIATION, REGS / CHEMICALS, REGS / CURRENCY)
def test_engine_quotes_a_question_typed_in_words_the_regulations_never_use(tmp_path):
    """The real engine (packaged embedding model, offline) over three real regulations: 「违禁品」「查出来」 are in
    none of them, so no sentence can cover those words. Before the floor read the visible words (session 19) the
    answer was 「资料中未找到」; with it the penalty article was quoted under the loose line; since the yes/no verdict is a
    cue (session 20) the same article's 「可以处以…罚款」 clears the floor outright: the deciding clause is quoted as a
    plain answer, never the refusal (the loose rule itself:
    test_below_the_floor_on_all_words_but_above_it_on_the_visible_ones_is_a_loose_answer). A question whose words
    the articles use is answered as before."""
    from tests.live import backgrounds_measured, engine_with_texts

    engine = engine_with_texts(tmp_path, {f: (REGS / f).read_text(encoding="utf-8")
                                          for f in (AVIATION, CHEMICALS, CURRENCY)})
    try:
        backgrounds_measured(engine, (1,))
        res = engine.ask_sync("上飞机随身带了违禁品被查出来，会罚款吗？")
        lines = res["answer"].split("\n")
        assert res["sources"] and NOT_FOUND_TEXT not in res["answer"], res["answer"]
        assert lines[1] != LOOSE_TEXT, res["answer"]  # the verdict clears the floor outright (≈ .4 above it)
        # items of 第三十五条's list are quoted on one line under its lead-in (extractive.render_items)
        assert any("可以处以5000元以下罚款" in ln and "《民用航空安全保卫条例》第三十五条" in ln for ln in lines[1:]), lines
        plain = engine.ask_sync("出差想把剪刀带上飞机，不能随身带的话能托运吗？")
        assert plain["sources"] and LOOSE_TEXT not in plain["answer"], plain["answer"]
        assert "旅客不得随身携带，但是可以作为行李交运" in plain["answer"]
    finally:
        engine.close()
