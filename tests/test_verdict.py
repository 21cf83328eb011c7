"""The LLM's 「资料不足」 verdict recognised in the answer stream (pipeline/generation/verdict.py, answer.py):
first, at the end, or not at all when an answer merely talks about 资料 — with the scripted LLM over HTTP."""
from __future__ import annotations

import pytest

from pipeline.generation.answer import stream_answer
from pipeline.generation.prompting import SYSTEM_PROMPT
from pipeline.generation.verdict import HOLD_LIMIT, VERDICT, VerdictWatch, ends_with_verdict
from tests.test_generation import NODES, llm_for, run, texts


def watched(pieces: list[str]) -> tuple[str, bool, list[str]]:
    """(text shown, verdict, what each feed released)"""
    w = VerdictWatch()
    out = [w.feed(p) for p in pieces]
    out.append(w.flush())
    return "".join(out), w.verdict, out


@pytest.mark.parametrize("pieces", [["资料", "不足"], ["「资料不足」"], ["  **资料", "不足**\n"], ["资料不足。", "资料未提到该产品"],
                                    ["【资料不", "足】：未涉及"], ["资料不足\n", "其余"], ["资料不足", "[", "1", "]", "。"],
                                    ["资料不足[1]"]])
def test_a_verdict_first_shows_nothing(pieces):
    shown, verdict, _ = watched(pieces)
    assert verdict and shown == ""


@pytest.mark.parametrize("pieces", [["资料", "显示，退货", "期限为七日[1]。"], ["资料不足的，", "应当补正[1]。"],
                                    ["根据资料，", "期限为七日[1]。"], ["申请资料不足，可以补交[1]。"], ["资料"],
                                    ["资料不足[", "a]"]])
def test_an_answer_about_materials_is_no_verdict(pieces):
    shown, verdict, _ = watched(pieces)
    assert not verdict and shown == "".join(pieces)


def test_only_a_possible_verdict_start_is_held_and_never_long():
    _, _, out = watched(["根", "据资料"])
    assert out[0] == "根"  # nothing that cannot open the verdict waits
    _, _, out = watched(["资料", "显", "示"])
    assert out[:2] == ["", "资料显"]
    _, verdict, out = watched([" "] * (HOLD_LIMIT + 2))
    assert not verdict and "".join(out[:HOLD_LIMIT]) != ""  # leading blanks are held HOLD_LIMIT at most


@pytest.mark.parametrize(("text", "verdict"), [
    ("一般规定是七日内退货[1]。\n\n资料不足", True), ("一般规定是七日[1]。\n「资料不足」\n", True),
    ("一般规定是七日[1]。\n资料不足：资料未提到定制商品。", True), ("一般规定是七日[1]。\n**资料不足**[1]", True), ("退货期限为七日[1]，资料不足时可补交。", False),
    ("退货期限为七日[1]。\n资料不足的，应当补正[2]。", False), ("", False)])
def test_a_verdict_at_the_end(text, verdict):
    assert ends_with_verdict(text) is verdict


def test_the_prompt_asks_for_the_verdict_on_the_specific_point():
    assert f"「{VERDICT}」" in SYSTEM_PROMPT and "具体事项" in SYSTEM_PROMPT and "一般性规定" in SYSTEM_PROMPT


# --- over the scripted LLM (real HTTP, real SSE) --------------------------------------------------------
def test_verdict_first_stops_the_stream_and_returns_no_text(fake_llm):
    fake_llm.reply = "资料不足。" + "资料只规定了一般商品的退货期限，没有提到定制商品。" * 20
    fake_llm.chunk_delay = 0.01
    events, result = run(stream_answer("定制商品能退吗？", NODES, llm_for(fake_llm), 0.3))
    assert events == [] and result.insufficient and not result.shown
    assert fake_llm.sent_chunks < 60  # the stream was closed at the verdict, not read to its end (≈ 180 chunks)


def test_verdict_at_the_end_is_reported_after_the_streamed_text(fake_llm):
    fake_llm.reply = "一般商品自收货起七日内可退[1]。\n\n资料不足"
    events, result = run(stream_answer("定制商品能退吗？", NODES, llm_for(fake_llm), 0.3))
    assert "".join(texts(events)).startswith("一般商品自收货起七日内可退")
    assert result.insufficient and result.shown


def test_an_answer_mentioning_materials_streams_unchanged(fake_llm):
    fake_llm.reply = "资料显示，退货期限为 7 天[1]。"
    events, result = run(stream_answer("退货期限？", NODES, llm_for(fake_llm), 0.3))
    assert "".join(texts(events)) == "资料显示，退货期限为 7 天[1]。" == result.text
    assert not result.insufficient and result.cited == {1}
