"""The LLM's 「资料不足」 verdict through every door of the real app (REST SSE, REST sync, the OpenAI-compatible
endpoint with the `openai` SDK, the page's chat handler through gradio_client) and in the stored turn: a verdict
first is the gate's refusal; a verdict after streamed text replaces it (the `replace` event); an answer that merely
mentions 资料 stays an answer. The LLM is the scripted OpenAI-compatible server over real HTTP."""
from __future__ import annotations

import json

import pytest

from pipeline import events as ev
from tests.fake_llm import FakeLLMServer
from tests.live import LiveApp
from tests.test_ui_chat import CHAT, assistant_text
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

RULE = "退货政策：一般商品自签收之日起七日内可以无理由退货，退货运费由买家承担。"
QUESTION = "定制的商品能退吗？"
GENERAL = "一般商品自签收之日起七日内可以无理由退货[1]。"
AT_THE_END = GENERAL + "\n\n资料不足"
FIRST = "资料不足"
MENTIONS = "资料显示，一般商品七日内可以无理由退货[1]。"


@pytest.fixture(scope="module")
def llm():
    with FakeLLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def live(tmp_path_factory, llm):
    tmp = tmp_path_factory.mktemp("verdict-doors")
    # no gate and no multi-query: every question reaches the (scripted) answer call, and only it
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"), adaptive_gate=False, llm_multi_query=False,
                         llm_api_url=llm.base_url, llm_model="fake-model")
    p = tmp / "退货政策.txt"
    p.write_text(RULE, encoding="utf-8")
    assert all(r.ok for r in engine.upload([(p.name, p)]))
    wait_idle(engine)
    app = LiveApp(engine, owns_engine=True)
    yield app
    app.stop()


def sse(live, llm, reply: str) -> list[tuple[str, dict]]:
    llm.reply, llm.responder = reply, None
    llm.reset()
    with live.http() as http, http.stream("POST", "/api/qa/ask", json={"question": QUESTION}) as r:
        out, name = [], None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def stored_turn(live, done: dict) -> dict:
    with live.http() as http:
        conv = http.get(f"/api/conversations/{done['conversation_id']}").json()["data"]
    return conv["turns"][-1]


def test_sse_verdict_first_is_the_refusal(live, llm):
    events = sse(live, llm, FIRST)
    names = [n for n, _ in events]
    assert "replace" not in names and names[-1] == "done"
    assert [d["text"] for n, d in events if n == "delta"] == [ev.NO_ANSWER_TEXT]
    assert dict(events)["sources"] == {"sources": []}
    done = events[-1][1]
    assert done["no_answer"] is True and done["refusal"] == {"by": "llm", "reason": ev.LLM_INSUFFICIENT_REASON}
    turn = stored_turn(live, done)
    assert turn["answer"] == ev.NO_ANSWER_TEXT and turn["no_answer"] and turn["trace"]["refusal"]["by"] == "llm"


def test_sse_verdict_at_the_end_replaces_the_streamed_text(live, llm):
    events = sse(live, llm, AT_THE_END)
    names = [n for n, _ in events]
    streamed = "".join(d["text"] for n, d in events if n == "delta")
    assert "七日内" in streamed  # the model's text was shown while it streamed …
    i = names.index("replace")
    assert events[i][1] == {"text": ev.NO_ANSWER_TEXT, "reason": ev.LLM_INSUFFICIENT_REASON}
    assert "delta" not in names[i:] and names[i + 1:] == ["sources", "done"]  # … and then replaced
    done = events[-1][1]
    assert done["no_answer"] is True and done["refusal"]["by"] == "llm"
    turn = stored_turn(live, done)
    assert turn["answer"] == ev.NO_ANSWER_TEXT and "七日" not in turn["answer"] and turn["no_answer"]
    row = live.engine.audit_log(1, 1, door="rest")["items"][0]
    assert row["outcome"] == "refuse" and row["detail"]["refused_by"] == "llm"


