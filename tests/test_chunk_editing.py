"""Chunks as first-class objects (issue 28 item 1) on real components: real SQLite, embedded Chroma, jieba BM25,
the tiny random embedding model, the real app over HTTP on 127.0.0.1, and (slow) two engines on one real
PostgreSQL + Chroma server as two team-mode processes.

What the vector route finds is told by exact matches: the tiny model is random, but a query that is a chunk's
indexed text has cosine 1.0 with that chunk's stored vector, and below that with a vector of any other text.
The tests of the module engine run in file order, each on what the one before left (an edit, then its restore, a
manual chunk, then a rebuild that must keep all of it); every one ends with a clean consistency audit.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text as sql_text

from pipeline.access.policy import AccessPolicy
from pipeline.errors import CODE_VALIDATION, EngineError
from pipeline.services.audit_log import Actor
from store.config_store import ConfigStore
from store.db import Database
from tests.live import LiveApp
from tests.servers import fresh_deployment
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle
from tests.waiting import wait_until

PARAS = ["青柠檬汽水的配方：取新鲜青柠檬三个，挤汁后加入苏打水和冰块，搅拌均匀即可饮用。",
         "蓝莓果酱的保存方法：开封后的蓝莓果酱必须冷藏，并在两周内吃完，取用时用干净勺子。",
         "银杏叶标本的制作：把银杏叶夹在旧书里压平一周，然后贴在卡纸上，写上采集日期。",
         "自行车链条的保养：每骑行三百公里清洗一次链条，擦干后滴上专用链条油再擦掉余油。"]
NEW = "猕猴桃罐头的保存方法：开封后的猕猴桃罐头要倒进玻璃碗冷藏，三天之内吃完。"
MANUAL = "火星基地的氧气循环：温室里的藻类白天产生氧气，夜间由电解水系统补足。"
SETTINGS = {"chunk_size": 50, "chunk_overlap": 0}
EXACT = 0.999


def write_doc(path: Path, paras=PARAS) -> Path:
    path.write_text("\n\n".join(paras), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny):
    tmp = tmp_path_factory.mktemp("chunks")
    e = tiny_engine(tmp / "data", tiny, **SETTINGS)
    assert all(r.ok for r in e.upload([("手册.txt", write_doc(tmp / "手册.txt"))]))
    wait_idle(e)
    yield e
    e.close()


def the_doc(engine) -> dict:
    return next(d for d in engine.list_documents()["items"] if d["file_name"] == "手册.txt")


def chunk_with(engine, word: str, doc_id: int | None = None) -> dict:
    chunks = engine.list_chunks(doc_id or the_doc(engine)["doc_id"])["chunks"]
    return next(c for c in chunks if word in c["text"])


def bm25_ids(engine, query: str) -> list[int]:
    return [h["chunk_id"] for h in engine.search(query, 10)["bm25"]]


def vector_sim(engine, query: str, chunk_id: int) -> float:
    """The vector route's similarity of `chunk_id` for the query (0 when the route does not return it)."""
    hits = engine.search(query, 10)["vector"]
    return next((h["similarity"] for h in hits if h["chunk_id"] == chunk_id), 0.0)


def all_ids(found: dict) -> set[int]:
    return {h["chunk_id"] for group in ("bm25", "vector", "fused") for h in found[group]}


def clean(engine) -> dict:
    report = engine.audit()
    assert report["problems"] == 0, report
    return report


