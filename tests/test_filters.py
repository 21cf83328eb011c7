"""Tags, metadata and filters that really filter (issue 28 item 2), through the real engine and every door.

The knowledge base is built so that the documents a filter allows rank LOW without it: forty distractors repeat
the question word for word (the best BM25 scores, and the closest vectors with any model: the same tokens), while
the target answers it in one sentence inside a longer text. The unfiltered top-k holds no target chunk on either
route; the filtered search must still find it — on the BM25 route, on the vector route, in the fusion and in the
answer — through the engine, REST (+ SSE), /v1 (the official `openai` SDK, `extra_body`) and MCP.
"""
from __future__ import annotations

import json
from datetime import date

import httpx
import numpy as np
import openai
import pytest
from sqlalchemy import update

from store.schema import kb_document
from tests.live import LiveApp, backgrounds_measured
from tests.mcp_client import over_http
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

Q = "星河公司的退货政策是什么"
ASK = "退货政策是什么"  # what the target answers (it says nothing of 星河公司: the gate rightly refuses Q there)
DISTRACTOR = "星河公司的退货政策是什么？星河公司退货政策：星河公司的退货政策是什么。第{i}号门店。"
FILLER = "书院藏有宋元刻本三百余种，每年春秋两季开放参观，讲堂可容纳八十人，院内古树成荫，" * 3
TARGET = FILLER + "关于退货政策：本院售出的书籍自签收之日起七日内可以退货，须保留票据。"
OTHER = "人事档案管理办法：员工档案由人事处统一保管，调阅须经审批；本办法与退货政策无关。" + FILLER
N_DISTRACTORS = 40
RECALL = 10  # each route's top-k: far fewer than the distractors


def upload_all(engine, items, **kw):
    out = []
    for i in range(0, len(items), 10):  # ten files per upload at most
        out += engine.upload(items[i:i + 10], **kw)
    assert all(r.ok for r in out), [r.to_dict() for r in out if not r.ok]
    return out


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("filters")
    engine = tiny_engine(tmp / "data", tiny_model(tmp_path_factory.getbasetemp() / "tiny-bert"),
                         recall_size=RECALL, rerank_candidates=RECALL)
    items = []
    for i in range(N_DISTRACTORS):
        p = tmp / f"门店{i:02d}.txt"
        p.write_text(DISTRACTOR.format(i=i), encoding="utf-8")
        items.append((p.name, p))
    upload_all(engine, items)
    target_file, other_file = tmp / "书院规定.md", tmp / "人事档案.txt"
    target_file.write_text(TARGET, encoding="utf-8")
    other_file.write_text(OTHER, encoding="utf-8")
    target = engine.upload([(target_file.name, target_file)], tags=["档案", "古籍"],
                           metadata={"dept": "legal", "source": "/srv/share/书院"})[0]
    other = engine.upload([(other_file.name, other_file)], tags="档案", metadata={"dept": "hr"})[0]
    wait_idle(engine)
    backgrounds_measured(engine)  # the gate's full background, as seconds after an ingest (not the quick estimate)
    app = LiveApp(engine)
    app.tmp, app.target, app.other = tmp, target.doc_id, other.doc_id
    yield app
    app.stop(close_engine=True)


def docs_of(rows) -> set[int]:
    return {r["doc_id"] for r in rows}


def search(kb, flt=None, top_k=RECALL):
    return kb.engine.search(Q, top_k, doc_filter=flt)


def test_unfiltered_top_k_holds_no_target_on_either_route(kb):
    """The premise: without a filter the target is outside each route's top-k (filtering afterwards would
    find nothing)."""
    got = search(kb)
    for route in ("bm25", "vector", "fused"):
        assert kb.target not in docs_of(got[route]), route
        assert kb.other not in docs_of(got[route]), route
    assert got["filter"] is None


def test_tags_all_finds_the_low_ranked_target_on_both_routes(kb):
    got = search(kb, {"tags_all": ["档案", "古籍"]})
    assert docs_of(got["bm25"]) == {kb.target}  # BM25 ranked only the allowed chunks
    assert docs_of(got["vector"]) == {kb.target}  # so did the ANN search (Chroma where on doc_id)
    assert docs_of(got["fused"]) == {kb.target}
    assert got["filter"] == {"tags_all": ["古籍", "档案"]}
    assert "filter" in got["ms"]


