"""The BM25 delta (chunks made ready since the last full build): exact scores, merge, carry-over, fold."""
from __future__ import annotations

import shutil
import threading

import bm25s
import numpy as np
import pytest

from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval import bm25 as bm25_mod
from pipeline.retrieval.bm25 import BM25Index, build_snapshot
from pipeline.retrieval.bm25_delta import DeltaBM25
from tests.shared_data import RULES, require
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def tok():
    return ChineseTokenizer()


@pytest.fixture(scope="module")
def corpus(tok):
    """Paragraphs of a real regulation text: (chunk_id, text, tokens)."""
    paras = [p.strip() for p in require(RULES).read_text(encoding="utf-8").split("\n") if len(p.strip()) > 20]
    assert len(paras) > 60
    return [(i + 1, p, tok(p)) for i, p in enumerate(paras)]


def _full_scores(items, query, k1=1.5, b=0.75):
    bm = bm25s.BM25(k1=k1, b=b, method="lucene")
    bm.index([t or [""] for _, t in items], show_progress=False)
    ids = bm.get_tokens_ids(query)
    return bm.get_scores_from_ids(ids) if ids else np.zeros(len(items))


def test_delta_alone_scores_exactly_like_bm25s(corpus, tok):
    items = [(c, t) for c, _, t in corpus]
    query = tok("人民检察院 行政诉讼 监督 抗诉 检察建议")
    ids, got = DeltaBM25(items).scores(query, lambda _t: 0, 0, 0, 1.5, 0.75)
    assert ids.tolist() == [c for c, _ in items]
    np.testing.assert_allclose(got, _full_scores(items, query), rtol=1e-5, atol=1e-6)


def test_delta_beside_main_scores_as_a_full_build_would(corpus, tok):
    """Delta chunks are scored with main+delta statistics: identical to their scores in one full build."""
    items = [(c, t) for c, _, t in corpus]
    main_items, delta_items = items[:-12], items[-12:]
    snap = build_snapshot(main_items, 1.5, 0.75)
    query = tok("人民法院 裁定 检察院 提出 再审检察建议")
    ids, got = DeltaBM25(delta_items).scores(query, snap.doc_freq, snap.size, snap.total_len, 1.5, 0.75)
    full = _full_scores(items, query)[-12:]
    assert full.max() > 0
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-6)


def _lookup_for(corpus, ready=None):
    texts = {c: t for c, t, _ in corpus}

    def lookup(ids):
        return {i: {"chunk_id": i, "doc_id": i, "chunk_index": 0, "text": texts[i], "page": None, "source": "text",
                    "file_name": f"d{i}.txt", "status": "ready" if ready is None or i in ready else "processing"}
                for i in ids if i in texts}
    return lookup


def test_delta_only_kb_is_searchable_and_respects_status(corpus, tok, tmp_path):
    """A new KB during its first long queue: no main index yet, only the delta."""
    idx = BM25Index(tmp_path / "bm25", lambda: [])
    idx.rebuild(1.5, 0.75)
    assert idx.retriever(tok, _lookup_for(corpus), 5) is None
    target = corpus[7]
    idx.add_ready([(target[0], target[2] + ["zqx-70071"])])
    hits = idx.retriever(tok, _lookup_for(corpus), 5).retrieve("ZQX-70071")
    assert [h.node.node_id for h in hits] == [str(target[0])]
    # added before mark_ready: invisible while the document is still 处理中
    assert idx.retriever(tok, _lookup_for(corpus, ready=set()), 5).retrieve("ZQX-70071") == []


def test_merge_ranks_delta_hits_among_main_hits_and_soft_delete_covers_both(corpus, tok, tmp_path):
    items = [(c, t) for c, _, t in corpus]
    main_items, delta_items = items[:-5], items[-5:]
    idx = BM25Index(tmp_path / "bm25", lambda: main_items)
    idx.rebuild(1.5, 0.75)
    idx.add_ready(delta_items)
    query = corpus[-2][1][:30]  # words of a delta chunk
    hits = idx.retriever(tok, _lookup_for(corpus), 10).retrieve(query)
    assert hits[0].node.node_id == str(corpus[-2][0])
    # the merged order equals one full build's order at the top
    full = _full_scores(items, tok(query))
    assert int(hits[0].node.node_id) == items[int(np.argmax(full))][0]
    idx.soft_delete([corpus[-2][0]])
    hits = idx.retriever(tok, _lookup_for(corpus), 10).retrieve(query)
    assert str(corpus[-2][0]) not in [h.node.node_id for h in hits]
    assert idx.indexed_ids() == {c for c, _ in items} - {corpus[-2][0]}


