"""READY MEANS SEARCHABLE: a document that reads 就绪 is found through BM25 at once, even mid-queue."""
from __future__ import annotations

import threading

import pytest

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
            in_main = set(engine.components.bm25.snapshot.chunk_ids.tolist())
            busy = not engine.wait_idle(0)
            # the BM25 route alone, as retrieval builds it for every question
            bm25 = engine.components.bm25.retriever(engine.components.tokenizer, engine.components.docs.get_chunks, 5)
            hits = bm25.retrieve(idents[d["file_name"]]) if bm25 is not None else []
            found = any(h.node.metadata["doc_id"] == d["doc_id"] for h in hits)
            chunk_ids = {c["chunk_id"] for c in engine.components.docs.chunks_of(d["doc_id"])}
            checked[d["doc_id"]] = {"found": found, "via_delta": not (chunk_ids & in_main), "queue_busy": busy}
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
        # The check ran while the queue was busy, served by the delta (so it would fail with the old behaviour).
        assert sum(1 for c in checked.values() if c["via_delta"] and c["queue_busy"]) >= N_SMALL // 3, checked
        # Once drained, the full build has folded the delta in.
        assert engine.components.bm25.delta.size == 0
        assert engine.components.bm25.indexed_ids() == engine.components.docs.ready_chunk_ids()
    finally:
        engine.close()
