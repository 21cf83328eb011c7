"""Feedback and verified Q&A entries on a real engine (SQLite, Chroma, BM25, packaged embedding, no LLM):
validation and ownership, the admin list and JSONL export, an entry indexed on both routes and cited as
「已核实问答」, and its deletion taking it out of retrieval again."""
from __future__ import annotations

import json

import pytest

from pipeline.errors import CODE_FORBIDDEN, CODE_NO_DOC, CODE_VALIDATION, EngineError
from tests.test_ui_chat import QUESTION, make_engine

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

NEW_Q = "星河电子的售后热线是什么？"
NEW_A = "星河电子的售后热线是 400-800-1234，每天 9 点到 21 点有人工服务。"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = make_engine(tmp_path_factory.mktemp("feedback"))
    yield e
    e.close()


def _err(fn):
    with pytest.raises(EngineError) as ei:
        fn()
    return ei.value


def test_feedback_validation_ownership_and_snapshot(engine):
    r = engine.ask_sync(QUESTION, user="ann")
    tid = r["turn_id"]
    fb = engine.give_feedback(tid, "ann", "down", "引用错误", "  第二条来源不对  ")
    assert (fb["rating"], fb["reason"], fb["comment"]) == ("down", "引用错误", "第二条来源不对")
    assert fb["question"] == QUESTION and fb["answer"] == r["answer"] and fb["sources"] == r["sources"]
    again = engine.give_feedback(tid, "ann", "up")  # rating again replaces the earlier one
    assert again["fb_id"] == fb["fb_id"] and again["rating"] == "up" and again["reason"] is None
    assert _err(lambda: engine.give_feedback(tid, "ben", "up")).code == CODE_FORBIDDEN
    assert _err(lambda: engine.give_feedback(999999, "ann", "up")).code == CODE_NO_DOC
    for bad in (dict(rating="meh"), dict(rating="down", reason="太长"), dict(rating="up", reason="不准确"),
                dict(rating="down", reason="其他", comment="x" * 501)):
        assert _err(lambda bad=bad: engine.give_feedback(tid, "ann", **bad)).code == CODE_VALIDATION
    assert _err(lambda: engine.give_feedback("1", "ann", "up")).code == CODE_VALIDATION
    # the admin's view keeps the rated answer after the user deletes the conversation
    engine.delete_conversation(r["conversation_id"], "ann")
    assert engine.get_feedback(fb["fb_id"])["answer"] == r["answer"]


def test_list_filter_and_jsonl_export(engine):
    a = engine.ask_sync(QUESTION)
    b = engine.ask_sync("星河电子公司成立于哪一年？")
    engine.give_feedback(a["turn_id"], None, "down", "没回答", "")
    engine.give_feedback(b["turn_id"], None, "up")
    downs = engine.list_feedback("down")["items"]
    assert downs and all(f["rating"] == "down" for f in downs) and downs[0]["turn_id"] == a["turn_id"]
    assert engine.list_feedback("up")["items"][0]["turn_id"] == b["turn_id"]
    everything = engine.list_feedback()
    assert everything["total"] == len(engine.list_feedback("down")["items"]) + len(engine.list_feedback("up")["items"])
    lines = [json.loads(x) for x in engine.export_feedback("down").splitlines()]
    assert lines and {x["rating"] for x in lines} == {"down"}
    assert {"question", "answer", "sources", "reason", "comment", "user", "created_at"} <= set(lines[0])
    assert _err(lambda: engine.list_feedback("sideways")).code == CODE_VALIDATION


def _route_ids(engine, q):
    found = engine.search(q, 10)
    return {r["chunk_id"] for r in found["bm25"]}, {r["chunk_id"] for r in found["vector"]}


def test_verified_entry_joins_both_routes_is_cited_and_leaves_on_delete(engine):
    r = engine.ask_sync(QUESTION)
    fb = engine.give_feedback(r["turn_id"], None, "up")
    entry = engine.create_verified(NEW_Q, NEW_A, "admin", fb["fb_id"])
    assert entry["cited"] and entry["cited"][0]["chunk_id"] == r["sources"][0]["chunk_id"]
    assert entry["turn_id"] == r["turn_id"]
    assert engine.wait_idle(120)
    listed = engine.list_verified()
    assert listed[0]["qa_id"] == entry["qa_id"] and listed[0]["status"] == "ready"
    chunk_id = engine.document_chunks(entry["doc_id"])[0]["chunk_id"]
    assert len(engine.document_chunks(entry["doc_id"])) == 1  # question + answer: one chunk
    bm25, vector = _route_ids(engine, NEW_Q)
    assert chunk_id in bm25 and chunk_id in vector  # indexed like a small document, both routes

    ans = engine.ask_sync(NEW_Q)
    top = ans["sources"][0]
    assert top["chunk_id"] == chunk_id and top["verified"] is True and top["cited"] is True
    assert top["doc_name"].startswith("已核实问答") and NEW_A + "[1]" in ans["answer"]
    assert "已核实问答" in ans["answer"].splitlines()[0]

    assert _err(lambda: engine.create_verified(NEW_Q, NEW_A, "admin")).code == CODE_VALIDATION  # duplicate
    assert _err(lambda: engine.create_verified(" ", NEW_A, "admin")).code == CODE_VALIDATION
    assert _err(lambda: engine.create_verified(NEW_Q, "", "admin")).code == CODE_VALIDATION
    assert _err(lambda: engine.create_verified("q", "a", "admin", feedback_id=424242)).code == CODE_NO_DOC

    engine.delete_verified(entry["qa_id"])
    bm25, vector = _route_ids(engine, NEW_Q)
    assert chunk_id not in bm25 and chunk_id not in vector
    assert all(not s["verified"] for s in engine.ask_sync(NEW_Q)["sources"])
    assert engine.list_verified() == [] and _err(lambda: engine.delete_verified(entry["qa_id"])).code == CODE_NO_DOC


def test_deleting_the_entry_document_from_the_kb_deletes_the_entry(engine):
    entry = engine.create_verified("星河电子的总部在哪里？", "星河电子总部位于杭州市西湖区。", None)
    assert engine.wait_idle(120)
    engine.delete_document(entry["doc_id"])
    assert all(e["qa_id"] != entry["qa_id"] for e in engine.list_verified())