def test_edit_is_found_by_both_routes_and_the_old_words_are_not(engine):
    blue = chunk_with(engine, "蓝莓果酱")
    assert blue["enabled"] and not blue["edited"] and blue["length"] == len(blue["text"])
    assert blue["chunk_id"] in bm25_ids(engine, "蓝莓果酱")
    assert vector_sim(engine, blue["text"], blue["chunk_id"]) >= EXACT
    assert blue["chunk_id"] not in bm25_ids(engine, "猕猴桃罐头")

    edited = engine.edit_chunk(blue["chunk_id"], NEW, actor=Actor("alice", "page"))

    assert edited["text"] == NEW and edited["edited"] and edited["original_text"] == blue["text"]
    assert edited["edited_by"] == "alice" and edited["edited_at"]
    assert blue["chunk_id"] in bm25_ids(engine, "猕猴桃罐头")
    assert blue["chunk_id"] not in bm25_ids(engine, "蓝莓果酱")
    assert vector_sim(engine, NEW, blue["chunk_id"]) >= EXACT
    assert vector_sim(engine, blue["text"], blue["chunk_id"]) < EXACT  # the old vector is gone
    sources = engine.ask_sync("猕猴桃罐头怎么保存？")["sources"]
    assert any(s["chunk_id"] == blue["chunk_id"] and s["text"] == NEW for s in sources)
    log = engine.audit_log(kind="admin")["items"]
    assert any(r["action"] == "chunk.edit" and r["actor"] == "alice" for r in log)
    clean(engine)  # stored tokens, vector text and BM25 all agree with the edited text


def test_a_second_edit_keeps_the_parsed_original_and_restore_brings_it_back(engine):
    chunk = chunk_with(engine, "猕猴桃罐头")
    original = chunk["original_text"]
    again = engine.edit_chunk(chunk["chunk_id"], NEW + "另有说明。", actor=Actor("bob"))
    assert again["original_text"] == original and again["edited_by"] == "bob"

    back = engine.edit_chunk(chunk["chunk_id"], original)  # typed back to the parse: not an edit any more
    assert back["text"] == original and not back["edited"]
    engine.edit_chunk(chunk["chunk_id"], NEW)

    restored = engine.restore_chunk(chunk["chunk_id"], actor=Actor("bob"))

    assert restored["text"] == original and not restored["edited"] and restored["edited_by"] is None
    assert chunk["chunk_id"] in bm25_ids(engine, "蓝莓果酱")
    assert chunk["chunk_id"] not in bm25_ids(engine, "猕猴桃罐头")
    assert vector_sim(engine, original, chunk["chunk_id"]) >= EXACT
    with pytest.raises(EngineError) as err:
        engine.restore_chunk(chunk["chunk_id"])  # nothing left to restore
    assert err.value.code == CODE_VALIDATION
    assert any(r["action"] == "chunk.restore" for r in engine.audit_log(kind="admin")["items"])
    clean(engine)


def test_a_disabled_chunk_is_never_searched_answered_or_cited_and_comes_back_when_enabled(engine):
    leaf = chunk_with(engine, "银杏叶")
    question = "银杏叶标本怎么制作？"
    assert leaf["chunk_id"] in all_ids(engine.search(question, 10))

    off = engine.set_chunk_enabled(leaf["chunk_id"], False, actor=Actor("alice"))

    assert off["enabled"] is False
    for query in (question, "银杏叶", leaf["text"]):
        assert leaf["chunk_id"] not in all_ids(engine.search(query, 10)), query
    answer = engine.ask_sync(question)
    assert leaf["chunk_id"] not in {s["chunk_id"] for s in answer["sources"]}
    assert "银杏叶夹在旧书里" not in answer["answer"]
    assert leaf["chunk_id"] not in {int(n.node.node_id) for n in engine.retrieve(question).final}
    vectors = engine.components.kbs.default.vectors
    assert leaf["chunk_id"] not in vectors.all_ids()
    report = clean(engine)  # out of both indexes on purpose: not drift
    assert report["counts"]["disabled_chunks"] == 1
    engine.repair()
    assert leaf["chunk_id"] not in vectors.all_ids()  # repair does not re-add it
    assert leaf["chunk_id"] not in engine.components.bm25.indexed_ids()
    listed = engine.list_chunks(the_doc(engine)["doc_id"])
    assert listed["enabled"] == listed["total"] - 1

    on = engine.set_chunk_enabled(leaf["chunk_id"], True, actor=Actor("alice"))

    assert on["enabled"] is True
    assert leaf["chunk_id"] in bm25_ids(engine, "银杏叶")
    assert vector_sim(engine, leaf["text"], leaf["chunk_id"]) >= EXACT
    assert leaf["chunk_id"] in {s["chunk_id"] for s in engine.ask_sync(question)["sources"]}
    actions = [r["action"] for r in engine.audit_log(kind="admin")["items"]]
    assert "chunk.disable" in actions and "chunk.enable" in actions
    clean(engine)