def _slow_build(idx, ready):
    """Start a rebuild whose token read blocks until released; returns (thread, release event)."""
    gate, reading = threading.Event(), threading.Event()

    def slow_source():
        seen = list(ready)
        reading.set()
        gate.wait(10)
        return seen

    idx.token_source = slow_source
    t = threading.Thread(target=idx.rebuild, args=(1.5, 0.75))
    t.start()
    assert reading.wait(10)
    idx.token_source = lambda: list(ready)
    return t, gate


def test_rebuild_carries_over_what_it_did_not_see(corpus, tok, tmp_path):
    items = [(c, t) for c, _, t in corpus]
    ready = list(items[:20])
    idx = BM25Index(tmp_path / "bm25", lambda: list(ready))
    idx.rebuild(1.5, 0.75)
    t, gate = _slow_build(idx, ready)
    idx.add_ready([items[20]])  # made ready while the build reads: delta first, then the ready set
    ready.append(items[20])
    gate.set()
    t.join(10)
    assert idx.snapshot.size == 20 and idx.delta.chunk_ids == [items[20][0]]
    assert idx.indexed_ids() == {c for c, _ in ready}


def test_a_build_that_started_earlier_never_replaces_a_newer_one(corpus, tok, tmp_path):
    items = [(c, t) for c, _, t in corpus]
    ready = list(items[:20])
    idx = BM25Index(tmp_path / "bm25", lambda: list(ready))
    idx.rebuild(1.5, 0.75)
    t, gate = _slow_build(idx, ready)  # build A reads 20 chunks and stalls
    idx.add_ready([items[20]])
    ready.append(items[20])
    newer = idx.rebuild(1.5, 0.75)  # build B sees 21 and lands first (the delta is folded)
    assert newer.size == 21 and idx.delta.size == 0
    gate.set()
    t.join(10)  # A finishes last with its 20-chunk view: dropped
    assert idx.snapshot is newer
    assert idx.indexed_ids() == {c for c, _ in ready}


def test_big_delta_is_folded_in_the_background(corpus, tok, tmp_path, monkeypatch):
    monkeypatch.setattr(bm25_mod, "FOLD_MIN", 10)
    items = [(c, t) for c, _, t in corpus]
    ready: list = []
    idx = BM25Index(tmp_path / "bm25", lambda: list(ready))
    idx.rebuild(1.5, 0.75)
    for it in items[:9]:
        ready.append(it)
        idx.add_ready([it])
    assert idx.delta.size == 9 and idx.snapshot.size == 0
    ready.append(items[9])
    idx.add_ready([items[9]])
    wait_until(lambda: idx.snapshot.size >= 10, 20, 0.05, "the background fold into the main index")
    assert idx.snapshot.size == 10 and idx.delta.size == 0
    assert idx.indexed_ids() == {c for c, _ in items[:10]}


def _quiet_gate():
    """A `quiet` for follow_ingest that the test opens: (quiet, open_it, asked)."""
    opened, asked = threading.Event(), threading.Event()

    def quiet(stop: threading.Event) -> bool:
        asked.set()
        while not (opened.is_set() or stop.is_set()):
            opened.wait(0.01)
        return opened.is_set()
    return quiet, opened, asked


