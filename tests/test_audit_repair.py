"""Consistency audit and repair on a real data dir: break each thing on purpose, audit finds it, repair fixes it.

Real SQLite, real Chroma, real files from /work/shared/docs, the tiny random embedding model. Every test starts
and ends with a clean audit (0 problems), so they share one engine and one knowledge base.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from sqlalchemy import text as sql_text

from tests.shared_data import DOCS, RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

FILES = [RULES, DOCS / "chatchat" / "test.txt", DOCS / "gbk" / "iconv-lite_gbkFile_baidu_html.txt",
         DOCS / "mineru" / "zh_union_rules_table_1p.pdf"]

pytestmark = needs(*FILES, DOCS / "gbk" / "chardet_GB2312__ude_1.txt")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("audit")
    e = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    res = e.upload([(p.name, p) for p in FILES])
    assert all(r.ok for r in res)
    wait_idle(e)
    assert all(d["status"] == "ready" for d in e.components.docs.all_docs())
    yield e
    e.close()


@pytest.fixture(autouse=True)
def clean_before_and_after(engine):
    assert engine.audit()["problems"] == 0, engine.audit()
    yield


def doc_named(engine, name: str) -> dict:
    return next(d for d in engine.components.docs.all_docs() if d["file_name"] == name)


def chunk_ids_of(engine, name: str) -> list[int]:
    return [c["chunk_id"] for c in engine.components.docs.chunks_of(doc_named(engine, name)["doc_id"])]


def finding(report: dict, check: str) -> dict:
    found = {f["check"]: f for f in report["findings"]}
    assert check in found, report
    return found[check]


def sql(engine, statement: str, **params) -> None:
    with engine.components.db.transaction() as conn:
        conn.execute(sql_text(statement), params)


def repaired(engine, *, wait: bool = True) -> dict:
    res = engine.repair(wait=wait, timeout=300)
    assert res["after"] == 0, res
    assert engine.audit()["problems"] == 0
    return res


def test_dropped_vectors_are_re_embedded_from_chunk_text(engine):
    ids = chunk_ids_of(engine, RULES.name)[:7]
    before = engine.components.vectors.collection.get(ids=[str(i) for i in ids], include=["embeddings"])
    engine.components.vectors.delete_ids(ids)
    f = finding(engine.audit(), "missing_vectors")
    assert f["count"] == 7 and {i["chunk_id"] for i in f["items"]} == set(ids) and f["fixable"]
    res = repaired(engine)
    assert any(a["check"] == "missing_vectors" and a["count"] == 7 for a in res["actions"])
    after = engine.components.vectors.collection.get(ids=[str(i) for i in ids], include=["embeddings"])
    old = dict(zip(before["ids"], before["embeddings"]))
    for i, e in zip(after["ids"], after["embeddings"]):  # the same model on the same text: the same vector
        assert np.allclose(old[i], e, atol=1e-5)


def test_orphan_vectors_are_dropped(engine):
    dim = engine.components.models.embedding.dim
    engine.components.vectors.collection.add(ids=["900001", "900002"], embeddings=[[0.1] * dim, [0.2] * dim],
                                  documents=["幽灵向量一", "幽灵向量二"],
                                  metadatas=[{"doc_id": 4242, "doc_name": "ghost"}] * 2)
    f = finding(engine.audit(), "orphan_vectors")
    assert {i["chunk_id"] for i in f["items"]} == {900001, 900002}
    repaired(engine)
    assert not {900001, 900002} & engine.components.vectors.all_ids()


def test_a_vector_whose_text_was_altered_is_re_embedded(engine):
    cid = chunk_ids_of(engine, "test.txt")[3]
    text = engine.components.docs.get_chunks([cid])[cid]["text"]
    emb = engine.components.vectors.collection.get(ids=[str(cid)], include=["embeddings"])["embeddings"]
    engine.components.vectors.collection.update(ids=[str(cid)], embeddings=emb, documents=["被篡改的文本"])
    f = finding(engine.audit(), "vector_text_mismatch")
    assert f["items"] == [{"chunk_id": cid, "doc_id": doc_named(engine, "test.txt")["doc_id"]}]
    repaired(engine)
    assert engine.components.vectors.collection.get(ids=[str(cid)], include=["documents"])["documents"] == [text]


def test_corrupt_stored_tokens_are_re_tokenized_and_bm25_rebuilt(engine):
    ids = chunk_ids_of(engine, "iconv-lite_gbkFile_baidu_html.txt")
    sql(engine, "UPDATE kb_chunk SET tokens = '乱码 xx' WHERE chunk_id = :c", c=ids[0])
    engine.components.bm25.rebuild(engine.settings.bm25_k1, engine.settings.bm25_b)  # a restart loads bad tokens
    text = engine.components.docs.get_chunks([ids[0]])[ids[0]]["text"]
    f = finding(engine.audit(), "token_mismatch")
    assert f["items"] == [{"chunk_id": ids[0], "doc_id": doc_named(engine, "iconv-lite_gbkFile_baidu_html.txt")["doc_id"]}]
    repaired(engine)
    assert engine.components.docs.audit_rows() and dict((c, t) for c, _, _, t in engine.components.docs.audit_rows())[ids[0]] != "乱码 xx"
    word = next(t for t in engine.components.tokenizer(text) if len(t) >= 2)
    hits = engine.components.bm25.retriever(engine.components.tokenizer, engine.components.docs.get_chunks, 50).retrieve(word)
    assert ids[0] in {int(h.node.node_id) for h in hits}


def test_document_left_processing_without_a_job_is_requeued(engine):
    doc = doc_named(engine, RULES.name)
    n = doc["chunk_count"]
    engine.components.docs.set_status(doc["doc_id"], "processing", None, "向量化 3/99 块")  # as a crash leaves it
    f = finding(engine.audit(), "stuck_processing")
    assert f["items"] == [{"doc_id": doc["doc_id"], "file_name": RULES.name}]
    res = repaired(engine, wait=True)
    assert any(a["check"] == "stuck_processing" and a["what"] == "重新排队处理" for a in res["actions"])
    again = engine.components.docs.get(doc["doc_id"])
    assert again["status"] == "ready" and again["chunk_count"] == n


def test_ready_document_without_chunks_is_re_ingested_from_its_original(engine):
    doc = doc_named(engine, "test.txt")
    engine.components.docs.delete_chunks(doc["doc_id"])  # rows lost; its vectors are now orphans
    report = engine.audit()
    finding(report, "ready_without_chunks")
    finding(report, "orphan_vectors")
    repaired(engine, wait=True)
    assert engine.components.docs.get(doc["doc_id"])["status"] == "ready"
    assert len(engine.components.docs.chunks_of(doc["doc_id"])) == doc["chunk_count"]


def test_chunk_count_mismatch_is_corrected(engine):
    doc = doc_named(engine, "zh_union_rules_table_1p.pdf")
    sql(engine, "UPDATE kb_document SET chunk_count = 999 WHERE doc_id = :d", d=doc["doc_id"])
    f = finding(engine.audit(), "chunk_count_mismatch")
    assert f["items"][0]["recorded"] == 999 and f["items"][0]["actual"] == doc["chunk_count"]
    repaired(engine)
    assert engine.components.docs.get(doc["doc_id"])["chunk_count"] == doc["chunk_count"]


def test_model_id_mismatch_re_embeds_everything_with_the_loaded_model(engine):
    engine.components.vectors.collection.modify(metadata={"embedding_model": "local:some-older-model", "embedding_dim": 768})
    engine.reload()  # what a restart on this data dir reports
    assert engine.model_warning and "需要全量重建" in engine.model_warning
    f = finding(engine.audit(), "model_mismatch")
    assert f["items"][0]["stored"] == "local:some-older-model"
    n_chunks = len(engine.components.docs.all_chunk_ids())
    res = repaired(engine)
    assert any(a["check"] == "model_mismatch" and a["count"] == n_chunks for a in res["actions"])
    assert engine.components.vectors.model_info() == (engine.components.models.embedding.model_id, engine.components.models.embedding.dim)
    assert engine.model_warning is None and engine.components.vectors.count() == n_chunks


def test_unreferenced_file_is_listed_then_removed_and_originals_are_never_touched(engine):
    stray = engine.components.files.root / ("0" * 32 + ".txt")
    stray.write_text("没有文档引用的文件", encoding="utf-8")
    old = time.time() - 3600
    os.utime(stray, (old, old))
    fresh = engine.components.files.root / ".up-inflight"  # an upload in flight: too young to judge
    fresh.write_text("x")
    originals = {d["stored_name"]: engine.components.files.path_of(d["stored_name"]).read_bytes()
                 for d in engine.components.docs.all_docs()}
    f = finding(engine.audit(), "unreferenced_files")
    assert f["items"] == [{"name": stray.name}]
    res = repaired(engine)
    assert {"check": "unreferenced_files", "count": 1, "what": "删除不属于任何文档的文件",
            "items": [stray.name]} in res["actions"]
    assert not stray.exists() and fresh.exists()
    assert {n: engine.components.files.path_of(n).read_bytes() for n in originals} == originals
    fresh.unlink()


def test_failed_document_leftovers_are_dropped(engine, tmp_path):
    src = DOCS / "gbk" / "chardet_GB2312__ude_1.txt"
    doc_id = engine.upload([(src.name, src)])[0].doc_id
    wait_idle(engine)
    engine.components.docs.set_status(doc_id, "failed", "测试：模拟失败")  # a crash between failing and cleaning up
    f = finding(engine.audit(), "failed_with_data")
    assert f["items"][0]["doc_id"] == doc_id
    repaired(engine)
    assert engine.components.docs.chunks_of(doc_id) == [] and engine.components.docs.get(doc_id)["status"] == "failed"
    engine.delete_document(doc_id)


def test_lost_original_is_reported_with_the_command_and_not_repaired(engine):
    src = DOCS / "gbk" / "chardet_GB2312__ude_1.txt"
    doc_id = engine.upload([(src.name, src)])[0].doc_id
    wait_idle(engine)
    doc = engine.components.docs.get(doc_id)
    engine.components.files.path_of(doc["stored_name"]).unlink()  # deleted by hand
    f = finding(engine.audit(), "missing_files")
    assert not f["fixable"] and "tools.ops.restore" in f["fix"] and "DELETE /api/kb/documents" in f["fix"]
    res = engine.repair(wait=True, timeout=60)
    assert res["after"] == 1 and res["unfixed"][0]["check"] == "missing_files"
    assert engine.components.docs.get(doc_id)["status"] == "ready"  # its text stays searchable; repair never deletes it
    engine.delete_document(doc_id)  # the command the report names
    assert engine.audit()["problems"] == 0


def test_audit_is_read_only(engine):
    ids = chunk_ids_of(engine, RULES.name)[:2]
    engine.components.vectors.delete_ids(ids)
    for _ in range(2):
        assert finding(engine.audit(), "missing_vectors")["count"] == 2
    repaired(engine)
