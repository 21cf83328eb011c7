"""Knowledge base through the real engine: real files, real SQLite, real Chroma, real embedding model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from pipeline.engine import Engine, EngineError
from pipeline.events import source_list
from tests.shared_data import DOCS, ROOT, needs
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, needs(DOCS)]  # the packaged e5 model: the module's engine loads it


def wait_docs(engine: Engine, timeout: float = 300) -> None:
    assert engine.wait_idle(timeout), "ingest did not finish"


def upload_file(engine: Engine, path: Path, name: str | None = None):
    return engine.upload([(name or path.name, path)])[0]


def doc_status(engine, doc_id):
    return engine.components.docs.get(doc_id)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = Engine(tmp_path_factory.mktemp("kb") / "data")
    yield e
    e.close()


# --- real documents --------------------------------------------------------------------------------
# The two novels (1.2 / 1.8 MB, thousands of chunks) are parsed in tests/test_parsing.py; embedding them here
# would cost minutes per run.
EXPECT_READY = {
    "chatchat/test.txt": "ChatGPT",
    "chatchat/人民检察院行政诉讼监督规则（试行）(2016-04-15).md": "人民检察院",
    "gbk/chardet_GB2312__ude_1.txt": None,
    "gbk/iconv-lite_gbkFile_baidu_html.txt": "百度",
    "mineru/zh_union_rules_table_1p.pdf": "工会",
    "mineru/zh_ccs_ship_rules_table_1p.pdf": "船",
    "mineru/zh_chem_symbols_kangxi_radicals_1p.pdf": "用",
    "mineru/zh_broker_research_report_tables_4p.pdf": "高测股份",
    "mineru/zh_procurement_contract_template.docx": "合同",
    "mineru/zh_mineru_feature_test.docx": None,
    "mineru/zh_en_complex_features_8tables.docx": None,
    "rapidocrpdf/direct_extract.pdf": None,
}


@pytest.mark.parametrize("rel,needle", sorted(EXPECT_READY.items()))
def test_real_documents_become_ready(engine, rel, needle):
    r = upload_file(engine, DOCS / rel)
    assert r.ok, r.msg
    wait_docs(engine)
    doc = doc_status(engine, r.doc_id)
    assert doc["status"] == "ready", doc["fail_reason"]
    chunks = engine.document_chunks(r.doc_id)
    assert chunks and doc["chunk_count"] == len(chunks)
    assert all(len(c["text"]) <= engine.settings.chunk_size for c in chunks)
    text = "".join(c["text"] for c in chunks)
    if needle:
        assert needle in text
    if rel.endswith(".pdf"):
        assert all(c["page"] for c in chunks)
    if "kangxi" in rel:
        assert "\u2f64" not in text  # Kangxi radical ⽤ normalized to 用


def test_kangxi_normalized_text_is_searchable(engine):
    upload_file(engine, DOCS / "mineru/zh_chem_symbols_kangxi_radicals_1p.pdf")
    wait_docs(engine)
    hits = engine.search("常用符号", 5)["bm25"]
    assert hits and any("chem" in h["doc_name"] for h in hits)


def test_scanned_pdf_without_ocr_fails_with_reason(tmp_path):
    e = Engine(tmp_path / "data")
    try:
        e.update_settings({"ocr_enabled": False})
        r = upload_file(e, DOCS / "mineru/zh_scanned_book_2p.pdf")
        g = upload_file(e, DOCS / "mineru/zh_garbled_textlayer_gbk_bytes_1p.pdf")
        wait_docs(e)
        for rr in (r, g):
            d = e.components.docs.get(rr.doc_id)
            assert d["status"] == "failed" and d["fail_reason"] == "未解析到文本"
            assert e.components.docs.chunks_of(rr.doc_id) == []
        assert e.components.vectors.count() == 0  # a failed document leaves no vectors
    finally:
        e.close()


# --- bad inputs ------------------------------------------------------------------------------------
def _zip_bomb(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", b"\0" * (300 * 1024 * 1024))
    return path


BAD = [
    ("virus.exe", b"MZ\x90\x00binary", "不支持"),
    ("renamed.txt", b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 20, None),
    ("random.pdf", os.urandom(4096), None),
    ("truncated.pdf", lambda: (DOCS / "mineru/zh_union_rules_table_1p.pdf").read_bytes()[:3000], None),  # read late
    ("notzip.docx", "这不是一个 docx 文件".encode() * 50, None),
    ("empty.txt", b"", None),
]


@pytest.mark.parametrize("name,data,reason_part", BAD, ids=[b[0] for b in BAD])
def test_bad_files_fail_cleanly(engine, tmp_path, name, data, reason_part):
    p = tmp_path / "upload.bin"
    p.write_bytes(data() if callable(data) else data)
    before = engine.components.vectors.count()
    r = engine.upload([(name, p)])[0]
    if r.ok:  # accepted at the door, must fail in the worker with a reason
        wait_docs(engine)
        d = engine.components.docs.get(r.doc_id)
        assert d["status"] == "failed" and d["fail_reason"]
        engine.delete_document(r.doc_id)
    else:
        assert r.msg
        if reason_part:
            assert reason_part in r.msg
    assert engine.components.vectors.count() == before


def test_zip_bomb_docx_fails_cleanly(engine, tmp_path):
    p = _zip_bomb(tmp_path / "bomb.docx")
    r = engine.upload([("bomb.docx", p)])[0]
    if r.ok:
        wait_docs(engine)
        d = engine.components.docs.get(r.doc_id)
        assert d["status"] == "failed"
        engine.delete_document(r.doc_id)
    else:
        assert r.msg


def test_oversize_and_batch_limits(engine, tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(20 * 1024 * 1024 + 1)
    r = engine.upload([("big.txt", big)])[0]
    assert not r.ok and "20" in r.msg
    small = []
    for i in range(11):
        p = tmp_path / f"s{i}.txt"
        p.write_text(f"批量上传第 {i} 个文件，内容各不相同 {i * 7919}。", encoding="utf-8")
        small.append((f"s{i}.txt", p))
    res = engine.upload(small)
    assert [r.ok for r in res].count(True) == 10 and not res[10].ok and "10" in res[10].msg
    wait_docs(engine)
    for r in res[:10]:
        engine.delete_document(r.doc_id)


def test_hostile_file_names_never_choose_a_path(engine, tmp_path):
    p = tmp_path / "x.txt"
    for i, name in enumerate(["../../x.txt", "a/b/../../../etc/passwd.txt", "nul\x00byte.txt",
                              "长" * 300 + ".txt"]):
        p.write_text(f"文件名测试 {i} 号内容。", encoding="utf-8")
        r = engine.upload([(name, p)])[0]
        assert r.ok, r.msg
        d = engine.components.docs.get(r.doc_id)
        stored = engine.components.files.path_of(d["stored_name"])
        assert stored.parent == engine.components.files.root.resolve() and stored.exists()
        assert "\x00" not in d["file_name"] and "/" not in d["file_name"] and len(d["file_name"]) <= 200
    wait_docs(engine)
    assert not (engine.data_dir.parent / "x.txt").exists()


def test_dedupe_by_md5(engine, tmp_path):
    p = tmp_path / "dup.txt"
    p.write_text("重复上传的文件只保存一份。这是去重测试。", encoding="utf-8")
    r1 = engine.upload([("dup.txt", p)])[0]
    wait_docs(engine)
    n_docs = engine.components.docs.counts()["docs"]
    r2 = engine.upload([("another-name.txt", p)])[0]
    assert r2.existed and r2.msg == "已存在" and r2.doc_id == r1.doc_id
    assert engine.components.docs.counts()["docs"] == n_docs


def test_delete_removes_from_all_stores(engine, tmp_path):
    p = tmp_path / "secret.txt"
    p.write_text("紫藤萝计划的负责人是张三丰。紫藤萝计划预算为八百万元。", encoding="utf-8")
    r = engine.upload([("secret.txt", p)])[0]
    wait_docs(engine)
    chunk_ids = [c["chunk_id"] for c in engine.document_chunks(r.doc_id)]
    stored = engine.components.files.path_of(engine.components.docs.get(r.doc_id)["stored_name"])
    assert engine.search("紫藤萝计划负责人", 5)["bm25"][0]["chunk_id"] in chunk_ids
    bm25 = engine.components.bm25
    built = bm25.view.generation
    engine.delete_document(r.doc_id)
    assert engine.components.docs.get(r.doc_id) is None
    assert engine.components.docs.chunks_of(r.doc_id) == []
    assert not engine.components.vectors.collection.get(ids=[str(c) for c in chunk_ids])["ids"]
    assert not stored.exists()
    res = engine.search("紫藤萝计划负责人", 10)
    for group in ("bm25", "vector", "fused"):
        assert not {h["chunk_id"] for h in res[group]} & set(chunk_ids)
    wait_until(lambda: bm25.view.generation > built, 60, 0.05, "the background BM25 sync after the delete")
    # the sync landed (the chunks are no longer ready: dead entries); still gone
    assert not {h["chunk_id"] for h in engine.search("紫藤萝计划", 10)["bm25"]} & set(chunk_ids)
    with pytest.raises(EngineError) as ei:
        engine.delete_document(r.doc_id)
    assert ei.value.code == 3002


def test_rebuild_follows_new_chunk_size(tmp_path):
    e = Engine(tmp_path / "data")
    try:
        r = upload_file(e, DOCS / "chatchat/test.txt")
        wait_docs(e)
        before = e.components.docs.get(r.doc_id)["chunk_count"]
        e.update_settings({"chunking": {"chunk_size": 150, "chunk_overlap": 20}})
        assert e.components.docs.get(r.doc_id)["chunk_count"] == before  # existing docs keep their chunks until rebuild
        e.start_rebuild()
        with pytest.raises(EngineError):  # uploads refused while the rebuild runs
            e.upload([("x.txt", DOCS / "gbk/chardet_GB2312__ude_1.txt")])
        st = e.wait_rebuild(timeout=300)
        assert not st["running"] and st["done"] == st["total"] == 1 and st["error"] is None
        after = e.components.docs.get(r.doc_id)
        assert after["status"] == "ready" and after["chunk_count"] > before * 1.5
        assert e.components.vectors.count() == after["chunk_count"]
        assert all(len(c["text"]) <= 150 for c in e.document_chunks(r.doc_id))
    finally:
        e.close()


def test_processing_chunks_not_visible(tmp_path):
    """A document's chunks never show up in retrieval before it is 就绪."""
    e = Engine(tmp_path / "data")
    try:
        p = tmp_path / "a.txt"
        p.write_text("星河湾项目的竣工日期是二〇三〇年五月。", encoding="utf-8")
        r = e.upload([("a.txt", p)])[0]
        wait_docs(e)
        e.components.docs.set_status(r.doc_id, "processing")  # as if it were still being processed
        res = e.search("星河湾项目竣工日期", 5)
        assert res["bm25"] == [] and res["vector"] == []
    finally:
        e.close()


