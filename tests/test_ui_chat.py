"""问答 tab through gradio_client against the live app (FastAPI + mounted Gradio) on a temp data dir.

No LLM is configured, so the engine answers extractively (label + [n] citations) — enough for the UI contract:
streamed stages and partial answers, [n] in the answer, sources naming the file, the fixed no-answer text,
retry from the same retrieval, history records and their replay, the header badge.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest  # noqa: E402

from pipeline import events as ev  # noqa: E402
from pipeline.access import AccessPolicy  # noqa: E402
from tests.live import LiveApp  # noqa: E402

KB_NAME = "星河电子客服手册.txt"
KB_TEXT = ("星河电子公司退货政策：自签收之日起 7 天内可无理由退货，商品需保持完好。\n"
           "星河电子公司的客服电话是 400-800-1234，服务时间为每天 9 点到 21 点。\n"
           "星河电子公司成立于 2003 年，总部位于杭州市西湖区，主要生产智能手表和蓝牙耳机。\n"
           "保修政策：智能手表整机保修一年，电池保修六个月，人为损坏不在保修范围内。\n")
QUESTION = "星河电子的客服电话是多少？"
OFF_TOPIC = "How many moons does the planet Neptune have?"


LiveUI = LiveApp  # the browser test imports this name


def make_engine(data_dir: Path, with_doc: bool = True):
    from pipeline.engine import Engine

    engine = Engine(data_dir, load_async=False)
    if with_doc:
        f = data_dir / "upload-src.txt"
        f.write_text(KB_TEXT, encoding="utf-8")
        res = engine.upload([(KB_NAME, f)])
        assert res and res[0].ok, res
        assert engine.wait_idle(120)
        assert engine.health()["chunks"] > 0
    return engine


def assistant_text(chat_value) -> str:
    """Text of the last assistant message in a Chatbot value as gradio_client returns it."""
    if not isinstance(chat_value, list):
        return ""
    for msg in reversed(chat_value):
        if isinstance(msg, dict) and msg.get("role") == "assistant":
            c = msg.get("content")
            if isinstance(c, str):
                return c
            return "".join(p.get("text", "") for p in c or [] if isinstance(p, dict))
    return ""


def plain(md: str) -> str:
    return re.sub(r"<[^>]+>", "", md or "")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = make_engine(tmp_path_factory.mktemp("uichat"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def live(engine):
    ui = LiveUI(engine)
    yield ui
    ui.stop()


@pytest.fixture(scope="module")
def client(live):
    return live.client()


def run_ask(client, question, history=None):
    job = client.submit(question, history if history is not None else [], api_name="/ask")
    final = job.result(timeout=180)
    return job.outputs(), final


# outputs of /ask and /retry, in order (buttons and gr.State are not part of the API)
CHAT, STAGE, SOURCES, TRACE, QUESTION_BOX, HISTORY = range(6)


def test_ask_streams_stages_partial_answer_and_sources(client):
    outputs, final = run_ask(client, QUESTION)
    stages = " ".join(o[STAGE] for o in outputs if isinstance(o[STAGE], str))
    assert "检索中" in stages and 'data-phase="recall"' in stages
    assert 'data-phase="generate"' in stages and "生成中" in stages
    assert "完成" in final[STAGE]
    answers = [plain(assistant_text(o[CHAT])) for o in outputs if isinstance(o[CHAT], list)]
    final_answer = plain(assistant_text(final[CHAT]))
    assert final_answer.startswith(ev.EXTRACTIVE_LABEL)
    assert "400-800-1234" in final_answer
    assert "[1]" in final_answer
    # the answer streamed: at least one intermediate answer text that is a proper prefix of the final one
    partial = [a for a in answers if a and a != "…" and a != final_answer and final_answer.startswith(a.strip())]
    assert partial, answers
    # citations are clickable links to the source cards
    assert 'class="kb-cite"' in assistant_text(final[CHAT]) and 'href="#kb-src-1"' in assistant_text(final[CHAT])
    # sources panel: [n] · file name · snippet · similarity
    assert KB_NAME in final[SOURCES] and 'id="kb-src-1"' in final[SOURCES] and "相似度" in final[SOURCES]
    # trace: the four stages and the rerank note (no reranker configured → skipped)
    for sec in ("bm25", "vector", "rrf", "rerank"):
        assert f'data-sec="{sec}"' in final[TRACE]
    assert "精排已跳过" in final[TRACE] and "ms" in final[TRACE]
    # the input box was cleared and a complete history record came back for the browser
    assert outputs[0][QUESTION_BOX] == ""
    hist = final[HISTORY]
    assert isinstance(hist, list) and hist[0]["question"] == QUESTION
    assert hist[0]["answer"].startswith(ev.EXTRACTIVE_LABEL) and hist[0]["sources"] and hist[0]["trace"]
    assert isinstance(hist[0]["elapsed_ms"], (int, float)) and hist[0]["time"]


def test_no_answer_shows_fixed_refusal(client):
    _, final = run_ask(client, OFF_TOPIC)
    text = plain(assistant_text(final[CHAT]))
    assert ev.NO_ANSWER_TEXT in text
    assert "知识库" in final[SOURCES] and 'data-count="0"' in final[SOURCES]
    assert final[HISTORY][0]["no_answer"] is True


def test_retry_reuses_the_same_retrieval(client, engine):
    _, first = run_ask(client, QUESTION)
    calls = engine.retrieval_calls
    job = client.submit(first[HISTORY], api_name="/retry")
    final = job.result(timeout=180)
    assert engine.retrieval_calls == calls, "retry must regenerate from the cached retrieval"
    assert plain(assistant_text(final[CHAT])) == plain(assistant_text(first[CHAT]))
    assert final[HISTORY][0]["question"] == QUESTION and len(final[HISTORY]) == len(first[HISTORY]) + 1


def test_validation_error_is_shown_in_the_bubble(client):
    _, final = run_ask(client, "问" * 2500)
    text = plain(assistant_text(final[CHAT]))
    assert "回答失败" in text and "过长" in text
    assert "1001" in final[STAGE]


def test_history_replay_delete_and_clear(client):
    _, first = run_ask(client, QUESTION)
    history = first[HISTORY]
    rec = history[0]
    listed = client.predict(history, api_name="/history_list")  # the browser does this on every change
    assert listed is None or listed == "" or isinstance(listed, (str, list, dict))
    chat, stage, sources, trace = client.predict(rec["id"], history, api_name="/history_replay")
    assert plain(assistant_text(chat)) == plain(assistant_text(first[CHAT]))
    assert sources == first[SOURCES]
    assert trace == first[TRACE]
    assert "历史记录" in stage
    after_delete = client.predict(rec["id"], history, api_name="/history_delete")
    assert [r["id"] for r in after_delete] == [r["id"] for r in history[1:]]
    msg = client.predict(history, api_name="/history_clear_ask")
    assert str(len(history)) in msg
    assert client.predict(history, api_name="/history_clear_confirm") == []


def test_header_badge(client, engine):
    html = client.predict(api_name="/header_badge")
    assert f"知识库: {engine.health()['chunks']} 块" in html
    assert "multilingual-e5-small" in html
    assert "原文摘录" in html or "大模型" in html


def test_logged_in_user_can_ask_and_history_is_per_user(engine):
    policy = AccessPolicy.from_args(["alice:pw-a", "bob:pw-b"], admins=["alice"])
    ui = LiveUI(engine, policy)
    try:
        bob = ui.client(auth=("bob", "pw-b"))
        _, final = run_ask(bob, QUESTION, history=[{"id": "x1", "user": "alice", "question": "alice 的问题",
                                                    "answer": "a", "sources": [], "trace": {}, "ts": 1}])
        hist = final[HISTORY]
        assert hist[0]["user"] == "bob" and hist[0]["question"] == QUESTION
        assert any(r["user"] == "alice" for r in hist), "other users' records are kept untouched"
        # bob's list shows only his records, and he cannot replay alice's record
        bob.predict(hist, api_name="/history_list")
        try:
            out = bob.predict("x1", hist, api_name="/history_replay")
        except Exception as exc:  # refused by the list's own choices check
            out = str(exc)
        assert "alice 的问题" not in str(out)
    finally:
        ui.stop()


# ---------------------------------------------------------------------------------------------- pure helpers
def test_history_helpers_cap_and_scope():
    from ui import history as h

    state = []
    for i in range(55):
        state = h.add(state, h.make_record(f"q{i}", "a", [], {}, 1, None, now=1000 + i))
    state = h.add(state, h.make_record("other", "a", [], {}, 1, "bob", now=5000))
    assert len(h.for_user(state, None)) == h.MAX_RECORDS
    assert h.for_user(state, None)[0]["question"] == "q54"
    assert [label for label, _ in h.choices(state, "bob")] and len(h.choices(state, "bob")) == 1
    rid = h.for_user(state, None)[3]["id"]
    assert h.find(state, rid, "bob") is None
    assert len(h.for_user(h.delete(state, rid, None), None)) == 49
    assert h.for_user(h.clear(state, None), None) == [] and len(h.clear(state, None)) == 1
    assert h.for_user("garbage", None) == [] and h.add(None, h.make_record("q", "a", [], {}, 1, None))


def test_render_escapes_and_links_citations():
    from ui.render import answer_markdown, render_sources, render_trace

    md = answer_markdown("<script>x</script> 答案[1]，另见[12]")
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert 'href="#kb-src-1"' in md and 'data-cite="12"' in md
    long = "甲" * 100
    html = render_sources([{"no": 1, "doc_name": "<b>a.txt</b>", "text": long, "similarity": 0.91234}])
    assert "&lt;b&gt;a.txt&lt;/b&gt;" in html and "甲" * 80 + "…" in html and "0.912" in html
    tr = render_trace({"bm25": [], "vector": [], "rrf": [], "rerank": [],
                       "rerank_status": {"status": "fallback", "msg": "精排失败，已按 RRF 顺序：boom"},
                       "ms": {"bm25": 1.23, "rerank": 4.5}})
    assert "精排已回退" in tr and "boom" in tr and "BM25 1.2 ms" in tr


def test_share_tunnel_failure_is_reported(monkeypatch, capsys):
    import gradio.networking

    from ui.share import open_share_tunnel

    def boom(**kw):
        raise RuntimeError("Could not get share link from Gradio API Server.")

    monkeypatch.setattr(gradio.networking, "setup_tunnel", boom)

    class B:
        share_token = "t"

    t0 = time.time()
    assert open_share_tunnel(B(), "0.0.0.0", 7860) is None
    assert time.time() - t0 < 5
    out = capsys.readouterr().out
    assert "未能创建公网分享链接" in out and "本地" in out


def test_restricted_tabs_start_hidden_with_logins(engine):
    """With --auth, 知识库/配置 are not rendered until the load event shows them to kb-admins/admins."""
    from ui import build_ui

    def tab_visibility(demo):
        return {b.elem_id: b.visible for b in demo.blocks.values() if getattr(b, "elem_id", None) in
                ("tab-qa", "tab-kb", "tab-config")}

    assert tab_visibility(build_ui(engine)) == {"tab-qa": True, "tab-kb": True, "tab-config": True}
    policy = AccessPolicy.from_args(["alice:a", "bob:b"], admins=["alice"])
    assert tab_visibility(build_ui(engine, policy)) == {"tab-qa": True, "tab-kb": False, "tab-config": False}
