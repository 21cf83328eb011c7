"""The evaluation harness answers on the gate background of the whole cached knowledge base.

A cached KB is built by an engine that closes right after its last ingest, before the debounced background
refresh: its stored background was measured on its first few chunks (2–16 on the dev-set caches). A copy opened
as it is answered with that one ('previous') until a refresh that yields to every question finished — at a moment
that depended on the load (tools/eval/kb_cache.settle_gate_background). Real components: a tiny-model engine, its
SQLite gate-stats store, the copy `open_copy` makes.
"""
from __future__ import annotations

import json

from store.migrations import DEFAULT_KB_ID
from tests.tiny_engine import real_paragraphs, tiny_engine, tiny_model, wait_idle


def test_a_copy_of_a_cached_kb_answers_on_the_background_of_all_its_chunks(tmp_path):
    from tools.eval.devsets import DevSet
    from tools.eval.kb_cache import open_copy

    root, name = tmp_path / "cache", "tiny"
    cached = root / name
    engine = tiny_engine(cached, tiny_model(tmp_path / "model"))
    try:
        src = tmp_path / "src"
        src.mkdir()
        paras = real_paragraphs()[:6]
        files = []
        for i, text in enumerate(paras):
            (src / f"{i}.txt").write_text(text, encoding="utf-8")
            files.append((f"{i}.txt", src / f"{i}.txt"))
        engine.upload(files[:1])
        wait_idle(engine)
        gb = engine.components.gate_background.of(DEFAULT_KB_ID)
        early = gb.refresh()  # measured on the first document only, as a build leaves it
        engine.upload(files[1:])
        wait_idle(engine)
        engine.components.gate_background.cancel()  # no refresh may run (or be running) after this
        stats = engine.components.gate_stats
        stats.save(DEFAULT_KB_ID, "measured-on-the-first-document", early.to_dict())  # the refresh never ran
    finally:
        engine.close()
    (cached / "key_to_doc.json").write_text(json.dumps({}), encoding="utf-8")
    (cached / "READY").write_text("ok\n")

    copy, _ = open_copy(root, DevSet(name, "folder", "unused"), tmp_path / "copy")
    try:
        gb = copy.components.gate_background.of(DEFAULT_KB_ID)
        stored_fp, _ = copy.components.gate_stats.load(DEFAULT_KB_ID)
        assert stored_fp == gb.fingerprint()  # measured on the copy as it is, before any question
        assert f"|{copy.components.docs.counts()['chunks']}|" in stored_fp
        bg = gb.current()
        assert bg.state == "current" and bg.probes == len(gb.probes)
    finally:
        copy.close()
    # the cached dir itself is never written: its stale row is still there
    from store.db import Database
    from store.gate_stats import GateStatsStore

    db = Database(cached / "app.db")
    try:
        assert GateStatsStore(db).load(DEFAULT_KB_ID)[0] == "measured-on-the-first-document"
    finally:
        db.close()