CRASH_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from pipeline.engine import Engine
    e = Engine({data!r})
    # slow the embedding down so the kill lands mid-document (after some vectors are written)
    class Slow:
        def __init__(self, m):
            self.m = m
        def get_text_embedding_batch(self, texts, **kw):
            out = self.m.get_text_embedding_batch(texts, **kw)
            print("EMBEDDED", flush=True)
            time.sleep(0.5)  # a slow model: what this stand-in simulates
            return out
    real = e.components.models.embedding.embed_model
    e.components.ingest.get_embedding = lambda: Slow(real)
    # small chunks → many embedding batches; vectors are flushed to Chroma every 128
    e.update_settings(dict(chunk_size=100, chunk_overlap=10))
    r = e.upload([("big.txt", Path({src!r}))])
    print("UPLOADED", r[0].doc_id, flush=True)
    time.sleep(600)  # keeps ingesting until the test kills it
""")


def test_crash_mid_document_leaves_no_orphans(tmp_path):
    data = tmp_path / "data"
    src = DOCS / "chatchat/test.txt"
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT.format(root=str(ROOT), data=str(data), src=str(src)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        seen = 0
        deadline = time.time() + 180
        while time.time() < deadline:
            line = proc.stdout.readline()
            if "EMBEDDED" in line:
                seen += 1
                if seen >= 6:  # past the first 128-vector flush, before the end of the document
                    break
        assert seen, "worker never embedded"
        os.kill(proc.pid, signal.SIGKILL)  # crash mid-document: some vectors written, status 处理中
    finally:
        proc.kill()
        proc.wait()
    # the crash really left a half-written document behind
    from store.db import Database
    from store.documents import DocumentStore
    from store.vectors import VectorStore

    pre_docs = DocumentStore(Database(data / "app.db")).all_docs()
    assert pre_docs[0]["status"] == "processing"
    assert 0 < VectorStore(data / "chroma").count()
    e = Engine(data)
    try:
        wait_docs(e)
        docs = e.components.docs.all_docs()
        assert len(docs) == 1 and docs[0]["status"] == "ready"  # resumed
        assert e.components.vectors.all_ids() == e.components.docs.all_chunk_ids()  # no orphan vectors
        assert e.components.vectors.count() == docs[0]["chunk_count"]
    finally:
        e.close()


def engine_with_one_doc(data: Path, src: Path, text: str) -> tuple[Engine, Path]:
    """An engine on `data` holding one ready document with `text` (written to `src`)."""
    e = Engine(data)
    src.write_text(text, encoding="utf-8")
    e.upload([(src.name, src)])
    wait_docs(e)
    return e, src


def test_orphan_vectors_removed_on_start(tmp_path):
    data = tmp_path / "data"
    e, _ = engine_with_one_doc(data, tmp_path / "o.txt", "孤儿向量测试文档。")
    dim = e.components.models.embedding.dim
    e.components.vectors.collection.add(ids=["999999"], embeddings=[[0.1] * dim], documents=["ghost"],
                             metadatas=[{"doc_id": 4242, "doc_name": "ghost"}])
    e.close()
    e2 = Engine(data)
    try:
        assert "999999" not in {str(i) for i in e2.components.vectors.all_ids()}
        assert e2.components.vectors.all_ids() == e2.components.docs.all_chunk_ids()
    finally:
        e2.close()


def test_embedding_model_change_detected(tmp_path):
    data = tmp_path / "data"
    e, p = engine_with_one_doc(data, tmp_path / "m.txt", "模型变更检测。")
    e.components.vectors.collection.modify(metadata={"embedding_model": "local:other-model",
                                          "embedding_dim": 768})
    e.close()
    e2 = Engine(data)
    try:
        assert e2.model_warning and "需要全量重建" in e2.model_warning
        assert e2.health()["warning"]
        with pytest.raises(EngineError):  # no vectors of two models mixed
            e2.upload([("n.txt", p)])
        st = e2.rebuild(timeout=300)
        assert st["error"] is None and e2.model_warning is None
        assert e2.components.vectors.model_info() == (e2.components.models.embedding.model_id, e2.components.models.embedding.dim)
    finally:
        e2.close()


def test_scanned_pdf_is_ocrd_and_retrievable(tmp_path):
    """OCR inside the ingest worker: the scanned book becomes 就绪 and a question retrieves an OCR chunk."""
    e = Engine(tmp_path / "data")
    try:
        r = upload_file(e, DOCS / "mineru/zh_scanned_book_2p.pdf")
        wait_docs(e, 600)
        d = e.components.docs.get(r.doc_id)
        assert d["status"] == "ready", d["fail_reason"]
        chunks = e.document_chunks(r.doc_id)
        assert {c["source"] for c in chunks} == {"ocr"} and {c["page"] for c in chunks} == {1, 2}
        res = e.retrieve("商品的使用价值是什么")
        assert res.hit and res.final[0].node.metadata["source"] == "ocr"
        assert any("使用价值" in n.node.get_content() for n in res.final)
        src = source_list(res)[0]
        assert src["source"] == "ocr" and src["page"] in (1, 2)
    finally:
        e.close()


def test_list_paging_and_keyword(engine, tmp_path):
    for i in range(3):
        p = tmp_path / f"page{i}.txt"
        p.write_text(f"分页测试文档 {i}，内容互不相同 {i * 31}。", encoding="utf-8")
        engine.upload([(f"分页_{i}.txt", p)])
    wait_docs(engine)
    got = engine.list_documents(page=1, size=2, keyword="分页_")
    assert got["total"] == 3 and len(got["items"]) == 2
    assert {d["file_name"] for d in got["items"]} < {"分页_0.txt", "分页_1.txt", "分页_2.txt"}
    assert len(engine.list_documents(page=2, size=2, keyword="分页_")["items"]) == 1
    assert engine.list_documents(keyword="%")["total"] == 0  # wildcards are literal
    item = got["items"][0]
    assert {"file_name", "file_type", "file_size", "chunk_count", "status", "fail_reason", "created_at"} <= set(item)
    assert "stored_name" not in item
