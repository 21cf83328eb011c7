"""Conversations on the server: store + service on real SQLite, and the answer stream recording its turns.

The engine tests run on a real engine (packaged embedding, Chroma, BM25) with one small document and no LLM
(extractive answers); the LLM prompt tests use the scripted OpenAI-compatible server.
"""
from __future__ import annotations

import pytest

from pipeline.conversation.service import ConversationService, conversation_markdown
from pipeline.errors import CODE_FORBIDDEN, CODE_NO_DOC, CODE_VALIDATION, EngineError
from store.conversations import ConversationStore, title_from
from store.db import Database
from tests.shared_data import DATA
from tests.test_ui_chat import KB_NAME, QUESTION, make_engine

# Marked slow: tests on the `engine` fixture — the packaged e5 model (real quality, minutes on 2 cores).


@pytest.fixture
def service(tmp_path):
    db = Database(tmp_path / "app.db")
    yield ConversationService(ConversationStore(db))
    db.close()


def test_record_creates_then_appends_and_lists_newest_first(service):
    a = service.record(None, "alice", "第一个问题是什么？", "答一", rewritten=None, route="LIGHT")
    b = service.record(None, "alice", "另一个对话", "答二")
    service.record(a["conversation_id"], "alice", "那第二个呢？", "答三", rewritten="第二个问题是什么？",
                   sources=[{"no": 1, "doc_name": "x.txt", "text": "片段", "cited": True}], trace={"k": 1})
    listing = service.list("alice")
    assert [c["conv_id"] for c in listing["items"]] == [a["conversation_id"], b["conversation_id"]]
    assert listing["items"][0]["title"] == "第一个问题是什么？" and listing["items"][0]["turn_count"] == 2
    conv = service.get(a["conversation_id"], "alice")
    assert [t["seq"] for t in conv["turns"]] == [1, 2]
    t2 = conv["turns"][1]
    assert t2["rewritten"] == "第二个问题是什么？" and t2["sources"][0]["doc_name"] == "x.txt"
    assert t2["trace"] == {"k": 1}
    assert service.list("bob")["total"] == 0  # per user


def test_unknown_and_foreign_ids_are_refused(service):
    a = service.record(None, "alice", "问题", "答")
    for bad in ("0" * 32, "not-an-id", 42, None):
        with pytest.raises(EngineError) as ei:
            service.get(bad, "alice")
        assert ei.value.code == CODE_NO_DOC and "会话不存在" in ei.value.msg
    with pytest.raises(EngineError) as ei:
        service.get(a["conversation_id"], "bob")
    assert ei.value.code == CODE_FORBIDDEN
    for op in (lambda: service.delete(a["conversation_id"], "bob"),
               lambda: service.rename(a["conversation_id"], "bob", "x")):
        with pytest.raises(EngineError) as ei:
            op()
        assert ei.value.code == CODE_FORBIDDEN
    assert service.get(a["conversation_id"], "alice")["turn_count"] == 1  # untouched


def test_rename_delete_clear(service):
    a = service.record(None, None, "问题一", "答")
    b = service.record(None, None, "问题二", "答")
    other = service.record(None, "carol", "别人的", "答")
    assert service.rename(a["conversation_id"], None, "  新的   标题 ")["title"] == "新的 标题"
    for bad in ("", "   ", "x" * 101):
        with pytest.raises(EngineError) as ei:
            service.rename(a["conversation_id"], None, bad)
        assert ei.value.code == CODE_VALIDATION and ei.value.field == "title"
    assert service.delete(b["conversation_id"], None)["turns_removed"] == 1
    assert [c["conv_id"] for c in service.list(None)["items"]] == [a["conversation_id"]]
    assert service.clear(None) == {"conversations_removed": 1}
    assert service.list(None)["total"] == 0
    assert service.list("carol")["items"][0]["conv_id"] == other["conversation_id"]
    with pytest.raises(EngineError):
        service.list(None, page=0)


