"""Knowledge bases and document versions through the real app over HTTP (FastAPI + the engine on a temp data dir):
CRUD, scoped questions that never cite another knowledge base, the SRS §7 paths on the default one, cascading
delete, versions that replace the old one in answers and restore."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.engine import Engine
from tests.live import LiveApp

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

CONTRACT_V1 = ("采购合同第八条 付款：乙方应在收到货物并验收合格后 30 天内支付全部货款。"
               "逾期付款的，每日按未付金额的万分之五支付违约金。")
CONTRACT_V2 = ("采购合同第八条 付款：乙方应在收到货物并验收合格后 45 天内支付全部货款。"
               "逾期付款的，每日按未付金额的万分之三支付违约金。")
MANUAL = ("星河路由器使用手册：长按背面的复位键十秒，指示灯闪烁后路由器恢复出厂设置。"
          "付款与发票问题请联系购买渠道，本手册不涉及付款条款。")
QUESTION = "收到货物后多少天内付款？"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    app = LiveApp(Engine(tmp_path_factory.mktemp("kbs") / "data"))
    yield app
    app.stop(close_engine=True)


@pytest.fixture
def http(live):
    with live.http() as c:
        yield c


def ok(resp) -> dict | list:
    body = resp.json()
    assert body["code"] == 0, body
    return body["data"]


def wait_ready(live, timeout=180):
    assert live.engine.wait_idle(timeout)


def upload(http, tmp_path: Path, name: str, text: str, kb_id: int | None, how: str = "query") -> dict:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    files = [("file", (name, path.read_bytes()))]
    if kb_id is None:
        resp = http.post("/api/kb/documents", files=files)
    elif how == "form":
        resp = http.post("/api/kb/documents", files=files, data={"kb_id": str(kb_id)})
    else:
        resp = http.post("/api/kb/documents", files=files, params={"kb_id": kb_id})
    return ok(resp)[0]


@pytest.fixture(scope="module")
def spaces(live, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kbdocs")
    with live.http() as http:
        contracts = ok(http.post("/api/kbs", json={"name": "合同", "description": "采购与销售合同"}))
        manuals = ok(http.post("/api/kbs", json={"name": "产品手册"}))
        c = upload(http, tmp, "采购合同.txt", CONTRACT_V1, contracts["kb_id"], how="form")
        m = upload(http, tmp, "路由器手册.txt", MANUAL, manuals["kb_id"])
        wait_ready(live)
    return {"contracts": contracts, "manuals": manuals, "contract": c, "manual": m, "tmp": tmp}


def test_kb_crud_and_validation(http, spaces):
    kbs = {k["name"]: k for k in ok(http.get("/api/kbs"))}
    assert set(kbs) >= {"默认知识库", "合同", "产品手册"}
    assert kbs["默认知识库"]["is_default"] and kbs["默认知识库"]["kb_id"] == 1
    assert kbs["合同"]["docs"] == 1 and kbs["合同"]["chunks"] >= 1 and kbs["合同"]["description"] == "采购与销售合同"
    dup = http.post("/api/kbs", json={"name": "合同"}).json()
    assert dup["code"] == 1001 and "同名" in dup["msg"]
    blank = http.post("/api/kbs", json={"name": "   "}).json()
    assert blank["code"] == 1001
    tmp = ok(http.post("/api/kbs", json={"name": "临时"}))
    renamed = ok(http.put(f"/api/kbs/{tmp['kb_id']}", json={"name": "临时 2", "description": "改了"}))
    assert renamed["name"] == "临时 2" and renamed["description"] == "改了"
    assert http.put(f"/api/kbs/{tmp['kb_id']}", json={"name": "合同"}).json()["code"] == 1001
    assert http.delete(f"/api/kbs/{tmp['kb_id']}").json()["code"] == 1001  # confirm=true required
    assert ok(http.delete(f"/api/kbs/{tmp['kb_id']}", params={"confirm": "true"}))["docs_removed"] == 0
    assert http.get(f"/api/kbs/{tmp['kb_id']}").json()["code"] == 3002
    d = http.delete("/api/kbs/1", params={"confirm": "true"}).json()
    assert d["code"] == 1001 and "默认知识库不能删除" in d["msg"]
    assert http.get("/api/kb/documents", params={"kb_id": 999}).json()["code"] == 3002
    files = [("file", ("x.txt", "内容".encode()))]
    assert http.post("/api/kb/documents", files=files, params={"kb_id": 999}).json()["code"] == 3002


def test_scoped_question_never_cites_the_other_kb(http, spaces):
    cid, mid = spaces["contracts"]["kb_id"], spaces["manuals"]["kb_id"]
    for scope in ({"kb_id": cid}, {"kb_ids": [cid]}):
        res = ok(http.post("/api/qa/ask/sync", json={"question": "付款", **scope}))
        assert res["sources"] and {s["kb_id"] for s in res["sources"]} == {cid}
        assert all(s["kb_name"] == "合同" for s in res["sources"])
    res = ok(http.post("/api/qa/ask/sync", json={"question": "付款", "kb_id": mid}))
    assert {s["kb_id"] for s in res["sources"]} <= {mid}
    both = ok(http.post("/api/qa/ask/sync", json={"question": "付款", "kb_ids": [cid, mid]}))
    assert {s["kb_id"] for s in both["sources"]} == {cid, mid}
    # the stream, the debug search and the trace obey the scope too
    with http.stream("POST", "/api/qa/ask", json={"question": "恢复出厂设置", "kb_ids": [cid]}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    sources = next(e["sources"] for e in events if "sources" in e)
    assert all(s["kb_id"] == cid for s in sources)
    found = ok(http.post("/api/kb/search", json={"query": "恢复出厂设置", "top_k": 5, "kb_id": cid}))
    assert all(row["kb_id"] == cid for key in ("bm25", "vector", "fused") for row in found[key])
    found = ok(http.post("/api/kb/search", json={"query": "恢复出厂设置", "top_k": 5, "kb_ids": [cid, mid]}))
    assert any(row["kb_id"] == mid for row in found["fused"])
    assert http.post("/api/qa/ask/sync", json={"question": "付款", "kb_ids": [cid, 999]}).json()["code"] == 3002


def test_list_health_and_default_kb_paths(http, spaces, live):
    cid = spaces["contracts"]["kb_id"]
    docs = ok(http.get("/api/kb/documents", params={"kb_id": cid}))
    assert [d["file_name"] for d in docs["items"]] == ["采购合同.txt"] and docs["kb_id"] == cid
    assert ok(http.get("/api/health", params={"kb_id": cid}))["docs"] == 1
    # SRS §7 paths without kb_id work on the default knowledge base
    before = ok(http.get("/api/kb/documents"))["total"]
    r = upload(http, spaces["tmp"], "默认.txt", "默认知识库里的一份说明：会议室在三楼东侧。", None)
    assert r["kb_id"] == 1
    wait_ready(live)
    assert ok(http.get("/api/kb/documents"))["total"] == before + 1
    res = ok(http.post("/api/qa/ask/sync", json={"question": "会议室在哪里"}))
    assert res["sources"] and all(s["kb_id"] == 1 for s in res["sources"])
    total = ok(http.get("/api/health"))
    assert total["docs"] >= 3 and total["kbs"] >= 3


def test_same_file_in_two_kbs_is_two_documents(http, spaces, live):
    cid, mid = spaces["contracts"]["kb_id"], spaces["manuals"]["kb_id"]
    r = upload(http, spaces["tmp"], "路由器手册.txt", MANUAL, cid)
    assert not r["existed"] and r["kb_id"] == cid  # not 「已存在」: another knowledge base
    again = upload(http, spaces["tmp"], "路由器手册.txt", MANUAL, mid)
    assert again["existed"] and again["msg"] == "已存在"
    wait_ready(live)
    ok(http.delete(f"/api/kb/documents/{r['doc_id']}"))
    manual = live.engine.components.docs.get(spaces["manual"]["doc_id"])
    assert manual["status"] == "ready"
    assert live.engine.components.files.path_of(manual["stored_name"]).exists()  # its own stored file
    found = ok(http.post("/api/kb/search", json={"query": "恢复出厂设置", "top_k": 5, "kb_id": mid}))
    assert found["fused"] and found["fused"][0]["doc_id"] == spaces["manual"]["doc_id"]


def test_new_version_replaces_the_old_in_answers_and_restores(http, spaces, live):
    cid = spaces["contracts"]["kb_id"]
    v1 = spaces["contract"]
    first = ok(http.post("/api/qa/ask/sync", json={"question": QUESTION, "kb_id": cid}))
    assert any(s["doc_id"] == v1["doc_id"] and "30 天" in s["text"] for s in first["sources"])

    v2 = upload(http, spaces["tmp"], "采购合同.txt", CONTRACT_V2, cid)
    assert v2["version"] == 2 and "新版本 v2" in v2["msg"] and not v2["existed"]
    wait_ready(live)
    listed = ok(http.get("/api/kb/documents", params={"kb_id": cid}))["items"]
    contract_rows = [d for d in listed if d["file_name"] == "采购合同.txt"]
    assert [(d["doc_id"], d["version"], d["versions"]) for d in contract_rows] == [(v2["doc_id"], 2, 2)]
    res = ok(http.post("/api/qa/ask/sync", json={"question": QUESTION, "kb_id": cid}))
    contract_sources = [s for s in res["sources"] if s["doc_name"] == "采购合同.txt"]
    assert contract_sources and all(s["doc_id"] == v2["doc_id"] and s["version"] == 2 for s in contract_sources)
    assert "45 天" in res["answer"] or any("45 天" in s["text"] for s in contract_sources)
    old_chunks = {c["chunk_id"] for c in live.engine.document_chunks(v1["doc_id"])}
    assert old_chunks  # the old version is kept …
    found = ok(http.post("/api/kb/search", json={"query": "30 天内支付全部货款", "top_k": 20, "kb_id": cid}))
    assert not old_chunks & {row["chunk_id"] for k in ("bm25", "vector", "fused") for row in found[k]}  # … never found
    versions = ok(http.get(f"/api/kb/documents/{v2['doc_id']}/versions"))
    assert [(v["version"], v["active"]) for v in versions] == [(2, 1), (1, 0)]
    assert all(v["created_at"] for v in versions)
    # same content → 「已存在」; the old version's content → 已存在 with a pointer to 恢复
    assert upload(http, spaces["tmp"], "采购合同.txt", CONTRACT_V2, cid)["msg"] == "已存在"
    same_as_old = upload(http, spaces["tmp"], "采购合同（旧）.txt", CONTRACT_V1, cid)
    assert same_as_old["existed"] and "旧版本 v1" in same_as_old["msg"]
    # answers given before keep pointing at the version they cited, marked 旧版本 on replay
    from ui.render import mark_replaced, render_sources

    replay = mark_replaced(live.engine, first["sources"])
    assert any(s["replaced"] == "旧版本" for s in replay if s["doc_id"] == v1["doc_id"])
    assert "旧版本" in render_sources(replay)

    restored = ok(http.post(f"/api/kb/documents/{v1['doc_id']}/restore"))
    assert restored == {"doc_id": v1["doc_id"], "version": 1, "changed": True}
    res = ok(http.post("/api/qa/ask/sync", json={"question": QUESTION, "kb_id": cid}))
    contract_sources = [s for s in res["sources"] if s["doc_name"] == "采购合同.txt"]
    assert contract_sources and all(s["doc_id"] == v1["doc_id"] for s in contract_sources)
    found = ok(http.post("/api/kb/search", json={"query": "30 天内支付全部货款", "top_k": 20, "kb_id": cid}))
    assert old_chunks & {row["chunk_id"] for row in found["bm25"]}  # restored chunks are in BM25 at once
    assert [(v["version"], v["active"]) for v in ok(http.get(f"/api/kb/documents/{v1['doc_id']}/versions"))] == \
        [(2, 0), (1, 1)]
    assert http.post(f"/api/kb/documents/{v1['doc_id']}/restore").json()["data"]["changed"] is False


def test_delete_old_version_then_whole_document(http, live, tmp_path):
    kb = ok(http.post("/api/kbs", json={"name": "版本删除"}))
    a = upload(http, tmp_path, "规章.txt", "规章第一版：上班时间九点。", kb["kb_id"])
    wait_ready(live)
    b = upload(http, tmp_path, "规章.txt", "规章第二版：上班时间九点半。", kb["kb_id"])
    c = None
    wait_ready(live)
    c = upload(http, tmp_path, "规章.txt", "规章第三版：上班时间十点。", kb["kb_id"])
    wait_ready(live)
    assert c["version"] == 3
    gone = ok(http.delete(f"/api/kb/documents/{a['doc_id']}"))  # an old version: only itself
    assert gone["versions_removed"] == 1
    assert [v["version"] for v in ok(http.get(f"/api/kb/documents/{c['doc_id']}/versions"))] == [3, 2]
    gone = ok(http.delete(f"/api/kb/documents/{c['doc_id']}"))  # the active version: the whole document
    assert gone["versions_removed"] == 2
    assert http.get(f"/api/kb/documents/{b['doc_id']}/versions").json()["code"] == 3002


def test_delete_kb_cascades(http, live, tmp_path):
    kb = ok(http.post("/api/kbs", json={"name": "将被删除"}))
    r = upload(http, tmp_path, "海豚.txt", "海豚睡觉时只让半个大脑休息，另一半保持清醒以便呼吸。", kb["kb_id"])
    wait_ready(live)
    engine = live.engine
    stored = engine.components.files.path_of(engine.components.docs.get(r["doc_id"])["stored_name"])
    kbh = engine.components.kbs.get(kb["kb_id"])
    bm25_dir, collection = kbh.bm25.persist_dir, kbh.vectors.name
    assert stored.exists() and bm25_dir.exists() and kbh.vectors.count() > 0
    res = ok(http.delete(f"/api/kbs/{kb['kb_id']}", params={"confirm": "true"}))
    assert res == {"kb_id": kb["kb_id"], "name": "将被删除", "docs_removed": 1}
    assert not stored.exists() and not bm25_dir.exists()
    assert collection not in [c.name for c in kbh.vectors.client.list_collections()]
    assert engine.components.docs.get(r["doc_id"]) is None
    assert engine.components.docs.chunks_of(r["doc_id"]) == []
    res = ok(http.post("/api/qa/ask/sync", json={"question": "海豚怎么睡觉", "kb_ids": [1]}))
    assert all(s["doc_id"] != r["doc_id"] for s in res["sources"])
    assert http.post("/api/qa/ask/sync", json={"question": "海豚", "kb_id": kb["kb_id"]}).json()["code"] == 3002


def test_audit_and_backup_see_every_kb(http, spaces, live, tmp_path):
    """The consistency audit (issue 18) looks at every knowledge base's collection and BM25 index: documents of
    other knowledge bases and old versions are not reported as missing vectors / missing from BM25."""
    engine = live.engine
    assert len(engine.list_kbs()) >= 3 and any(d["active"] == 0 for d in engine.components.docs.all_docs())
    report = engine.audit()
    assert report["ok"], report["findings"]
    assert report["counts"]["vectors"] == sum(kb.vectors.count() for kb in engine.components.kbs.all())
    manifest = engine.backup(tmp_path / "backup")
    assert manifest["counts"]["vectors"] == report["counts"]["vectors"]
