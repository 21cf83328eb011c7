"""READY MEANS SEARCHABLE: a document that reads 就绪 is found through BM25 at once, even mid-queue."""
from __future__ import annotations

import logging
import threading

import pytest

from store.shared_state import KB_GENERATION
from tests.shared_data import NOVEL, RULES, needs
from tests.tiny_engine import real_paragraphs, tiny_engine, tiny_model, wait_idle
from tests.waiting import wait_until

N_SMALL = 30


@pytest.mark.slow
@needs(RULES, NOVEL)
def test_every_document_is_bm25_searchable_as_soon_as_it_reads_ready(tmp_path):
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        paras = real_paragraphs()
        idents, files = {}, []
        for i in range(N_SMALL):
            ident = f"RDY-{i:03d}-Q{(i * 7919) % 1000:03d}"
            p = tmp_path / f"small_{i:02d}.txt"
            # real text around a unique identifier that only this document holds
            p.write_text(f"{paras[i % len(paras)]}\n档案编号 {ident}。\n{paras[(i + 5) % len(paras)]}\n",
                         encoding="utf-8")
            idents[p.name] = ident
            files.append(p)
        long_doc = NOVEL  # a long novel in the queue keeps it from draining

        checked: dict[int, dict] = {}
        stop = threading.Event()
        errors: list[str] = []

        def check(d):
            busy = not engine.wait_idle(0)
            # the BM25 route alone, as retrieval builds it for every question
            bm25 = engine.components.bm25.retriever(engine.components.tokenizer, engine.components.docs.get_chunks, 5)
            hits = bm25.retrieve(idents[d["file_name"]]) if bm25 is not None else []
            found = any(h.node.metadata["doc_id"] == d["doc_id"] for h in hits)
            checked[d["doc_id"]] = {"found": found, "queue_busy": busy}
            if not found:
                errors.append(f"{d['file_name']} reads 就绪 but BM25 misses {idents[d['file_name']]}")

        def watch():
            while not stop.is_set():
                try:
                    for d in engine.components.docs.all_docs():
                        if d["status"] == "ready" and d["doc_id"] not in checked and d["file_name"] in idents:
                            check(d)
                except Exception as exc:  # a crashed watcher must fail the test, not end it quietly
                    errors.append(f"watcher: {type(exc).__name__}: {exc}")
                    return
                stop.wait(0.01)  # the watcher's sampling interval (returns at once when stopped)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # The long novel goes first; the small documents queue behind it and turn ready group by group while
        # the rest of the queue still waits (the old code rebuilt BM25 only once the queue was empty).
        res = engine.upload([(long_doc.name, long_doc)])
        for start in range(0, N_SMALL, 10):
            res += engine.upload([(p.name, p) for p in files[start:start + 10]])
        assert all(r.ok for r in res), [r.msg for r in res if not r.ok]
        wait_idle(engine, 900)
        wait_until(lambda: len(checked) == N_SMALL or errors, 30, 0.05, "the watcher to check every document")
        stop.set()
        watcher.join(10)

        assert not errors, errors
        assert len(checked) == N_SMALL
        # The check ran while the queue was busy (a rebuild at the drain would fail it), served by the segment
        # each document's chunks went into before it turned 就绪.
        assert sum(1 for c in checked.values() if c["queue_busy"]) >= N_SMALL // 3, checked
        wait_until(lambda: engine.components.bm25.settled, 60, 0.1, "merges after the queue drained")
        assert engine.components.bm25.indexed_ids() == engine.components.docs.ready_chunk_ids()
    finally:
        engine.close()


def _found(engine, ident: str) -> set[int]:
    c = engine.components
    bm25 = c.bm25.retriever(c.tokenizer, c.docs.get_chunks, 5)
    return {h.node.metadata["doc_id"] for h in bm25.retrieve(ident)} if bm25 is not None else set()


@needs(RULES)
def test_a_drained_queue_costs_no_full_bm25_build(tmp_path, caplog):
    """Each document's chunks went into a segment of their own before it turned 就绪; the drain only follows what
    else moved (the replaced version out), and what the next start opens is on disk already."""
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        c = engine.components
        paras = real_paragraphs()
        a, b = tmp_path / "a.txt", tmp_path / "b.txt"
        a.write_text(f"{paras[0]}\n档案编号 FLW-101-A。\n{paras[1]}\n", encoding="utf-8")
        assert all(r.ok for r in engine.upload([(a.name, a)]))
        wait_idle(engine)
        first = {s.name for s in c.bm25.view.segments}
        with caplog.at_level(logging.INFO, logger="pipeline.retrieval.bm25"):
            a.write_text(f"{paras[2]}\n档案编号 FLW-202-A。\n{paras[3]}\n", encoding="utf-8")  # a new version
            b.write_text(f"{paras[4]}\n档案编号 FLW-303-B。\n{paras[5]}\n", encoding="utf-8")
            assert all(r.ok for r in engine.upload([(a.name, a), (b.name, b)]))
            wait_idle(engine)
        assert not [r for r in caplog.records if "BM25 rebuilt" in r.getMessage()]  # no full build
        # the first document's segment is in use, or (its entries all replaced by the new version) merged away
        now = {s.name for s in c.bm25.view.segments}
        assert first <= now or [r for r in caplog.records if "merged" in r.getMessage()]
        assert len(now) <= 3 and sum(s.size for s in c.bm25.view.segments) < 40  # small segments, no build of all
        assert c.bm25.indexed_ids() == c.docs.ready_chunk_ids()  # the old version is out, the new ones in
        ready = {d["file_name"]: d["doc_id"] for d in c.docs.all_docs() if d["status"] == "ready" and d["active"] == 1}
        assert _found(engine, "FLW-202-A") >= {ready["a.txt"]} and _found(engine, "FLW-303-B") >= {ready["b.txt"]}
        assert not _found(engine, "FLW-101-A") & {ready["a.txt"]}
        # each 就绪 moved the KB generation in its own transaction; this process took them as its own
        assert engine.services.sync.seen[KB_GENERATION] == c.state.read()[KB_GENERATION]
        assert c.bm25.persisted_ids() >= c.docs.ready_chunk_ids()  # on disk already: what the next start opens
    finally:
        engine.close()
