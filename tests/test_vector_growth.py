"""The vector route's per-question cost does not scan the index (issue 29, docs/benchmarks.md#vector-growth):
a question over ready documents asks Chroma once for ids + distances and counts nothing — no Chroma count(), no
SQL count of pending or ready chunks — and still returns the exact cosine top-k of the ready chunks."""
from __future__ import annotations

import numpy as np

from tests.shared_data import RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle


@needs(RULES)
def test_a_question_counts_nothing_and_reads_only_ids_and_distances(tmp_path):
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    try:
        c = engine.components
        engine.upload([(RULES.name, RULES)])
        wait_idle(engine)
        query = "人民检察院对行政诉讼的法律监督"
        q = np.asarray(c.models.embedding.embed_model.get_query_embedding(query), dtype=np.float32)
        got = c.vectors.collection.get(include=["embeddings"])
        sims = sorted(((float(np.dot(e, q) / (np.linalg.norm(e) * np.linalg.norm(q))), int(i))
                       for i, e in zip(got["ids"], got["embeddings"])), key=lambda t: (-t[0], t[1]))
        engine.search(query, top_k=5)  # warm-up: retrievers built, the gate background measured

        col, docs = c.vectors.collection, c.docs
        seen: list[str] = []
        real = {"count": col.count, "query": col.query}
        real_docs = {"pending_chunk_count": docs.pending_chunk_count, "ready_chunk_count": docs.ready_chunk_count}

        def spy(name, fn):
            def wrapped(*a, **kw):
                seen.append(name if name != "query" else f"query{sorted(kw.get('include') or [])}")
                return fn(*a, **kw)
            return wrapped

        for name, fn in real.items():
            setattr(col, name, spy(name, fn))
        for name, fn in real_docs.items():
            setattr(docs, name, spy(name, fn))
        try:
            hits = engine.search(query, top_k=5)["vector"]
        finally:
            for name, fn in real.items():
                setattr(col, name, fn)
            for name in real_docs:
                delattr(docs, name)
        assert seen == ["query['distances']"], seen
        assert [h["chunk_id"] for h in hits] == [i for _, i in sims[:5]]
        assert all(abs(h["similarity"] - round(max(0.0, s), 4)) < 2e-4 for h, (s, _) in zip(hits, sims))
    finally:
        engine.close()
