"""Builds a data dir with the code of an older release (run by tests/test_migration.py inside `git archive` of that
release, so only APIs that release had are used here) and writes what it holds to expected.json.

    python release_data_dir.py DATA_DIR MODELS_DIR DOCS_DIR OUT_JSON
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(data_dir: str, models_dir: str, docs_dir: str, out: str) -> int:
    from pipeline.offline import enable_offline

    enable_offline()
    from pipeline.engine import Engine

    docs = Path(docs_dir)
    e = Engine(data_dir, models_dir=Path(models_dir))
    e.update_settings({"chunk_size": 280, "bm25_weight": 0.9})
    files = [docs / "chatchat" / "test.txt", docs / "chatchat" / "人民检察院行政诉讼监督规则（试行）(2016-04-15).md",
             docs / "mineru" / "zh_union_rules_table_1p.pdf", docs / "gbk" / "iconv-lite_gbkFile_baidu_html.txt"]
    res = e.upload([(p.name, p) for p in files])
    assert all(r.ok for r in res), res
    assert e.wait_idle(600)
    e.delete_document(res[-1].doc_id)  # a deleted document: its id must never come back
    e.wait_idle(60)
    c = e.components
    expected = {
        "docs": [{k: d[k] for k in ("doc_id", "file_name", "content_md5", "chunk_count", "status", "stored_name")}
                 for d in c.docs.all_docs()],
        "chunks": {str(d["doc_id"]): [[ch["chunk_id"], ch["text"]] for ch in c.docs.chunks_of(d["doc_id"])]
                   for d in c.docs.all_docs()},
        "vectors": c.vectors.count(),
        "deleted_doc_id": res[-1].doc_id,
        "search": {q: [r["chunk_id"] for r in e.search(q, 5)["rrf"]] for q in ("监督程序", "ChatGPT 是什么")},
        "answer_chunks": [s["chunk_id"] for s in e.ask_sync("人民检察院如何对行政诉讼实行法律监督")["sources"]],
        "settings": {"chunk_size": e.settings.chunk_size, "bm25_weight": e.settings.bm25_weight},
        "min_similarity": e.settings.min_similarity,  # that release's default for the packaged e5 (0.88)
    }
    e.close()
    Path(out).write_text(json.dumps(expected, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