def test_title_and_markdown_export():
    assert title_from("  a  b ") == "a b" and title_from("长" * 50).endswith("…")
    md = conversation_markdown({
        "title": "采购合同", "created_at": "2026-01-01 10:00:00.1", "turns": [
            {"seq": 1, "created_at": "2026-01-01 10:00:00.2", "question": "甲方的违约责任？", "rewritten": None,
             "answer": "甲方应偿付违约金[1]。", "sources": [
                 {"no": 1, "doc_name": "合同.docx", "page": None, "text": "甲方违约责任\n第二行", "cited": True},
                 {"no": 2, "doc_name": "其他.txt", "text": "没被引用", "cited": False}]},
            {"seq": 2, "created_at": "2026-01-01 10:01:00", "question": "那乙方呢？",
             "rewritten": "采购合同里乙方的违约责任？", "answer": "乙方……[1]", "sources": [
                 {"no": 1, "doc_name": "合同.docx", "page": 3, "text": "乙方违约责任", "cited": True}]}]})
    assert md.startswith("# 采购合同\n")
    assert "## 第 1 轮" in md and "## 第 2 轮" in md
    assert "**问：** 那乙方呢？" in md and "*检索问题：采购合同里乙方的违约责任？*" in md
    assert "[1] 合同.docx\n\n> 甲方违约责任\n> 第二行" in md
    assert "没被引用" not in md  # only the cited sources of a turn
    assert "[1] 合同.docx · 第3页" in md


# --- the answer stream ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = make_engine(tmp_path_factory.mktemp("conv"))
    yield e
    e.close()


def _events(engine, q, **kw):
    return [(e.type, e.data) for e in engine.ask(q, **kw)]


@pytest.mark.slow
def test_ask_creates_a_conversation_and_follow_up_is_rewritten(engine):
    evs = _events(engine, QUESTION, user="u1")
    done = evs[-1][1]
    assert evs[-1][0] == "done" and len(done["conversation_id"]) == 32 and done["turn_id"] > 0
    assert done["route"] in ("LIGHT", "STRONG") and done["rewritten_query"] is None
    cid = done["conversation_id"]
    evs2 = _events(engine, "那服务时间呢？", user="u1", conversation_id=cid)
    trace = next(d for t, d in evs2 if t == "trace")
    assert trace["query"]["changed"] and "客服电话" in trace["query"]["query"] and "服务时间" in trace["query"]["query"]
    assert trace["route"]["route"] == "STRONG"
    done2 = evs2[-1][1]
    assert done2["conversation_id"] == cid and done2["rewritten_query"] == trace["query"]["query"]
    answer = "".join(d["text"] for t, d in evs2 if t == "delta")
    assert "9 点到 21 点" in answer
    conv = engine.get_conversation(cid, "u1")
    assert [t["question"] for t in conv["turns"]] == [QUESTION, "那服务时间呢？"]
    t2 = conv["turns"][1]
    assert t2["rewritten"] == done2["rewritten_query"] and t2["answer"] == answer and t2["route"] == "STRONG"
    assert t2["sources"] and t2["sources"][0]["doc_name"] == KB_NAME and t2["trace"]["query"]["changed"]
    assert t2["mode"] == "extractive" and t2["elapsed_ms"] is not None


@pytest.mark.slow
def test_ask_with_unknown_or_foreign_conversation_is_an_error_not_a_new_one(engine):
    before = engine.list_conversations("u2")["total"]
    evs = _events(engine, QUESTION, user="u2", conversation_id="f" * 32)
    assert evs == [("error", {"code": CODE_NO_DOC, "msg": "会话不存在：" + "f" * 32})]
    cid = _events(engine, QUESTION, user="u3")[-1][1]["conversation_id"]
    evs = _events(engine, QUESTION, user="u2", conversation_id=cid)
    assert evs[0][0] == "error" and evs[0][1]["code"] == CODE_FORBIDDEN
    assert engine.list_conversations("u2")["total"] == before
    assert engine.get_conversation(cid, "u3")["turn_count"] == 1