def test_sse_an_answer_mentioning_materials_is_no_verdict(live, llm):
    events = sse(live, llm, MENTIONS)
    assert "replace" not in [n for n, _ in events]
    assert "".join(d["text"] for n, d in events if n == "delta") == MENTIONS
    done = events[-1][1]
    assert done["no_answer"] is False and "refusal" not in done
    assert stored_turn(live, done)["answer"] == MENTIONS


def test_rest_sync_holds_only_the_refusal(live, llm):
    llm.reply, llm.responder = AT_THE_END, None
    with live.http() as http:
        out = http.post("/api/qa/ask/sync", json={"question": QUESTION}).json()["data"]
    assert out["answer"] == ev.NO_ANSWER_TEXT and out["no_answer"] is True and out["sources"] == []


def sdk(live):
    import openai

    return openai.OpenAI(base_url=live.url + "v1", api_key="none", max_retries=0)


def test_openai_non_stream_holds_only_the_refusal(live, llm):
    llm.reply, llm.responder = AT_THE_END, None
    reply = sdk(live).chat.completions.create(model="kb-1", messages=[{"role": "user", "content": QUESTION}])
    assert reply.choices[0].message.content == ev.NO_ANSWER_TEXT
    kbqa = reply.model_extra["kbqa"]
    assert kbqa["outcome"] == "refuse" and kbqa["retracted"] is True and kbqa["answer"] == ev.NO_ANSWER_TEXT


def stream(live, llm, reply: str) -> tuple[str, dict]:
    llm.reply, llm.responder = reply, None
    chunks = list(sdk(live).chat.completions.create(model="kb-1", stream=True,
                                                     messages=[{"role": "user", "content": QUESTION}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].model_extra["kbqa"]


def test_openai_stream_verdict_at_the_end_says_the_text_is_void(live, llm):
    text, kbqa = stream(live, llm, AT_THE_END)
    assert text.startswith(GENERAL[:10])  # already sent: a stream cannot take chunks back …
    void = text.index("以上内容作废")
    assert text.endswith(ev.NO_ANSWER_TEXT) and void < text.index(ev.NO_ANSWER_TEXT)  # … so it voids them
    assert kbqa["outcome"] == "refuse" and kbqa["retracted"] is True and kbqa["answer"] == ev.NO_ANSWER_TEXT


def test_openai_stream_verdict_first_and_a_normal_answer(live, llm):
    text, kbqa = stream(live, llm, FIRST)
    assert text == ev.NO_ANSWER_TEXT and kbqa["outcome"] == "refuse" and kbqa["retracted"] is False
    text, kbqa = stream(live, llm, MENTIONS)
    assert text == MENTIONS and kbqa["outcome"] == "answer" and kbqa["retracted"] is False


def test_the_page_bubble_keeps_only_the_refusal(live, llm):
    llm.reply, llm.responder = AT_THE_END, None
    llm.chunk_delay = 0.05  # slow enough that the page shows the text before the verdict arrives
    client = live.client()
    try:
        client.predict(api_name="/new_conversation")
        job = client.submit(QUESTION, True, api_name="/ask")
        final = job.result(timeout=120)
        bubbles = [assistant_text(o[CHAT]) for o in job.outputs() if isinstance(o[CHAT], list)]
    finally:
        llm.chunk_delay = 0.0
    assert any("七日" in b for b in bubbles)  # streamed first …
    last = assistant_text(final[CHAT])
    assert ev.NO_ANSWER_TEXT in last and "七日" not in last  # … replaced, not left on screen


def test_mcp_ask_holds_only_the_refusal(live, llm):
    from tests.mcp_client import over_http

    llm.reply, llm.responder = AT_THE_END, None

    async def work(s):
        return (await s.call_tool("ask", {"question": QUESTION})).structured_content

    out = over_http(live.url, {}, work)
    assert out["answer"] == ev.NO_ANSWER_TEXT and out["outcome"] == "refuse" and out["sources"] == []