def test_tags_any_is_a_union_and_all_an_intersection(kb):
    any_ = search(kb, {"tags_any": ["档案"]})
    assert docs_of(any_["bm25"]) == {kb.target, kb.other} == docs_of(any_["vector"])
    assert docs_of(search(kb, {"tags_any": ["古籍", "无此标签"]})["fused"]) == {kb.target}
    assert search(kb, {"tags_all": ["档案", "无此标签"]})["fused"] == []


def test_key_value_on_set_and_on_automatic_metadata(kb):
    assert docs_of(search(kb, {"metadata": {"dept": "hr"}})["fused"]) == {kb.other}
    assert docs_of(search(kb, {"metadata": {"source": "/srv/share/书院"}})["fused"]) == {kb.target}
    assert docs_of(search(kb, {"metadata": {"file_type": "md"}})["fused"]) == {kb.target}  # the document's own
    both = search(kb, {"metadata": {"file_type": "txt"}, "tags_any": ["档案"]})  # parts combine with AND
    assert docs_of(both["fused"]) == {kb.other}
    assert search(kb, {"metadata": {"dept": "legal", "version": 2}})["fused"] == []
    assert docs_of(search(kb, {"metadata": {"dept": "legal", "version": 1}})["fused"]) == {kb.target}


def test_filters_hold_after_the_bm25_index_is_rebuilt(kb):
    """The chunks above sat in the BM25 delta; after a rebuild they are in the snapshot, whose positions map to
    documents through another path (pipeline/retrieval/doc_filter.ChunkDocs)."""
    s = kb.engine.settings
    snap = kb.engine.components.kbs.default.bm25.rebuild(s.bm25_k1, s.bm25_b)
    assert snap.size >= N_DISTRACTORS + 2
    got = search(kb, {"tags_all": ["档案", "古籍"]})
    assert docs_of(got["bm25"]) == {kb.target} == docs_of(got["vector"])
    assert docs_of(search(kb, {"tags_any": ["档案"]})["bm25"]) == {kb.target, kb.other}


def test_upload_date_range(kb):
    db = kb.engine.components.db
    with db.transaction() as conn:  # the target was uploaded last spring (its row says so)
        conn.execute(update(kb_document).where(kb_document.c.doc_id == kb.target)
                     .values(created_at="2025-03-15 10:00:00"))
    try:
        spring = search(kb, {"date_from": "2025-03-01", "date_to": "2025-03-15"})  # date_to is inclusive
        assert docs_of(spring["bm25"]) == {kb.target} == docs_of(spring["vector"])
        assert search(kb, {"date_to": "2025-03-14"})["fused"] == []
        later = search(kb, {"date_from": "2025-03-16"}, top_k=50)
        assert kb.target not in docs_of(later["fused"]) and docs_of(later["fused"])
    finally:
        with db.transaction() as conn:
            conn.execute(update(kb_document).where(kb_document.c.doc_id == kb.target)
                         .values(created_at=kb.engine.get_document(kb.other)["created_at"]))


def test_answer_cites_only_filtered_documents_and_the_trace_shows_the_filter(kb):
    flt = {"tags_all": ["古籍"]}
    res = kb.engine.ask_sync(ASK, doc_filter=flt)
    assert not res["no_answer"], res["answer"]
    assert res["sources"] and {s["doc_id"] for s in res["sources"]} == {kb.target}
    assert res["trace"]["filter"] == flt
    unfiltered = kb.engine.ask_sync(ASK)
    assert kb.target not in {s["doc_id"] for s in unfiltered["sources"]}
    assert "filter" not in unfiltered["trace"]