@pytest.mark.slow
def test_chitchat_goes_direct_without_retrieval(engine):
    calls = engine.retrieval_calls
    evs = _events(engine, "你好呀！")
    types = [t for t, _ in evs]
    assert "stage" in types and ("stage", {"phase": "recall"}) not in evs
    assert engine.retrieval_calls == calls
    assert next(d for t, d in evs if t == "sources") == {"sources": []}
    done = evs[-1][1]
    assert done["route"] == "DIRECT" and done["mode"] == "fixed"
    assert "知识库问答助手" in "".join(d["text"] for t, d in evs if t == "delta")
    # the knowledge switch off: DIRECT too, and without an LLM the reply says why
    evs = _events(engine, QUESTION, use_kb=False)
    assert evs[-1][1]["route"] == "DIRECT" and engine.retrieval_calls == calls
    assert "知识库检索" in "".join(d["text"] for t, d in evs if t == "delta")


@pytest.mark.slow
def test_follow_up_prompt_carries_history_apart_from_materials(engine, fake_llm):
    from pipeline.generation.llm_client import build_llm
    from pipeline.settings import Settings

    models = engine.components.models
    old_llm, old_rewriter = models.llm, models.rewriter
    try:
        models.llm = build_llm(Settings(llm_api_url=fake_llm.base_url, llm_model="fake-model", llm_api_key="k"))
        models.rewriter = engine.components.rule_rewriter  # the LLM rewrite has its own test (test_rewrite.py)
        fake_llm.reply = "客服电话是 400-800-1234[1]。"
        cid = _events(engine, QUESTION)[-1][1]["conversation_id"]
        fake_llm.reply = "服务时间为每天 9 点到 21 点[1]。"
        fake_llm.reset()
        evs = _events(engine, "那服务时间呢？", conversation_id=cid)
        assert evs[-1][0] == "done", evs[-3:]
        user_msg = fake_llm.chat_requests[-1]["body"]["messages"][-1]["content"]
        h0, h1 = user_msg.index("<history>"), user_msg.index("</history>")
        m0 = user_msg.index("<materials>")
        assert h1 < m0, "history must come before and apart from the materials"
        assert f"用户：{QUESTION}" in user_msg[h0:h1] and "助手：客服电话是 400-800-1234。" in user_msg[h0:h1]
        assert "[1]" not in user_msg[h0:h1]  # old citation numbers would point at the wrong materials
        assert "用户问题：那服务时间呢？" in user_msg
        assert "完整意思是：" in user_msg and "服务时间" in user_msg[user_msg.index("完整意思是："):]
    finally:
        models.llm, models.rewriter = old_llm, old_rewriter


@pytest.mark.slow
def test_direct_with_an_llm_streams_a_short_reply_without_citations(engine, fake_llm):
    from pipeline.conversation.direct import KB_OFF_LABEL
    from pipeline.generation.llm_client import build_llm
    from pipeline.settings import Settings

    models = engine.components.models
    old_llm = models.llm
    try:
        models.llm = build_llm(Settings(llm_api_url=fake_llm.base_url, llm_model="fake-model", llm_api_key="k"))
        fake_llm.reply = "你好！有什么可以帮你[1]？"
        calls = engine.retrieval_calls
        evs = _events(engine, "你好")
        text = "".join(d["text"] for t, d in evs if t == "delta")
        assert text == "你好！有什么可以帮你？"  # no materials: any [n] is removed
        assert evs[-1][1]["route"] == "DIRECT" and evs[-1][1]["mode"] == "llm" and engine.retrieval_calls == calls
        msgs = fake_llm.chat_requests[-1]["body"]["messages"]
        assert msgs[0]["role"] == "system" and "<materials>" not in str(msgs) and msgs[-1]["content"] == "你好"
        fake_llm.reply = "退货一般是 7 天。"
        evs = _events(engine, QUESTION, use_kb=False)
        assert "".join(d["text"] for t, d in evs if t == "delta") == KB_OFF_LABEL + "退货一般是 7 天。"
        assert next(d for t, d in evs if t == "sources") == {"sources": []} and engine.retrieval_calls == calls
    finally:
        models.llm = old_llm