def test_after_an_ingest_bm25_follows_without_a_build_and_folds_when_quiet(corpus, tok, tmp_path, monkeypatch):
    monkeypatch.setattr(bm25_mod, "FOLD_INLINE_MS", 0.0)  # as a knowledge base whose full build takes seconds
    items = [(c, t) for c, _, t in corpus]
    ready = list(items[:30])
    idx = BM25Index(tmp_path / "bm25", lambda: list(ready))
    first = idx.rebuild(1.5, 0.75)
    # the ingest: two new chunks made ready through the delta, and chunk 1's document replaced (out of the set)
    idx.add_ready(items[30:32])
    ready = ready[1:] + items[30:32]
    view = idx.view
    quiet, opened, asked = _quiet_gate()
    assert idx.follow_ingest({c for c, _ in ready}, quiet) == "followed"
    assert idx.snapshot is first and idx.delta.size == 2  # no full build on the questions' CPU
    assert idx.view is not view  # the gate background and the filter cache key on the pair: they re-read
    assert idx.indexed_ids() == {c for c, _ in ready}  # the replaced chunk is out at once
    hits = idx.retriever(tok, lambda ids: {i: {"chunk_id": i, "doc_id": i, "file_name": "f", "chunk_index": 0,
                                              "text": "t", "status": "ready"} for i in ids}, 50
                         ).retrieve(" ".join(items[0][1][:8]))
    assert items[0][0] not in {h.node.metadata.get("chunk_id", int(h.node.node_id)) for h in hits}
    wait_until(asked.is_set, 10, 0.01, "the fold to wait for a quiet moment")
    assert idx.snapshot is first and idx.persisted_ids() == {c for c, _ in items[:30]}
    opened.set()  # no question for a while: the delta is folded into a persisted full build
    # the build swaps the index in, then persists it
    wait_until(lambda: idx.persisted_ids() == {c for c, _ in ready}, 20, 0.02, "the fold after the quiet moment")
    assert idx.snapshot.size == 31 and idx.delta.size == 0


def _ten_plus_two(corpus, tmp_path):
    """An index built over 10 ready chunks whose ingest then made 2 more ready through the delta:
    (index, the ready set, the first build)."""
    items = [(c, t) for c, _, t in corpus]
    ready = list(items[:10])
    idx = BM25Index(tmp_path / "bm25", lambda: list(ready))
    first = idx.rebuild(1.5, 0.75)
    idx.add_ready(items[10:12])
    ready += items[10:12]
    return idx, ready, first


def test_a_fold_waiting_for_quiet_is_persisted_when_the_app_closes(corpus, tok, tmp_path, monkeypatch):
    monkeypatch.setattr(bm25_mod, "FOLD_INLINE_MS", 0.0)
    idx, ready, _first = _ten_plus_two(corpus, tmp_path)
    quiet, _opened, asked = _quiet_gate()
    idx.follow_ingest({c for c, _ in ready}, quiet)
    wait_until(asked.is_set, 10, 0.01, "the fold to wait for a quiet moment")
    idx.wait_idle(20)  # closing: what the next start (and the offline audit) reads holds the ingest
    assert idx.persisted_ids() == {c for c, _ in ready} and idx.delta.size == 0


def test_a_small_index_folds_at_once_after_the_drain(corpus, tok, tmp_path):
    """A full build predicted under FOLD_INLINE_MS is not deferred: the answers are a full build's at once."""
    idx, ready, first = _ten_plus_two(corpus, tmp_path)
    quiet, _opened, asked = _quiet_gate()
    assert idx.follow_ingest({c for c, _ in ready}, quiet) == "folded"
    assert idx.snapshot is not first and idx.delta.size == 0 and not asked.is_set()
    assert idx.persisted_ids() == {c for c, _ in ready}


def test_a_discarded_index_never_persists_a_waiting_fold(corpus, tok, tmp_path, monkeypatch):
    """Deleting a knowledge base while its fold waits for quiet: the folder removed stays removed."""
    monkeypatch.setattr(bm25_mod, "FOLD_INLINE_MS", 0.0)
    idx, ready, _first = _ten_plus_two(corpus, tmp_path)
    quiet, opened, asked = _quiet_gate()
    idx.follow_ingest({c for c, _ in ready}, quiet)
    wait_until(asked.is_set, 10, 0.01, "the fold to wait for a quiet moment")
    idx.discard(20)
    shutil.rmtree(idx.persist_dir)
    opened.set()
    idx.wait_idle(20)
    assert not idx.persist_dir.exists()
    idx.rebuild(1.5, 0.75)  # even an explicit build
    assert not idx.persist_dir.exists()