def test_the_flag_alone_hides_a_chunk_from_both_routes(engine):
    """What another process sees the moment a chunk is switched off, before its BM25 follows: the flag in the
    shared database (here flipped behind this process's back — its BM25 and the vector still hold the chunk)."""
    leaf = chunk_with(engine, "银杏叶")
    assert leaf["chunk_id"] in bm25_ids(engine, "银杏叶")
    with engine.components.db.transaction() as conn:
        conn.execute(sql_text("UPDATE kb_chunk SET enabled = 0 WHERE chunk_id = :c"), {"c": leaf["chunk_id"]})
    assert leaf["chunk_id"] in engine.components.bm25.indexed_ids()
    assert leaf["chunk_id"] not in all_ids(engine.search("银杏叶", 10))
    assert leaf["chunk_id"] not in all_ids(engine.search(leaf["text"], 10))
    assert leaf["chunk_id"] not in {s["chunk_id"] for s in engine.ask_sync("银杏叶标本怎么制作？")["sources"]}
    found = {f["check"]: f for f in engine.audit()["findings"]}
    assert [i["chunk_id"] for i in found["disabled_vectors"]["items"]] == [leaf["chunk_id"]]
    engine.repair()
    assert leaf["chunk_id"] not in engine.components.kbs.default.vectors.all_ids()
    engine.set_chunk_enabled(leaf["chunk_id"], True)
    assert vector_sim(engine, leaf["text"], leaf["chunk_id"]) >= EXACT
    clean(engine)


def test_a_manual_chunk_is_searchable_on_both_routes(engine):
    doc = the_doc(engine)
    added = engine.add_chunk(doc["doc_id"], MANUAL, "附录 › 火星", actor=Actor("alice"))

    assert added["manual"] and added["context"] == "附录 › 火星" and added["edited_by"] == "alice"
    assert added["chunk_index"] == max(c["chunk_index"] for c in engine.list_chunks(doc["doc_id"])["chunks"])
    assert added["chunk_id"] in bm25_ids(engine, "火星基地")
    assert added["chunk_id"] in bm25_ids(engine, "附录")  # the context is indexed with the text, as at ingest
    assert vector_sim(engine, "附录 › 火星\n" + MANUAL, added["chunk_id"]) >= EXACT
    assert engine.get_document(doc["doc_id"])["chunk_count"] == doc["chunk_count"] + 1
    assert any(r["action"] == "chunk.add" for r in engine.audit_log(kind="admin")["items"])
    with pytest.raises(EngineError):
        engine.add_chunk(doc["doc_id"], "   ")
    clean(engine)


