"""问答 tab through gradio_client against the live app (FastAPI + mounted Gradio) on a temp data dir.

No LLM is configured, so the engine answers extractively (label + [n] citations) — enough for the UI contract:
streamed stages and partial answers, [n] in the answer, sources naming the file, the fixed no-answer text,
retry from the same retrieval, follow-ups in one conversation, the server-side history (open, per-turn view,
rename, export, delete, clear, restore after reload, per user), chit-chat and the knowledge switch, the badge.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest  # noqa: E402

from pipeline import events as ev  # noqa: E402
from pipeline.access.policy import AccessPolicy  # noqa: E402
from tests.live import LiveApp  # noqa: E402

# Marked slow: tests on the `engine` / `client` fixtures — the packaged e5 model (real quality, minutes on 2 cores).

KB_NAME = "星河电子客服手册.txt"
KB_TEXT = ("星河电子公司退货政策：自签收之日起 7 天内可无理由退货，商品需保持完好。\n"
           "星河电子公司的客服电话是 400-800-1234，服务时间为每天 9 点到 21 点。\n"
           "星河电子公司成立于 2003 年，总部位于杭州市西湖区，主要生产智能手表和蓝牙耳机。\n"
           "保修政策：智能手表整机保修一年，电池保修六个月，人为损坏不在保修范围内。\n")
QUESTION = "星河电子的客服电话是多少？"
OFF_TOPIC = "How many moons does the planet Neptune have?"


LiveUI = LiveApp  # the browser test imports this name


def make_engine(data_dir: Path, with_doc: bool = True, deployment=None):
    from pipeline.engine import Engine

    engine = Engine(data_dir, load_async=False, deployment=deployment)
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


def run_ask(client, question, new=True, use_kb=True):
    """Ask in the client's session; new=True starts a new conversation first (else it is a follow-up)."""
    if new:
        client.predict(api_name="/new_conversation")
    job = client.submit(question, use_kb, api_name="/ask")
    final = job.result(timeout=180)
    return job.outputs(), final


# outputs of /ask and /retry, in order (buttons and gr.State are not part of the API)
CHAT, STAGE, SOURCES, TRACE, TURNS, LAST_CONV, QUESTION_BOX, HISTORY_LIST = range(8)
# outputs of /history_open, /select_turn, /restore_conversation (the conversation view)
V_CHAT, V_STAGE, V_SOURCES, V_TRACE, V_TURNS, V_LAST_CONV = range(6)


@pytest.mark.slow
def test_ask_streams_stages_partial_answer_and_sources(client, engine):
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
    # trace: the four stages and the rerank note (no reranker configured → skipped); the route taken
    for sec in ("bm25", "vector", "fused", "rerank"):
        assert f'data-sec="{sec}"' in final[TRACE]
    assert "精排已跳过" in final[TRACE] and "ms" in final[TRACE] and "路由：轻量检索" in final[TRACE]
    # the input box was cleared; the turn is stored on the server under the conversation the browser keeps
    assert outputs[0][QUESTION_BOX] == ""
    conv = engine.get_conversation(final[LAST_CONV], None)
    t = conv["turns"][-1]
    assert t["question"] == QUESTION and t["answer"].startswith(ev.EXTRACTIVE_LABEL) and t["sources"] and t["trace"]
    assert isinstance(t["elapsed_ms"], int)
    assert final[LAST_CONV] in str(final[HISTORY_LIST])  # the 历史 list shows it, selected


@pytest.mark.slow
def test_follow_up_in_the_same_conversation(client, engine):
    _, first = run_ask(client, QUESTION)
    _, second = run_ask(client, "那服务时间呢？", new=False)
    assert second[LAST_CONV] == first[LAST_CONV]
    assert "检索问题：" in second[TRACE] and "服务时间" in second[TRACE]
    chat = second[CHAT]
    assert [m["role"] for m in chat] == ["user", "assistant"] * 2
    assert "9 点到 21 点" in plain(assistant_text(chat))
    # only the active (last) answer links its citations; the earlier one shows them as text
    first_answer = chat[1]["content"] if isinstance(chat[1]["content"], str) else chat[1]["content"][0]["text"]
    assert "kb-cite-off" in first_answer and 'class="kb-cite"' not in first_answer
    assert [q for q, _ in [(t["question"], 0) for t in engine.get_conversation(first[LAST_CONV], None)["turns"]]] \
        == [QUESTION, "那服务时间呢？"]