def test_editing_tags_later_changes_results_and_is_audited(kb):
    engine = kb.engine
    d3 = next(d for d in engine.components.docs.all_docs() if d["file_name"] == "门店03.txt")["doc_id"]
    flt = {"tags_all": ["档案", "古籍"]}
    assert d3 not in docs_of(search(kb, flt)["fused"])
    got = engine.set_document_tags(d3, ["古籍", " 档案 "], {"dept": "legal"})
    assert got["tags"] == ["古籍", "档案"] and got["auto"]["file_type"] == "txt"
    after = search(kb, flt)
    assert d3 in docs_of(after["bm25"]) and d3 in docs_of(after["vector"])
    assert after["bm25"][0]["doc_id"] == d3  # a distractor: it outranks the target once allowed
    engine.set_document_tags(d3, [], {})
    assert docs_of(search(kb, flt)["fused"]) == {kb.target}
    edits = [r for r in engine.audit_log(1, 500, kind="admin")["items"]
             if r["action"] == "document.tags" and (r.get("detail") or {}).get("doc_id") == d3]
    assert len(edits) == 2 and edits[-1]["detail"]["after"] == {"tags": ["古籍", "档案"], "metadata": {"dept": "legal"}}
    assert edits[0]["detail"]["after"] == {"tags": [], "metadata": {}}  # newest first


def test_tags_in_use_and_bad_input(kb):
    assert {t["tag"]: t["docs"] for t in kb.engine.list_tags()} == {"古籍": 1, "档案": 2}
    with pytest.raises(Exception) as e:
        kb.engine.search(Q, 5, doc_filter={"tag": ["档案"]})
    assert getattr(e.value, "code", None) == 1001
    with pytest.raises(Exception) as e:
        kb.engine.set_document_tags(kb.target, None, {"version": "9"})  # automatic: not settable
    assert getattr(e.value, "code", None) == 1001


# ----------------------------------------------------------------------------------------------- the doors
def test_rest_upload_with_tags_a_new_version_inherits_and_put_edits(kb):
    with httpx.Client(base_url=kb.url, timeout=120) as http:
        files = [("file", ("规章.txt", "规章第一版：借书须登记。".encode()))]
        r = http.post("/api/kb/documents", files=files,
                      data={"tags": "规章，制度", "metadata": json.dumps({"source": "https://example.org/a"})}).json()
        assert r["code"] == 0, r
        v1 = r["data"][0]["doc_id"]
        got = http.get(f"/api/kb/documents/{v1}/tags").json()["data"]
        assert got["tags"] == ["制度", "规章"] and got["metadata"] == {"source": "https://example.org/a"}
        r = http.post("/api/kb/documents", files=[("file", ("规章.txt", "规章第二版：借书须登记并出示证件。".encode()))])
        v2 = r.json()["data"][0]["doc_id"]
        assert r.json()["data"][0]["version"] == 2
        assert http.get(f"/api/kb/documents/{v2}/tags").json()["data"]["tags"] == ["制度", "规章"]
        r = http.put(f"/api/kb/documents/{v2}/tags", json={"tags": ["制度"]}).json()
        assert r["data"]["tags"] == ["制度"] and r["data"]["metadata"] == {"source": "https://example.org/a"}
        bad = http.post("/api/kb/documents", files=files, data={"metadata": "not json"})
        assert bad.status_code == 400 and bad.json()["code"] == 1001
        assert http.get("/api/kb/tags").json()["data"][0]["tag"] in ("制度", "古籍", "档案")
    wait_idle(kb.engine)


def test_rest_search_ask_and_sse_take_the_filter(kb):
    flt = {"tags_all": ["档案", "古籍"]}
    with httpx.Client(base_url=kb.url, timeout=120) as http:
        r = http.post("/api/kb/search", json={"query": Q, "top_k": RECALL, "filter": flt}).json()
        assert r["code"] == 0 and docs_of(r["data"]["bm25"]) == {kb.target} == docs_of(r["data"]["vector"])
        r = http.post("/api/qa/ask/sync", json={"question": ASK, "filter": flt}).json()
        assert r["code"] == 0 and not r["data"]["no_answer"]
        assert {s["doc_id"] for s in r["data"]["sources"]} == {kb.target}
        events = []
        with http.stream("POST", "/api/qa/ask", json={"question": ASK, "filter": flt}) as resp:
            ev = None
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    ev = line[7:]
                elif line.startswith("data: "):
                    events.append((ev, json.loads(line[6:])))
        trace = next(d for e, d in events if e == "trace")
        sources = next(d for e, d in events if e == "sources")["sources"]
        assert trace["filter"] == {"tags_all": ["古籍", "档案"]}
        assert sources and {s["doc_id"] for s in sources} == {kb.target}
        bad = http.post("/api/kb/search", json={"query": Q, "filter": {"tags": ["档案"]}})
        assert bad.status_code in (400, 422) and bad.json()["code"] == 1001