def test_edits_survive_a_full_rebuild_and_a_new_version_starts_from_its_own_parse(engine, tmp_path):
    doc = the_doc(engine)
    chain = chunk_with(engine, "自行车链条")
    leaf = chunk_with(engine, "银杏叶")
    engine.edit_chunk(chain["chunk_id"], "电动滑板车的电池保养：每月充满一次电，冬天放在室内。")
    engine.set_chunk_enabled(leaf["chunk_id"], False)
    before = engine.list_chunks(doc["doc_id"])["chunks"]

    status = engine.rebuild(120)

    assert status["error"] is None and status["done"] >= 1
    after = engine.list_chunks(doc["doc_id"])["chunks"]
    assert after == before  # same rows: texts, edits, flags, manual chunk, ids
    assert chain["chunk_id"] in bm25_ids(engine, "电动滑板车")
    assert chain["chunk_id"] not in bm25_ids(engine, "自行车链条")
    assert leaf["chunk_id"] not in all_ids(engine.search("银杏叶", 10))
    assert any(c["manual"] and c["chunk_id"] in bm25_ids(engine, "火星基地") for c in after)
    clean(engine)

    # a new version of the document: its own parse, none of the edits
    res = engine.upload([("手册.txt", write_doc(tmp_path / "手册.txt", [*PARAS, "新增一段：茉莉花茶要用八十度的水冲泡。"]))])
    assert res[0].ok and res[0].version == 2
    wait_idle(engine)
    v2 = engine.list_chunks(res[0].doc_id)
    assert v2["version"] == 2 and "新版本" in v2["note"]
    assert not any(c["edited"] or c["manual"] or not c["enabled"] for c in v2["chunks"])
    assert any("自行车链条" in c["text"] for c in v2["chunks"])
    assert bm25_ids(engine, "自行车链条")  # the parse of v2 is searchable, v1's edit is not
    assert chain["chunk_id"] not in bm25_ids(engine, "电动滑板车")
    clean(engine)


def test_rest_readers_list_kb_admins_edit(engine, tmp_path):
    policy = AccessPolicy(users={"a": "x", "u": "y"}, admins={"a"}, kb_admins={"a"})
    live = LiveApp(engine, policy)
    try:
        doc = the_doc(engine)
        with live.http(auth=("u", "y")) as reader, live.http(auth=("a", "x")) as admin:
            listed = reader.get("/api/kb/chunks", params={"doc_id": doc["doc_id"]}).json()
            assert listed["code"] == 0 and listed["data"]["total"] == len(listed["data"]["chunks"]) > 0
            target = next(c for c in listed["data"]["chunks"] if "青柠檬" in c["text"])
            cid = target["chunk_id"]
            assert reader.get(f"/api/kb/chunks/{cid}").json()["data"]["text"] == target["text"]

            refused = [reader.put(f"/api/kb/chunks/{cid}", json={"text": "读者改的"}),
                       reader.put(f"/api/kb/chunks/{cid}/enabled", json={"enabled": False}),
                       reader.post(f"/api/kb/chunks/{cid}/restore"),
                       reader.post("/api/kb/chunks", json={"doc_id": doc["doc_id"], "text": "读者加的"})]
            assert [(r.status_code, r.json()["code"]) for r in refused] == [(403, 4003)] * 4
            assert engine.get_chunk(cid)["text"] == target["text"]

            r = admin.put(f"/api/kb/chunks/{cid}", json={"text": "柚子茶的做法：柚子皮切丝加冰糖熬煮。"})
            assert r.status_code == 200 and r.json()["data"]["edited_by"] == "a"
            assert cid in bm25_ids(engine, "柚子茶")
            assert admin.post(f"/api/kb/chunks/{cid}/restore").json()["data"]["text"] == target["text"]
            off = admin.put(f"/api/kb/chunks/{cid}/enabled", json={"enabled": False}).json()["data"]
            assert off["enabled"] is False and cid not in all_ids(engine.search("青柠檬汽水", 10))
            assert admin.put(f"/api/kb/chunks/{cid}/enabled", json={"enabled": True}).json()["data"]["enabled"]
            made = admin.post("/api/kb/chunks", json={"doc_id": doc["doc_id"], "text": "手工块：乌龙茶的冲泡。"})
            assert made.json()["data"]["manual"] is True
            assert admin.put(f"/api/kb/chunks/{cid}", json={"text": ""}).json()["code"] == 1001
            assert admin.get("/api/kb/chunks/999999").json()["code"] == 3002

            # a KB-admin key bound to another knowledge base reaches nothing here; bound to this one, it edits
            other = engine.create_kb("别的库")
            elsewhere = engine.create_api_key("别处", "kb-admin", [other["kb_id"]])["secret"]
            here = engine.create_api_key("此处", "kb-admin", [doc["kb_id"]])["secret"]
            denied = reader.put(f"/api/kb/chunks/{cid}", json={"text": "别处的钥匙改的"}, auth=None,
                                headers={"Authorization": f"Bearer {elsewhere}"})
            assert (denied.status_code, denied.json()["code"]) == (403, 4003)
            assert reader.get("/api/kb/chunks", params={"doc_id": doc["doc_id"]}, auth=None,
                              headers={"Authorization": f"Bearer {elsewhere}"}).json()["code"] == 4003
            fine = reader.put(f"/api/kb/chunks/{cid}", json={"text": "此处的钥匙改的：柚子茶。"}, auth=None,
                              headers={"Authorization": f"Bearer {here}"}).json()
            assert fine["code"] == 0 and fine["data"]["edited_by"] == "key:此处"
            admin.post(f"/api/kb/chunks/{cid}/restore")
        rest = [r for r in engine.audit_log(door="rest")["items"] if r["action"].startswith("chunk.")]
        assert [r["actor"] for r in rest].count("a") == 6 and {r["actor"] for r in rest} == {"a", "key:此处"}
    finally:
        live.stop(close_engine=False)


