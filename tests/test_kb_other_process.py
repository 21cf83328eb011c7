"""Knowledge-base changes made by another app process reach this one on its next request (the shared counters,
pipeline/shared_sync.py): two Engines over the same data dir, as two processes on one machine would run."""
from __future__ import annotations

import pytest

from pipeline.access.policy import Reader
from pipeline.engine import Engine
from pipeline.errors import CODE_FORBIDDEN, CODE_NO_DOC, EngineError

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

TEXT = "星河路由器使用手册：长按背面的复位键十秒，指示灯闪烁后路由器恢复出厂设置。"
QUESTION = "路由器怎么恢复出厂设置？"


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    data = tmp_path_factory.mktemp("two") / "data"
    a = Engine(data)
    b = Engine(data)  # the second process (its data-dir lock refusal is only logged)
    yield a, b
    b.close()
    a.close()


def _ask_error(engine, question, kb_ids, reader=None):
    events = list(engine.ask(question, kb_ids=kb_ids, reader=reader))
    return events[-1].data if events[-1].type.value == "error" else None


def test_delete_rename_and_readers_reach_the_other_engine(engines, tmp_path):
    a, b = engines
    kb = a.create_kb("手册")
    src = tmp_path / "路由器手册.txt"
    src.write_text(TEXT, encoding="utf-8")
    a.upload([(src.name, src)], kb["kb_id"])
    assert a.wait_idle(300)
    # b opens the knowledge base (its handle, its retrieval index) and finds the document
    hits = b.search(QUESTION, 5, [kb["kb_id"]])
    assert hits["vector"] and b.ask_sync(QUESTION, kb_ids=[kb["kb_id"]])["sources"]

    a.update_kb(kb["kb_id"], name="产品手册")
    assert [k["name"] for k in b.list_kbs() if k["kb_id"] == kb["kb_id"]] == ["产品手册"]
    assert {s["kb_name"] for s in b.ask_sync(QUESTION, kb_ids=[kb["kb_id"]])["sources"]} == {"产品手册"}

    a.update_kb(kb["kb_id"], readers=["alice"])
    bob, alice = Reader("bob", privileged=False), Reader("alice", privileged=False)
    assert _ask_error(b, QUESTION, [kb["kb_id"]], bob)["code"] == CODE_FORBIDDEN
    assert b.ask_sync(QUESTION, kb_ids=[kb["kb_id"]], reader=alice)["sources"]

    a.delete_kb(kb["kb_id"])
    with pytest.raises(EngineError) as err:
        b.search(QUESTION, 5, [kb["kb_id"]])
    assert err.value.code == CODE_NO_DOC
    assert _ask_error(b, QUESTION, [kb["kb_id"]])["code"] == CODE_NO_DOC
    with pytest.raises(EngineError) as err:
        b.upload([(src.name, src)], kb["kb_id"])
    assert err.value.code == CODE_NO_DOC
    assert kb["kb_id"] not in [k["kb_id"] for k in b.list_kbs()]
    assert kb["kb_id"] not in b.components.kbs._open  # the handle went with the next request's catch-up
    assert b.ask_sync(QUESTION)["sources"] == []  # the default knowledge base still answers (nothing in it)