def test_openai_sdk_extra_body_filter(kb):
    client = openai.OpenAI(base_url=kb.url + "v1", api_key="none", max_retries=0)
    resp = client.chat.completions.create(model="kb-1", messages=[{"role": "user", "content": ASK}],
                                          extra_body={"kbqa_filter": {"metadata": {"dept": "legal"}}})
    extra = resp.model_extra
    assert extra["kbqa"]["outcome"] != "refuse", resp.choices[0].message.content
    assert {c["doc_id"] for c in extra["citations"]} == {kb.target}
    plain = client.chat.completions.create(model="kb-1", messages=[{"role": "user", "content": ASK}])
    assert kb.target not in {c["doc_id"] for c in plain.model_extra.get("citations") or []}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="kb-1", messages=[{"role": "user", "content": Q}],
                                       extra_body={"kbqa_filter": {"date_from": "不是日期"}})


def test_mcp_search_and_ask_take_the_filter(kb):
    async def work(s):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        hits = await s.call_tool("search", {"query": Q, "top_k": 5, "filter": {"tags_any": ["古籍"]}})
        answer = await s.call_tool("ask", {"question": ASK, "filter": {"tags_all": ["古籍"]}})
        return tools, hits, answer

    tools, hits, answer = over_http(kb.url, {}, work)
    assert "filter" in tools["search"].input_schema["properties"] and "filter" in tools["ask"].input_schema["properties"]
    assert not hits.is_error, hits.content
    rows = hits.structured_content["result"]
    assert rows and {h["doc_id"] for h in rows} == {kb.target}
    assert not answer.is_error and answer.structured_content["outcome"] != "refuse"
    assert {s["doc_id"] for s in answer.structured_content["sources"]} == {kb.target}


@pytest.mark.slow  # launches the page (Gradio) on top of the module's engine
def test_page_tag_picker_and_tag_editor(kb):
    """The chat's tag picker filters the page's answer and its trace shows the filter; the KB tab's editor
    changes what the next filter finds."""
    from tests.live import launched_ui

    with launched_ui(kb.engine) as ui:
        job = ui.client.submit(ASK, True, [1], ["古籍"], "全部标签", api_name="/ask")
        final = job.result(timeout=180)
        sources, trace = final[2], final[3]  # outputs of /ask: chat, stage, sources, trace, …
        assert "书院规定.md" in sources and "门店" not in sources
        assert 'data-filter="1"' in trace and "全部标签：古籍" in trace
        plain = ui.client.submit(ASK, True, [1], [], "任一标签", api_name="/ask").result(timeout=180)
        assert "书院规定.md" not in plain[2] and 'data-filter="1"' not in plain[3]
        picked = ui.client.predict([1], ["古籍", "已删除的标签"], api_name="/chat_tags")
        assert picked["value"] == ["古籍"] and ["古籍（1 篇）", "古籍"] in [list(c) for c in picked["choices"]]
        # 知识库 → 标签与元数据: load, edit, and the edit is what the next filter sees (then put back)
        doc_id, tags, meta, info = ui.client.predict(kb.other, api_name="/kb_doc_tags_load")
        assert doc_id == kb.other and tags == "档案" and meta == "dept = hr" and "人事档案.txt" in info
        msg = ui.client.predict(kb.other, "档案, 古籍", "dept = hr\nsource = https://example.org/hr",
                                api_name="/kb_doc_tags_save")
        assert msg.startswith("已保存：2 个标签，2 项元数据"), msg
        assert docs_of(search(kb, {"tags_all": ["古籍", "档案"]})["fused"]) == {kb.target, kb.other}
        assert "⚠️" in ui.client.predict(kb.other, "档案", "没有等号的一行", api_name="/kb_doc_tags_save")
        ui.client.predict(kb.other, "档案", "dept = hr", api_name="/kb_doc_tags_save")
        assert docs_of(search(kb, {"tags_all": ["古籍", "档案"]})["fused"]) == {kb.target}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def dialect_db(request, tmp_path):
    from store.db import Database

    target = tmp_path / "app.db" if request.param == "sqlite" else request.getfixturevalue("pg_server").create_database()
    db = Database(target)
    yield db
    db.close()