# --- a follow-up searched within the documents the last answer cited ------------------------------------------
REGULATIONS = DATA / "regulations"
REG_FILES = ["禁止传销条例(2005-08-23).md", "婚姻登记条例(2003-08-08).md", "旅行社条例(2020-11-29).md",
             "现金管理暂行条例(2011-01-08).md", "征信业管理条例(2013-01-21).md", "物业管理条例(2018-03-19).md"]


@pytest.fixture(scope="module")
def reg_engine(tmp_path_factory):
    """Six real regulations (../shared/data/regulations, used in place), the packaged e5, no LLM."""
    from pipeline.engine import Engine

    e = Engine(tmp_path_factory.mktemp("reg"), load_async=False)
    res = e.upload([(name, REGULATIONS / name) for name in REG_FILES])
    assert all(r.ok for r in res), res
    assert e.wait_idle(600)
    yield e
    e.close()


@pytest.mark.slow
def test_follow_up_is_searched_within_the_cited_documents(reg_engine):
    e = reg_engine
    first = e.ask_sync("被朋友拉去参加了传销，我只是参加的人，会罚多少？")
    cited = {s["doc_id"] for s in first["sources"] if s["cited"]}
    assert cited and {s["doc_name"] for s in first["sources"] if s["cited"]} == {"禁止传销条例(2005-08-23).md"}
    conv = first["conversation_id"]
    follow = e.ask_sync("那组织的头目呢？", conversation_id=conv)
    trace = follow["trace"]
    assert trace["query"]["kind"] == "marker" and trace["filter"] == {"doc_ids": sorted(cited),
                                                                      "doc_names": ["禁止传销条例(2005-08-23).md"]}
    from ui.render import render_trace
    assert "追问：上一轮回答引用的文档 《禁止传销条例(2005-08-23).md》" in render_trace(trace)
    assert "within_cited_docs" in trace["ms"]
    searched_everywhere = e.ask_sync(trace["query"]["query"])  # what the whole KB gives the rewritten follow-up
    assert not searched_everywhere["sources"] or searched_everywhere["weak"]
    assert {s["doc_id"] for s in follow["sources"]} <= cited
    assert any("组织策划传销的" in s["text"] for s in follow["sources"])  # article 24 on the organisers
    # taken for a follow-up by the rules (no topic word they know) but about something else: none of its own
    # words is in the cited document's passages, so it is searched everywhere as any question, and refused
    other = e.ask_sync("拍照怎么构图好看", conversation_id=conv)
    assert other["trace"]["query"]["kind"] == "no_topic" and not other["trace"].get("filter")
    assert other["sources"] == [] and e.ask_sync("拍照怎么构图好看")["sources"] == []
    # a standalone question in the same conversation is searched everywhere
    alone = e.ask_sync("结婚登记要去哪里办理？", conversation_id=conv)
    assert not alone["trace"].get("filter") and alone["sources"][0]["doc_name"] == "婚姻登记条例(2003-08-08).md"


@pytest.mark.slow
def test_the_setting_off_searches_a_follow_up_everywhere(reg_engine):
    e = reg_engine
    e.update_settings({"follow_up_in_cited_docs": False})
    try:
        first = e.ask_sync("被朋友拉去参加了传销，我只是参加的人，会罚多少？")
        follow = e.ask_sync("那组织的头目呢？", conversation_id=first["conversation_id"])
        assert follow["trace"]["query"]["kind"] == "marker" and not follow["trace"].get("filter")
        assert "within_cited_docs" not in follow["trace"]["ms"]
    finally:
        e.update_settings({"follow_up_in_cited_docs": True})