def test_a_fold_that_read_the_ready_set_too_early_is_followed_by_another(corpus, tok, tmp_path, monkeypatch):
    """A fold started by the delta's share reads the ready set before the ingest marks its chunks 就绪 (add_ready
    comes first) and carries them over in the delta; the drain's fold must not give up because that one was in
    flight when it wanted to run: the index ends with every ready chunk in a full build."""
    monkeypatch.setattr(bm25_mod, "FOLD_INLINE_MS", 0.0)
    monkeypatch.setattr(bm25_mod, "FOLD_MIN", 5)
    items = [(c, t) for c, _, t in corpus]
    ready = list(items[:10])
    reading, release = threading.Event(), threading.Event()
    hold = {"on": False}

    def source():
        seen = list(ready)
        if hold["on"]:
            reading.set()
            release.wait(20)
        return seen

    idx = BM25Index(tmp_path / "bm25", source)
    idx.rebuild(1.5, 0.75)
    hold["on"] = True
    idx.add_ready(items[10:20])  # past its share: a fold starts and reads the ready set at once
    wait_until(reading.is_set, 10, 0.01, "the share fold to read the ready set")
    hold["on"] = False
    ready += items[10:20]  # marked 就绪 after add_ready, as the ingest does
    quiet, opened, asked = _quiet_gate()
    assert idx.follow_ingest({c for c, _ in ready}, quiet) == "followed"
    wait_until(asked.is_set, 10, 0.01, "the drain's fold to wait for a quiet moment")
    opened.set()
    wait_until(lambda: not idx._fold_waiting, 10, 0.01, "the drain's fold to stop waiting")
    release.set()  # the early fold lands without the new chunks (they stay in the delta)
    wait_until(lambda: idx.settled, 20, 0.02, "a fold that holds the chunks marked ready")
    assert idx.snapshot.size == 20 and idx.persisted_ids() == {c for c, _ in ready}


def test_a_ready_chunk_the_ingest_did_not_add_means_a_full_build(corpus, tok, tmp_path):
    items = [(c, t) for c, _, t in corpus]
    ready = list(items[:10])
    idx = BM25Index(tmp_path / "bm25", lambda: list(ready))
    first = idx.rebuild(1.5, 0.75)
    ready += items[10:12]  # made ready elsewhere: never in this process's delta
    assert idx.follow_ingest({c for c, _ in ready}, lambda stop: True) == "rebuilt"
    assert idx.snapshot is not first and idx.indexed_ids() == {c for c, _ in ready}


def test_full_information_fusion_reads_delta_chunks_like_main_ones(corpus, tok, tmp_path):
    """query_scores / hits / scores_of / coverage (the fusion's per-query reads) cover the delta too."""
    from pipeline.retrieval.bm25 import LiveBM25Retriever

    items = [(c, t) for c, _, t in corpus]
    idx = BM25Index(tmp_path / "bm25", lambda: items[:-5])
    idx.rebuild(1.5, 0.75)
    idx.add_ready(items[-5:])
    live = LiveBM25Retriever(idx, tok, _lookup_for(corpus), 10)
    target = corpus[-2]
    inner, scores = live.query_scores(target[1][:30])
    assert len(scores) == idx.snapshot.size + 5
    top = inner.hits(scores)
    assert top[0].node.node_id == str(target[0])
    got = inner.scores_of(scores, [str(target[0]), str(corpus[0][0]), "999999"])
    assert got[str(target[0])] == pytest.approx(top[0].score) and got["999999"] == 0.0
    assert got[str(corpus[0][0])] == pytest.approx(float(scores[0]))
    assert 0.5 < inner.coverage(target[1][:30], str(target[0])) <= 1.0
    other = next(t for t in corpus[0][2] if t not in target[2] and len(t) > 1)  # indexed, not in the target
    assert inner.coverage(other, str(target[0])) == 0.0
    assert inner.coverage("zzqq", str(target[0])) == 0.0  # no indexed term at all