@pytest.mark.slow  # a PostgreSQL and a Chroma server, two engines
def test_team_mode_the_other_process_sees_edits_and_disables(pg_server, chroma_server, tmp_path, tiny):
    from pipeline.engine import Engine

    dep = fresh_deployment(pg_server, chroma_server, tmp_path / "files")
    db = Database(dep.database_url)  # settings live in the shared database
    ConfigStore(db).save({"embedding_model_path": str(tiny), "min_similarity": 0.0, **SETTINGS})
    db.close()
    a = Engine(tmp_path / "A", deployment=dep)
    b = Engine(tmp_path / "B", deployment=dep)
    try:
        assert a.upload([("手册.txt", write_doc(tmp_path / "手册.txt"))])[0].ok
        wait_idle(a)
        blue = chunk_with(b, "蓝莓果酱")
        assert wait_until(lambda: blue["chunk_id"] in bm25_ids(b, "蓝莓果酱"), 30, 0.2, "B to index the document")

        a.edit_chunk(blue["chunk_id"], NEW)
        wait_until(lambda: blue["chunk_id"] in bm25_ids(b, "猕猴桃罐头"), 30, 0.2, "B's BM25 to hold the edit")
        assert blue["chunk_id"] not in bm25_ids(b, "蓝莓果酱")
        assert vector_sim(b, NEW, blue["chunk_id"]) >= EXACT
        assert vector_sim(b, blue["text"], blue["chunk_id"]) < EXACT

        leaf = chunk_with(b, "银杏叶")
        assert leaf["chunk_id"] in all_ids(b.search("银杏叶", 10))
        a.set_chunk_enabled(leaf["chunk_id"], False)
        assert leaf["chunk_id"] not in all_ids(b.search("银杏叶", 10))  # at once: B reads the flag per question
        assert leaf["chunk_id"] not in {s["chunk_id"] for s in b.ask_sync("银杏叶标本怎么制作？")["sources"]}
        a.set_chunk_enabled(leaf["chunk_id"], True)
        wait_until(lambda: leaf["chunk_id"] in bm25_ids(b, "银杏叶"), 30, 0.2, "B's BM25 to hold it again")
        assert vector_sim(b, leaf["text"], leaf["chunk_id"]) >= EXACT
    finally:
        b.close()
        a.close()