def test_filter_sql_on_both_dialects(dialect_db):
    """DocFilter's statements (EXISTS per tag / key, automatic keys, the date range on created_at text) on SQLite
    and PostgreSQL: the documents each filter allows."""
    from store.doc_tags import DocFilter, DocTagStore
    from store.documents import ChunkRow, DocumentStore, SectionRow

    docs, tags = DocumentStore(dialect_db), DocTagStore(dialect_db)
    ids = []
    for i, ftype in enumerate(("pdf", "txt", "txt")):
        d = docs.create(f"d{i}.{ftype}", ftype, 0, f"{i:032x}", f"d{i}")["doc_id"]
        docs.replace_chunks(d, [ChunkRow(d, 0, "字", 3, 0, 1, "text", ["字"])], [SectionRow(0, 3, "text", None, "字")])
        docs.mark_ready(d, 1)
        ids.append(d)
    tags.set(ids[0], ["甲", "乙"], {"dept": "法务", "source": "/srv/a"})
    tags.set(ids[1], ["甲"], {"dept": "人事"})
    tags.put(ids[2], "source", "https://example.org/x?a=1&b='2'")
    with dialect_db.transaction() as conn:
        conn.execute(update(kb_document).where(kb_document.c.doc_id == ids[0]).values(created_at="2025-03-15 10:00:00"))

    def allowed(**kw) -> set[int]:
        return {d for ds in tags.allowed([1], DocFilter(**kw))[0].values() for d in ds}

    assert allowed(tags_any=("甲",)) == {ids[0], ids[1]} and allowed(tags_all=("甲", "乙")) == {ids[0]}
    assert allowed(meta=(("dept", "人事"),)) == {ids[1]}
    assert allowed(meta=(("source", "https://example.org/x?a=1&b='2'"),)) == {ids[2]}
    assert allowed(meta=(("file_type", "pdf"), ("pages", "3"), ("version", "1"))) == {ids[0]}  # the document's own
    assert allowed(meta=(("pages", "4"),)) == set()
    assert allowed(meta=(("version", "x"),)) == set()
    assert allowed(date_from=date(2025, 3, 15), date_to=date(2025, 3, 15)) == {ids[0]}
    assert allowed(date_from=date(2025, 3, 16)) == {ids[1], ids[2]}
    assert allowed(doc_ids=(ids[1], ids[2])) == {ids[1], ids[2]}  # a follow-up's cited documents
    assert allowed(doc_ids=(ids[1],), tags_any=("甲",)) == {ids[1]} and allowed(doc_ids=(ids[2],), tags_any=("甲",)) == set()
    assert not DocFilter(doc_ids=(ids[1],)).empty and DocFilter(doc_ids=(5,)).to_dict() == {"doc_ids": [5]}
    assert tags.allowed([1], DocFilter(tags_any=("甲",)))[1] == 2  # their chunk count
    assert tags.tags_in_use([1]) == [{"tag": "乙", "docs": 1}, {"tag": "甲", "docs": 2}]
    assert tags.auto(ids[0]) == {"file_type": "pdf", "version": 1, "pages": 3, "uploaded": "2025-03-15"}
    docs.delete(ids[1])
    assert allowed(tags_any=("甲",)) == {ids[0]} and tags.get(ids[1]) == {"tags": [], "metadata": {}}


