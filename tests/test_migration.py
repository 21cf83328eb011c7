"""Migration: a data dir made by the release before knowledge bases (RELEASE, built here by that release's own
code from `git archive`) opens with everything in the default knowledge base and nothing lost: documents, ids,
chunks, vectors, BM25, answers and settings as they were; then new features work on it."""
from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.shared_data import DOCS, ROOT, needs

RELEASE = "febf37dc83d66995332c60de93f4787ace536448"  # main before issue 16 (schema of SRS §8, one pool)

pytestmark = [pytest.mark.slow, needs(DOCS)]


def _release_tree(dest: Path) -> Path:
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", RELEASE], check=True,
                              capture_output=True, timeout=120).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"release {RELEASE[:8]} not in this clone's history: {exc}")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def old_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("migration")
    tree = _release_tree(tmp / "release")
    data = tmp / "data"
    out = tmp / "expected.json"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, str(ROOT / "tests" / "release_data_dir.py"), str(data), str(ROOT / "models"),
                    str(DOCS), str(out)], cwd=tree, env=env, check=True, timeout=1200)
    with sqlite3.connect(data / "app.db") as conn:  # really the old schema
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "kb_base" not in tables and "schema_version" not in tables
    return data, json.loads(out.read_text(encoding="utf-8"))


def test_release_data_dir_opens_in_the_default_kb(old_dir):
    from pipeline.engine import Engine
    from store.migrations import MIGRATIONS

    data, exp = old_dir
    e = Engine(data)
    try:
        c = e.components
        assert c.db.applied_migrations == [m.version for m in MIGRATIONS]
        kbs = e.list_kbs()
        assert [(k["kb_id"], k["name"], k["docs"]) for k in kbs] == [(1, "默认知识库", len(exp["docs"]))]
        got = [{k: d[k] for k in ("doc_id", "file_name", "content_md5", "chunk_count", "status", "stored_name")}
               for d in c.docs.all_docs()]
        assert got == exp["docs"]
        assert all(d["kb_id"] == 1 and d["version"] == 1 and d["active"] == 1 for d in c.docs.all_docs())
        for doc_id, chunks in exp["chunks"].items():
            assert [[ch["chunk_id"], ch["text"]] for ch in c.docs.chunks_of(int(doc_id))] == chunks
        assert c.vectors.count() == exp["vectors"] and c.kbs.default.vectors is c.vectors
        assert e.model_warning is None
        # The default fusion changed after that release (issue 13: convex); its fusion stays selectable and must
        # reproduce the old rankings exactly on the migrated indexes.
        e.update_settings({"fusion_mode": "rrf"})
        for q, ids in exp["search"].items():
            assert [r["chunk_id"] for r in e.search(q, 5)["fused"]] == ids
        assert [s["chunk_id"] for s in e.ask_sync("人民检察院如何对行政诉讼实行法律监督")["sources"]] == \
            exp["answer_chunks"]
        assert {"chunk_size": e.settings.chunk_size, "bm25_weight": e.settings.bm25_weight} == exp["settings"]
        # min_similarity was never set by an admin there: its old e5 default moves to today's calibrated one
        assert exp["min_similarity"] == 0.88 and e.settings.min_similarity == e.default_settings().min_similarity == 0.82
        # the viewer shows documents of the old release too (their text rebuilt from the chunks)
        for d in exp["docs"]:
            chunks = c.docs.chunks_of(d["doc_id"])
            view = e.document_text(d["doc_id"], chunk_id=chunks[-1]["chunk_id"])
            assert view["rebuilt_from_chunks"] and view["highlight"] == chunks[-1]["chunk_id"]
            for ch in chunks:
                if ch["page"] == view["page"] and ch["section"] == view["section"]:
                    span = next(x for x in view["chunks"] if x["chunk_id"] == ch["chunk_id"])
                    assert view["text"][span["start"]:span["end"]] == ch["text"]
        # … and the new features work on it
        listed = e.list_documents(kb_id=1)["items"]
        assert {d["doc_id"] for d in listed} == {d["doc_id"] for d in exp["docs"]}
        new = e.upload([("新文档.txt", _text(data.parent, "新文档.txt", "迁移之后上传的新文档。"))])[0]
        assert new.doc_id > exp["deleted_doc_id"]  # ids of deleted documents are not handed out again
        test_txt = next(d for d in exp["docs"] if d["file_name"] == "test.txt")
        v2 = e.upload([("test.txt", _text(data.parent, "test.txt", "test.txt 的第二版：内容已经更新。"))])[0]
        assert v2.version == 2
        kb = e.create_kb("迁移后新建")
        r = e.upload([("other.txt", _text(data.parent, "other.txt", "另一个知识库里的文档。"))], kb["kb_id"])[0]
        assert e.wait_idle(300)
        assert e.get_document(v2.doc_id)["active"] == 1 and e.get_document(test_txt["doc_id"])["active"] == 0
        assert e.get_document(r.doc_id)["kb_id"] == kb["kb_id"]
    finally:
        e.close()
    # opening again applies nothing more and keeps everything
    e = Engine(data)
    try:
        assert e.components.db.applied_migrations == []
        assert len(e.list_kbs()) == 2
    finally:
        e.close()


def _text(folder: Path, name: str, text: str) -> Path:
    p = folder / "uploads-src" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p