def test_page_editor_edits_disables_and_adds_through_gradio(engine):
    live = LiveApp(engine)
    try:
        client = live.client()
        doc = the_doc(engine)
        title, body = client.predict(doc_id=doc["doc_id"], api_name="/kb_chunks")
        target = chunk_with(engine, "自行车链条", doc["doc_id"])
        cid = target["chunk_id"]
        assert f'data-chunk="{cid}"' in body and f"{target['length']} 字" in body

        view, picked, text, info, msg = client.predict(doc["doc_id"], cid, "山地车刹车的调整：先松开刹车线再对准刹车片。",
                                                       api_name="/kb_chunk_edit")
        assert msg.startswith("✓") and "已修改" in view and "山地车刹车" in text and "可恢复原文" in info
        assert cid in bm25_ids(engine, "山地车")
        view, *_, msg = client.predict(doc["doc_id"], cid, api_name="/kb_chunk_disable")
        assert msg.startswith("✓") and "已停用" in view and cid not in all_ids(engine.search("山地车", 10))
        view, *_, msg = client.predict(doc["doc_id"], cid, api_name="/kb_chunk_enable")
        assert msg.startswith("✓") and cid in bm25_ids(engine, "山地车")
        view, picked, text, info, msg = client.predict(doc["doc_id"], cid, api_name="/kb_chunk_restore")
        assert msg.startswith("✓") and text == target["text"] and cid in bm25_ids(engine, "自行车链条")
        *_, msg, cleared = client.predict(doc["doc_id"], "页面添加：普洱茶要先洗茶再冲泡。", "", api_name="/kb_chunk_add")
        assert msg.startswith("✓") and cleared == "" and bm25_ids(engine, "普洱茶")
        *_, msg = client.predict(doc["doc_id"], cid, "  ", api_name="/kb_chunk_edit")
        assert msg.startswith("⚠️") and "不能为空" in msg
        actions = [r["action"] for r in engine.audit_log(door="page")["items"]]
        assert {"chunk.edit", "chunk.disable", "chunk.enable", "chunk.restore", "chunk.add"} <= set(actions)
    finally:
        live.stop(close_engine=False)


def test_reparse_discards_every_edit_of_the_document(engine):
    doc = the_doc(engine)
    chunk = chunk_with(engine, "青柠檬", doc["doc_id"])
    engine.edit_chunk(chunk["chunk_id"], "乌梅汤的做法：乌梅山楂加冰糖慢炖。")
    assert any(c["edited"] for c in engine.list_chunks(doc["doc_id"])["chunks"])

    assert engine.reparse_document(doc["doc_id"], actor=Actor("alice"))["status"] == "processing"
    wait_idle(engine)

    chunks = engine.list_chunks(doc["doc_id"])["chunks"]
    assert engine.get_document(doc["doc_id"])["status"] == "ready"
    assert chunks and not any(c["edited"] or c["manual"] or not c["enabled"] for c in chunks)
    assert not bm25_ids(engine, "乌梅汤") and bm25_ids(engine, "青柠檬")
    assert not engine.search("普洱茶", 10)["bm25"]  # the hand-made chunk went with the edits
    assert any(r["action"] == "chunk.reparse" for r in engine.audit_log(kind="admin")["items"])
    clean(engine)


def test_a_verified_entry_is_not_edited_here(engine):
    entry = engine.create_verified("年假怎么申请？", "在人事系统提交年假申请，主管审批后生效。", "alice")
    wait_idle(engine)
    doc_id = next(v["doc_id"] for v in engine.list_verified() if v["qa_id"] == entry["qa_id"])
    chunk = engine.list_chunks(doc_id)["chunks"][0]
    for change in (lambda: engine.edit_chunk(chunk["chunk_id"], "改过的答案"),
                   lambda: engine.set_chunk_enabled(chunk["chunk_id"], False),
                   lambda: engine.add_chunk(doc_id, "多出来的块")):
        with pytest.raises(EngineError) as err:
            change()
        assert err.value.code == CODE_VALIDATION and "已核实问答" in err.value.msg
    assert engine.get_chunk(chunk["chunk_id"])["enabled"]