def test_chunk_to_document_map_contiguous_interleaved_and_gone(dialect_db):
    """store.doc_tags.DocTagStore.doc_ids_of, which maps BM25 positions to documents: documents whose chunk ids
    form one run are read as ranges, ones whose ids interleave (two ingest workers) row by row; both right."""
    from sqlalchemy import insert

    from store.doc_tags import DocTagStore
    from store.documents import ChunkRow, DocumentStore
    from store.schema import kb_chunk

    db = dialect_db
    docs, truth = DocumentStore(db), {}
    for d in range(3):
        doc = docs.create(f"c{d}.txt", "txt", 0, f"{d:032x}", f"c{d}.txt")
        ids = docs.replace_chunks(doc["doc_id"], [ChunkRow(doc["doc_id"], j, "字", None, 0, 1, "text", ["字"])
                                                  for j in range(300)])
        truth.update(dict.fromkeys(ids, doc["doc_id"]))
    a, b = (docs.create(f"{n}.txt", "txt", 0, n * 32, f"{n}.txt")["doc_id"] for n in "ab")
    with db.transaction() as conn:
        for j in range(200):  # alternating ids
            for d in (a, b):
                cid = conn.execute(insert(kb_chunk).returning(kb_chunk.c.chunk_id), {
                    "doc_id": d, "chunk_index": j, "text": "字", "source": "text", "tokens": "字",
                    "section": 0}).scalar_one()
                truth[cid] = d
    gone = max(truth) + 7
    q = np.array(sorted(truth) + [gone], dtype=np.int64)
    expect = np.array([truth.get(int(c), -1) for c in q])
    store = DocTagStore(db)
    assert len(q) > 500 and (store.doc_ids_of(q) == expect).all()
    assert (store.doc_ids_of(q[-20:]) == expect[-20:]).all()  # a few: one IN list


def test_a_filtered_vector_search_survives_an_allowed_chunk_that_lost_its_vector(tmp_path):
    """A filter reaches Chroma as the allowed chunk ids; Chroma refuses a query naming an id it does not hold
    (a vector lost in a crash, which the audit reports), so the route answers through `where` on doc_id instead."""
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"), recall_size=RECALL)
    try:
        for name, text in (("a.txt", TARGET), ("b.txt", OTHER)):
            p = tmp_path / name
            p.write_text(text, encoding="utf-8")
            assert engine.upload([(p.name, p)], tags=["档案"])[0].ok
        wait_idle(engine)
        c = engine.components
        a, b = sorted(d["doc_id"] for d in c.docs.all_docs())
        before = search_vector_docs(engine)
        assert before == {a, b}
        lost = [ch["chunk_id"] for ch in c.docs.chunks_of(a)]
        c.vectors.delete_ids(lost)
        assert search_vector_docs(engine) == {b}  # no error; only what still has a vector
    finally:
        engine.close()


def search_vector_docs(engine) -> set[int]:
    return docs_of(engine.search(ASK, RECALL, doc_filter={"tags_any": ["档案"]})["vector"])


def test_the_filtered_vector_search_follows_chunk_changes_at_once(tmp_path):
    """The allowed chunk ids handed to Chroma are kept per BM25 snapshot: a chunk added to an allowed document is
    found by the next filtered search and a switched-off one is gone from it, with the cache warm before each."""
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"), recall_size=RECALL)
    try:
        p = tmp_path / "a.txt"
        p.write_text(OTHER, encoding="utf-8")
        doc = engine.upload([(p.name, p)], tags=["档案"])[0].doc_id
        wait_idle(engine)

        def vector_ids() -> set[int]:
            return {r["chunk_id"] for r in engine.search(ASK, RECALL, doc_filter={"tags_any": ["档案"]})["vector"]}

        first = vector_ids()
        assert first == vector_ids()  # served from the cache the second time
        added = engine.add_chunk(doc, "退货政策：书籍自签收之日起七日内可以退货。")["chunk_id"]
        assert vector_ids() == first | {added}
        engine.set_chunk_enabled(added, False)
        assert vector_ids() == first
        engine.set_chunk_enabled(added, True)
        assert vector_ids() == first | {added}
    finally:
        engine.close()
