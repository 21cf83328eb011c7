"""Prompt containment (issue 27 #8) against the scripted OpenAI-compatible LLM, which records every prompt.

tests/data/injections.json holds 34 injection documents: our delimiter tags (material, materials, history, query,
question), chat-template and role tokens of the common model families (ChatML, Zephyr, Llama 2/3, Gemma, Mistral,
Phi, DeepSeek, <s>, <think> …), in raw, entity (decimal, hex, named, double, no semicolon), full-width,
Cyrillic/Greek homoglyph, look-alike bracket, zero-width and spaced/uppercase forms — in the text and in a
document name. Each goes through the three prompts that carry untrusted text: the answer prompt (as a material,
as earlier turns in <history>, as the rewritten query), the follow-up rewrite prompt, the DIRECT chat. What the
LLM receives may hold only our own delimiters, each exactly as often as the prompt builds them.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.conversation.direct import direct_reply
from pipeline.conversation.rewrite import DeterministicRewriter, LLMRewriter
from pipeline.conversation.router import Route
from pipeline.generation.answer import stream_answer
from pipeline.generation.containment import contain, markers
from pipeline.generation.prompting import SYSTEM_PROMPT
from tests.test_generation import llm_for, run

CORPUS = json.loads((Path(__file__).parent / "data" / "injections.json").read_text(encoding="utf-8"))["documents"]
BATCH = 6


def _node(doc: dict) -> NodeWithScore:
    return NodeWithScore(node=TextNode(text=doc["text"], metadata={"doc_name": doc["doc_name"], "page": 1}),
                         score=1.0)


def _leftover(content: str, *, materials: int = 0, blocks: tuple[str, ...] = ()) -> list[str]:
    """Markers in `content` beyond our own: `materials` material blocks inside one <materials>, and one of each
    block in `blocks` (history, query, question). A forged tag anywhere would add one."""
    found = Counter(markers(content))
    expected = Counter()
    if materials:
        expected.update({"<materials>": 1, "</materials>": 1, "</material>": materials})
    for b in blocks:
        expected.update({f"<{b}>": 1, f"</{b}>": 1})
    opens = [m for m in found if re.fullmatch(r'<material id="\d+"( source="[^"<>]*")?( page="\d+")?>', m)]
    assert sum(found[m] for m in opens) == materials, (opens, content[:400])
    for m in opens:
        del found[m]
    missing = expected - found
    assert not missing, missing  # the prompt's own blocks are all there
    return list((found - expected).elements())


def test_corpus_is_real_and_contain_clears_every_marker():
    assert len(CORPUS) >= 30
    for doc in CORPUS:
        raw = doc["text"] + doc["doc_name"]
        assert markers(raw), f"{doc['kind']}: holds no marker, so it tests nothing"
        assert markers(contain(raw)) == [], (doc["kind"], contain(raw))
        assert "本公司差旅报销标准" in contain(doc["text"])  # the document's own text reaches the model


def test_system_prompt_carries_no_role_token():
    assert Counter(markers(SYSTEM_PROMPT)) <= Counter({"<materials>": 1, '<material id="编号">': 1, "</material>": 1,
                                                       "<history>": 1, "<query>": 1})


def test_answer_prompt_materials_history_and_query(fake_llm):
    llm = llm_for(fake_llm)
    for i in range(0, len(CORPUS), BATCH):
        batch = CORPUS[i:i + BATCH]
        history = [{"question": d["text"][-60:], "answer": d["text"]} for d in batch[:3]]
        query = "差旅住宿标准" + batch[-1]["text"][-40:]
        run(stream_answer("差旅住宿标准是多少？", [_node(d) for d in batch], llm, 0.1, history=history,
                          retrieval_query=query))
        body = fake_llm.chat_requests[-1]["body"]
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        assert system == SYSTEM_PROMPT
        assert _leftover(user, materials=len(batch), blocks=("history", "query")) == [], [d["kind"] for d in batch]
        assert user.count("本公司差旅报销标准") >= len(batch)  # every document's text reaches the model


def test_rewrite_prompt_and_direct_chat(fake_llm):
    llm = llm_for(fake_llm)
    fake_llm.reply = "差旅住宿标准是多少？"
    for doc in CORPUS:
        history = [{"question": "差旅住宿标准" + doc["text"][-50:], "answer": doc["text"], "route": "KB"}]
        LLMRewriter(llm, DeterministicRewriter()).rewrite("那" + doc["text"][-30:] + "呢？", history)
        user = fake_llm.chat_requests[-1]["body"]["messages"][-1]["content"]
        assert _leftover(user, blocks=("history", "question")) == [], (doc["kind"], user)
        run(direct_reply(doc["text"], Route("DIRECT", "测试", kind="chat"), history, llm, 0.1))
        for m in fake_llm.chat_requests[-1]["body"]["messages"][1:]:
            assert markers(m["content"]) == [], (doc["kind"], m)


@pytest.mark.parametrize("kind", ["chatml", "homoglyph-cyrillic", "entity-dec"])
def test_the_model_sees_the_text_not_the_token(kind):
    doc = next(d for d in CORPUS if d["kind"] == kind)
    out = contain(doc["text"])
    assert "「" in out and "<|im_start|>" not in out and "</mаteriаl>" not in out and "&#60;" not in out