@pytest.mark.slow
def test_no_answer_shows_fixed_refusal(client, engine):
    _, final = run_ask(client, OFF_TOPIC)
    text = plain(assistant_text(final[CHAT]))
    assert ev.NO_ANSWER_TEXT in text
    assert "知识库" in final[SOURCES] and 'data-count="0"' in final[SOURCES]
    assert engine.get_conversation(final[LAST_CONV], None)["turns"][-1]["no_answer"] is True


@pytest.mark.slow
def test_chitchat_and_knowledge_switch(client, engine):
    calls = engine.retrieval_calls
    _, final = run_ask(client, "你好！")
    assert "知识库问答助手" in plain(assistant_text(final[CHAT])) and "未检索知识库" in assistant_text(final[CHAT])
    assert "没有检索知识库" in final[SOURCES] and 'data-route="DIRECT"' in final[TRACE]
    _, final = run_ask(client, QUESTION, use_kb=False)
    assert "知识库检索" in plain(assistant_text(final[CHAT])) and "未使用知识库" in final[STAGE]
    assert engine.retrieval_calls == calls
    # the turn shown again says what it said live
    assert "未使用知识库" in client.predict(0, api_name="/select_turn")[V_STAGE]


@pytest.mark.slow
def test_retry_reuses_the_same_retrieval(client, engine):
    _, first = run_ask(client, QUESTION)
    calls = engine.retrieval_calls
    job = client.submit(True, api_name="/retry")
    final = job.result(timeout=180)
    assert engine.retrieval_calls == calls, "retry must regenerate from the cached retrieval"
    assert plain(assistant_text(final[CHAT])).endswith(plain(assistant_text(first[CHAT])).split("\n", 1)[1])
    assert len(engine.get_conversation(first[LAST_CONV], None)["turns"]) == 2


@pytest.mark.slow
def test_validation_error_is_shown_in_the_bubble(client):
    _, final = run_ask(client, "问" * 2500)
    text = plain(assistant_text(final[CHAT]))
    assert "回答失败" in text and "过长" in text
    assert "1001" in final[STAGE]


@pytest.mark.slow
def test_history_open_select_rename_export_delete_clear(client, engine):
    _, first = run_ask(client, QUESTION)
    _, second = run_ask(client, "那服务时间呢？", new=False)
    cid = second[LAST_CONV]
    client.predict(api_name="/new_conversation")
    listed = client.predict(api_name="/history_list")
    assert cid in str(listed)
    view = client.predict(cid, api_name="/history_open")
    assert [m["role"] for m in view[V_CHAT]] == ["user", "assistant"] * 2
    assert plain(assistant_text(view[V_CHAT])) == plain(assistant_text(second[CHAT]))
    assert view[V_SOURCES] == second[SOURCES] and view[V_TRACE] == second[TRACE]
    assert "历史对话" in view[V_STAGE] and view[V_LAST_CONV] == cid
    turn1 = client.predict(0, api_name="/select_turn")
    assert turn1[V_SOURCES] == first[SOURCES] and turn1[V_TRACE] == first[TRACE]
    assert 'href="#kb-src-1"' in str(turn1[V_CHAT][1]) and "kb-cite-off" in str(turn1[V_CHAT][3])
    listed, box = client.predict(cid, "客服电话与时间", api_name="/history_rename")
    assert "客服电话与时间" in str(listed) and box == ""
    path = client.predict(cid, api_name="/history_export")
    md = Path(path["value"] if isinstance(path, dict) else path).read_text(encoding="utf-8")
    assert md.startswith("# 客服电话与时间") and "**问：** 那服务时间呢？" in md and "检索问题：" in md
    n_before = engine.list_conversations(None, 1, 1)["total"]
    client.predict(cid, api_name="/history_delete")
    assert engine.list_conversations(None, 1, 1)["total"] == n_before - 1
    msg = client.predict(api_name="/history_clear_ask")
    assert str(n_before - 1) in str(msg)
    client.predict(api_name="/history_clear_confirm")
    assert engine.list_conversations(None, 1, 1)["total"] == 0


@pytest.mark.slow
def test_reload_restores_the_open_conversation(client, engine):
    _, final = run_ask(client, QUESTION)
    cid = final[LAST_CONV]
    view = client.predict(cid, api_name="/restore_conversation")  # the page load, with the browser's stored id
    assert plain(assistant_text(view[V_CHAT])) == plain(assistant_text(final[CHAT]))
    gone = client.predict("c" * 32, api_name="/restore_conversation")
    assert gone[V_LAST_CONV] == ""  # an id the server does not know is dropped, nothing opens


@pytest.mark.slow
def test_header_badge(client, engine):
    html = client.predict(api_name="/header_badge")
    assert f"知识库: {engine.health()['chunks']} 块" in html
    assert "multilingual-e5-small" in html
    assert "原文摘录" in html or "大模型" in html


