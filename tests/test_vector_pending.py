"""Vector route while a document ingests: not-ready vectors at the very top never crowd out ready hits,
and the query does not read every not-ready vector each time (what broke first under load)."""
from __future__ import annotations

import numpy as np

from store.documents import ChunkRow
from tests.shared_data import RULES, needs
from tests.tiny_engine import real_paragraphs, tiny_engine, tiny_model, wait_idle
from tests.waiting import wait_until


@needs(RULES)
def test_ready_hits_survive_a_crowd_of_not_ready_vectors(tmp_path):
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        c = engine.components
        engine.upload([(RULES.name, RULES)])
        wait_idle(engine)
        # The gate's background (probe questions against the KB, debounced after the queue drains) reads the same
        # collection: let it land first, or the spy below counts its reads too (seen on a busy machine).
        wait_until(lambda: (row := c.gate_stats.load(1)) is not None and row[0] == c.gate_background.of(1).fingerprint(),
                   120, 0.1, "the gate background of the KB to be measured")
        query = "人民检察院对行政诉讼的法律监督"
        q = np.asarray(c.models.embedding.embed_model.get_query_embedding(query), dtype=np.float32)

        def expected_top(k: int) -> list[int]:
            got = c.vectors.collection.get(include=["embeddings", "metadatas"])
            ready = {d["doc_id"] for d in c.docs.all_docs() if d["status"] == "ready"}
            sims = [(float(np.dot(e, q) / (np.linalg.norm(e) * np.linalg.norm(q))), int(i))
                    for i, e, m in zip(got["ids"], got["embeddings"], got["metadatas"]) if m["doc_id"] in ready]
            return [i for _, i in sorted(sims, key=lambda t: (-t[0], t[1]))[:k]]

        want = expected_top(5)
        # A long document mid-ingest: 300 chunk rows written, its vectors (exactly the query's) rank first.
        doc = c.docs.create("long.txt", "txt", 1, "f" * 32, "f" * 32 + ".txt")
        paras = real_paragraphs()
        rows = [ChunkRow(doc["doc_id"], i, paras[i % len(paras)], None, 0, 1, "text", ["x"]) for i in range(300)]
        ids = c.docs.replace_chunks(doc["doc_id"], rows)
        c.vectors.add(ids, [q.tolist()] * len(ids), [r.text for r in rows], doc["doc_id"], "long.txt")

        calls: list[int] = []
        col = c.vectors.collection
        real_query = col.query

        reads: list[tuple[int, int]] = []  # (asked, returned) per read, for the failure message

        def spy(*a, **kw):  # records how many hits each Chroma read asks for; the real query runs
            calls.append(kw.get("n_results"))
            got = real_query(*a, **kw)
            reads.append((kw.get("n_results"), len(got["ids"][0])))
            return got

        def search() -> list[dict]:
            calls.clear()
            reads.clear()
            col.query = spy
            try:
                return engine.search(query, top_k=5)["vector"]
            finally:
                col.query = real_query

        got = search()
        # the message says what each Chroma read returned, and whether the vector route was on at all (a full run
        # once saw no vector hit here; not reproduced alone, even on a loaded machine)
        assert [h["chunk_id"] for h in got] == want and all(h["doc_name"] == RULES.name for h in got), (
            reads, c.models.model_warning, c.docs.pending_chunk_count(1), c.docs.ready_chunk_count(1))
        assert calls[0] == 2 * engine.settings.recall_size and calls[-1] > 300  # it widened past the crowd
        # The same ingest, its vectors now far from the question: one small read, not top_k + 300.
        c.vectors.delete_ids(ids)
        c.vectors.add(ids, [(-q).tolist()] * len(ids), [r.text for r in rows], doc["doc_id"], "long.txt")
        got = search()
        assert [h["chunk_id"] for h in got] == want, reads
        assert calls == [2 * engine.settings.recall_size], reads
    finally:
        engine.close()