@pytest.mark.slow
def test_logged_in_user_can_ask_and_history_is_per_user(engine):
    policy = AccessPolicy.from_args(["alice:pw-a", "bob:pw-b"], admins=["alice"])
    ui = LiveUI(engine, policy)
    try:
        alice = ui.client(auth=("alice", "pw-a"))
        alice_q = "星河电子公司成立于哪一年？"
        _, a_final = run_ask(alice, alice_q)
        a_cid = a_final[LAST_CONV]
        assert engine.get_conversation(a_cid, "alice")["user"] == "alice"
        bob = ui.client(auth=("bob", "pw-b"))
        _, b_final = run_ask(bob, QUESTION)
        assert a_cid not in str(b_final[HISTORY_LIST])  # bob's list shows only his conversations
        # bob cannot open alice's conversation, neither from the list nor as a stored id
        try:
            out = bob.predict(a_cid, api_name="/history_open")
        except Exception as exc:  # refused by the list's own choices check
            out = str(exc)
        assert alice_q not in str(out)
        restored = bob.predict(a_cid, api_name="/restore_conversation")
        assert restored[V_LAST_CONV] == "" and engine.get_conversation(a_cid, "alice")["turn_count"] == 1
    finally:
        ui.stop()


# ---------------------------------------------------------------------------------------------- pure helpers
def test_history_helpers():
    from ui import history as h

    turns = [h.turn_record("q1 <b>", "答[1]", [{"no": 1}], {}, {"turn_id": 1, "elapsed_ms": 5}),
             h.turn_record("你好", "你好！", [], {}, {"turn_id": 2, "route": "DIRECT"})]
    msgs = h.messages(turns, 0)
    assert msgs[0]["content"] == "q1 &lt;b&gt;" and 'href="#kb-src-1"' in msgs[1]["content"]
    assert "未检索知识库" in msgs[3]["content"]
    assert "kb-cite-off" in h.messages(turns, 1)[1]["content"]
    assert h.turn_choices(turns) == [("第 1 轮 · q1 <b>", 0), ("第 2 轮 · 💬 你好", 1)]
    c = {"conv_id": "x", "title": "标题", "updated_at": "2026-01-02 03:04:05.6", "turn_count": 3}
    assert h.conversation_choices([c]) == [("2026-01-02 03:04 · 标题 （3 轮）", "x")]
    assert h.storage_key("a") != h.storage_key("b") and h.storage_secret("a") == h.storage_secret("a")


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


def test_trace_says_how_much_of_the_question_the_keyword_route_saw():
    from ui.render import fusion_title

    part = fusion_title({"mode": "convex", "bm25_weight": 0.081, "features": {"visible": 0.234, "cos1": 0.9}})
    assert "BM25 占比 0.08" in part and "问题用词在库中出现 23%" in part
    whole = fusion_title({"mode": "convex", "bm25_weight": 0.35, "features": {"visible": 1.0}})
    assert "BM25 占比 0.35" in whole and "库中出现" not in whole
    assert "库中出现" not in fusion_title({"mode": "rrf", "bm25_weight": 1.0, "features": {"visible": 0.5}})
    assert "库中出现" not in fusion_title({"mode": "convex", "bm25_weight": 0.3, "features": {}})  # an older trace


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


@pytest.mark.slow
def test_restricted_tabs_start_hidden_with_logins(engine):
    """With --auth, 知识库/配置 are not rendered until the load event shows them to kb-admins/admins."""
    from ui import build_ui

    def tab_visibility(demo):
        return {b.elem_id: b.visible for b in demo.blocks.values() if getattr(b, "elem_id", None) in
                ("tab-qa", "tab-kb", "tab-config", "tab-feedback")}

    assert tab_visibility(build_ui(engine)) == {"tab-qa": True, "tab-kb": True, "tab-config": True,
                                                "tab-feedback": True}
    policy = AccessPolicy.from_args(["alice:a", "bob:b"], admins=["alice"])
    assert tab_visibility(build_ui(engine, policy)) == {"tab-qa": True, "tab-kb": False, "tab-config": False,
                                                        "tab-feedback": False}


def test_the_note_under_an_answer_says_who_refused():
    from ui.chat_tab import done_note

    assert done_note("DIRECT", None) == "未使用知识库"
    assert done_note("LIGHT", {"by": "llm", "reason": ev.LLM_INSUFFICIENT_REASON}) == "大模型判定资料不足"
    assert done_note("LIGHT", {"by": "extractive", "reason": "资料中未找到所问的具体数字"}) == "原文中未找到答案"
    assert done_note("STRONG", None) is None
