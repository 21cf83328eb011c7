"""BM25 in segments: exact scores against one bm25s build, add / replace / delete / merge, and a second index on
the same folder (another process) that follows a change without a full build."""
from __future__ import annotations

import threading

import bm25s
import numpy as np
import pytest

from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval import bm25 as bm25_mod
from pipeline.retrieval.bm25 import BM25Index, LiveBM25Retriever
from pipeline.retrieval.bm25_segments import Segment
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
    """Scores of one bm25s build over `items` (the engine's former index), in items' order."""
    bm = bm25s.BM25(k1=k1, b=b, method="lucene")
    bm.index([t or [""] for _, t in items], show_progress=False)
    ids = bm.get_tokens_ids(query)
    return bm.get_scores_from_ids(ids) if ids else np.zeros(len(items))


def _by_id(index: BM25Index, query: list[str]) -> dict[int, float]:
    v = index.view
    sc = v.scores(query)
    pos = v.positions(v.chunk_ids.tolist())
    return {int(c): float(sc[p]) for c, p in zip(v.chunk_ids, pos) if p >= 0}


class Source:
    """The database side of an index: the ready chunks and their stored tokens."""

    def __init__(self, items):
        self.tokens = {c: t for c, t in items}
        self.ready = set(self.tokens)
        self.asked: list[int | None] = []

    def __call__(self, ids):
        self.asked.append(None if ids is None else len(ids))
        want = sorted(self.ready if ids is None else ids)
        return [(c, self.tokens[c]) for c in want]


def _lookup_for(corpus, ready=None):
    texts = {c: t for c, t, _ in corpus}

    def lookup(ids):
        return {i: {"chunk_id": i, "doc_id": i, "chunk_index": 0, "text": texts.get(i, ""), "page": None,
                    "source": "text", "file_name": f"d{i}.txt",
                    "status": "ready" if ready is None or i in ready else "processing"}
                for i in ids}
    return lookup


QUERIES = ["人民检察院 行政诉讼 监督 抗诉 检察建议", "人民法院 裁定 检察院 提出 再审检察建议", "期限 日内 决定"]


def test_segments_score_exactly_like_one_bm25s_build(corpus, tok, tmp_path):
    """Ten segments, some entries replaced and some dead: every live chunk scores as in one full build over the
    live chunks (statistics summed over segments at question time)."""
    items = [(c, t) for c, _, t in corpus]
    src = Source(items)
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.2, 0.6, set())
    for i in range(0, len(items), max(1, len(items) // 10)):
        idx.add_ready(items[i:i + max(1, len(items) // 10)])
    edited = {items[3][0]: tok("人民检察院 再审检察建议 修改后的文本"), items[40][0]: []}
    idx.replace(list(edited.items()))
    src.tokens.update(edited)
    gone = {items[5][0], items[17][0]}
    src.ready -= gone
    idx.follow_ingest(src.ready)  # the queue drained: entries of chunks not ready are dead from now on
    live = [(c, src.tokens[c]) for c in sorted(src.ready)]
    assert len(idx.view.segments) > 1
    for q in QUERIES:
        query = tok(q)
        full = dict(zip([c for c, _ in live], _full_scores(live, query, 1.2, 0.6)))
        got = _by_id(idx, query)
        assert set(got) == set(full)
        assert max(full.values()) > 0
        np.testing.assert_allclose([got[c] for c in full], list(full.values()), rtol=1e-5, atol=1e-6)


def test_merge_keeps_scores_and_drops_dead_entries(corpus, tok, tmp_path, monkeypatch):
    monkeypatch.setattr(bm25_mod, "MERGE_FACTOR", 3)
    items = [(c, t) for c, _, t in corpus]
    src = Source(items)
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.5, 0.75, set())
    for i in range(0, 30, 3):
        idx.add_ready(items[i:i + 3])
        wait_until(lambda: idx.settled, 30, message="the merge to finish")
    src.ready = {c for c, _ in items[:30]} - {items[4][0]}
    idx.follow_ingest(src.ready)
    wait_until(lambda: idx.settled, 30, message="the merge to finish")
    v = idx.view
    assert len(v.segments) < 10  # merged: ten adds of three chunks left fewer segments
    assert sum(s.size for s in v.segments) < 30 + 3  # dead entries dropped by merges (at most the last few kept)
    live = [(c, src.tokens[c]) for c in sorted(src.ready)]
    query = tok(QUERIES[0])
    full = dict(zip([c for c, _ in live], _full_scores(live, query)))
    got = _by_id(idx, query)
    assert set(got) == set(full)
    np.testing.assert_allclose([got[c] for c in full], list(full.values()), rtol=1e-5, atol=1e-6)
    # what a merge wrote is what the next process opens
    other = BM25Index(tmp_path / "bm25", src)
    other.open(1.5, 0.75, src.ready)
    assert _by_id(other, query) == pytest.approx(got, rel=1e-6)
    assert other.persisted_ids() >= src.ready


def test_a_second_process_follows_a_change_without_a_full_build(corpus, tok, tmp_path):
    """Two indexes on one folder stand for two app processes on a shared files dir: what one adds, replaces or
    deletes, the other opens at its next sync — reading only what changed from the database."""
    items = [(c, t) for c, _, t in corpus]
    src = Source(items[:50])
    a = BM25Index(tmp_path / "bm25", src)
    b = BM25Index(tmp_path / "bm25", src)
    assert a.open(1.5, 0.75, src.ready) == "added 50"  # the first process writes the segment …
    assert b.open(1.5, 0.75, src.ready) == "followed"  # … the second opens it
    assert src.asked == [None, 16, 16]  # every token row read once, by the first; then each open's spot check
    new = (9001, tok("第九千零一条 试用期 工资 不得低于 本单位 相同岗位 最低档 工资") + ["zqx-9001"])
    a.add_ready([new])
    src.tokens[new[0]] = new[1]
    src.ready.add(new[0])
    assert b.sync(src.ready) == "followed"
    assert b.retriever(tok, _lookup_for(corpus + [(9001, "试用期工资", new[1])]), 5).retrieve("ZQX-9001")[0].node.node_id == "9001"
    # an edit in A: B finds the new words and never the old ones
    a.replace([(new[0], tok("试用期 最长 不得 超过 六个月") + ["zqx-edited"])])
    b.sync(src.ready)
    look = _lookup_for(corpus + [(9001, "", [])])
    assert [h.node.node_id for h in b.retriever(tok, look, 5).retrieve("ZQX-EDITED")] == ["9001"]
    assert b.retriever(tok, look, 5).retrieve("ZQX-9001") == []
    # a delete: the chunk leaves the ready set; B masks it at its next sync
    src.ready.discard(items[0][0])
    b.sync(src.ready)
    assert items[0][0] not in b.indexed_ids() and items[1][0] in b.indexed_ids()
    assert src.asked == [None, 16, 16]  # none of this needed a token read: the entries came from A's segments


def test_a_new_segment_is_searchable_elsewhere_after_one_manifest_read(corpus, tok, tmp_path, monkeypatch):
    """`open_listed` (before the ready set is read): another process's new document is found at once, and segments
    merged away there leave the view, so no chunk is counted twice."""
    monkeypatch.setattr(bm25_mod, "MERGE_FACTOR", 3)
    items = [(c, t) for c, _, t in corpus]
    src = Source(items[:20])
    a, b = BM25Index(tmp_path / "bm25", src), BM25Index(tmp_path / "bm25", src)
    a.open(1.5, 0.75, src.ready)
    b.open(1.5, 0.75, src.ready)
    for k in range(20, 32, 2):  # six documents in A: merges happen there
        a.add_ready(items[k:k + 2])
        wait_until(lambda: a.settled, 30, message="A's merges")
    new = (9100, tok("网约车 驾驶员 应当 取得 从业资格证") + ["zqx-9100"])
    a.add_ready([new])
    wait_until(lambda: a.settled, 30, message="A's merges")
    assert b.open_listed() >= 1
    look = _lookup_for(corpus + [(9100, "网约车", new[1])])
    assert [h.node.node_id for h in b.retriever(tok, look, 5).retrieve("ZQX-9100")] == ["9100"]
    held = np.concatenate([s.chunk_ids[al] for s, al in zip(b.view.segments, b.view.alive)])
    assert len(held) == len(set(held.tolist())) == 20 + 12 + 1  # every entry once
    assert {s.name for s in b.view.segments} == {s.name for s in a.view.segments}


def test_ready_chunks_no_segment_holds_are_written_once(corpus, tok, tmp_path):
    """A crash between the ready mark and the segment write (or a data dir of an earlier release): the next sync
    writes a segment for exactly the ready chunks missing, reading only their tokens."""
    items = [(c, t) for c, _, t in corpus]
    src = Source(items[:40])
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.5, 0.75, src.ready)
    for c, t in items[40:43]:
        src.tokens[c] = t
        src.ready.add(c)
    assert idx.sync(src.ready) == "added 3"
    assert src.asked == [None, 16, 3]
    assert idx.indexed_ids() == src.ready


def test_an_unreadable_segment_is_written_again_from_the_stored_tokens(corpus, tok, tmp_path):
    """Segments are not synced to disk: one lost in a crash is dropped from the manifest and its ready chunks are
    written again from the database (the source of truth)."""
    items = [(c, t) for c, _, t in corpus]
    src = Source(items[:30])
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.5, 0.75, src.ready)
    idx.add_ready(items[30:35])
    src.tokens.update(dict(items[30:35]))
    src.ready |= {c for c, _ in items[30:35]}
    broken = idx.view.segments[-1].name
    (tmp_path / "bm25" / "segments" / broken / "docs.npy").write_bytes(b"torn")
    other = BM25Index(tmp_path / "bm25", src)
    assert other.open(1.5, 0.75, src.ready) == "added 5"
    assert other.indexed_ids() == src.ready and broken not in {s.name for s in other.view.segments}


def test_a_document_is_searchable_from_its_ready_mark_and_not_before(corpus, tok, tmp_path):
    idx = BM25Index(tmp_path / "bm25", Source([]))
    idx.open(1.5, 0.75, set())
    assert idx.retriever(tok, _lookup_for(corpus), 5) is None
    target = corpus[7]
    idx.add_ready([(target[0], target[2] + ["zqx-70071"])])
    # added before mark_ready: invisible while the document is still 处理中
    assert idx.retriever(tok, _lookup_for(corpus, ready=set()), 5).retrieve("ZQX-70071") == []
    hits = idx.retriever(tok, _lookup_for(corpus), 5).retrieve("ZQX-70071")
    assert [h.node.node_id for h in hits] == [str(target[0])]
    # a sync during the ingest (another change) keeps the pending entry live
    idx.sync(set())
    assert [h.node.node_id for h in idx.retriever(tok, _lookup_for(corpus), 5).retrieve("ZQX-70071")] == [str(target[0])]


def test_soft_delete_acts_at_once(corpus, tok, tmp_path):
    items = [(c, t) for c, _, t in corpus]
    src = Source(items)
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.5, 0.75, src.ready)
    query = "人民检察院 检察建议"
    before = [h.node.node_id for h in idx.retriever(tok, _lookup_for(corpus), 3).retrieve(query)]
    idx.soft_delete([int(before[0])])
    after = [h.node.node_id for h in idx.retriever(tok, _lookup_for(corpus), 3).retrieve(query)]
    assert before[0] not in after and after[0] == before[1]


def test_params_act_without_a_rebuild(corpus, tok, tmp_path):
    items = [(c, t) for c, _, t in corpus]
    src = Source(items)
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.5, 0.75, src.ready)
    query = tok(QUERIES[1])
    idx.set_params(0.9, 0.3)
    got = _by_id(idx, query)
    full = dict(zip([c for c, _ in items], _full_scores(items, query, 0.9, 0.3)))
    np.testing.assert_allclose([got[c] for c in full], list(full.values()), rtol=1e-5, atol=1e-6)
    assert src.asked == [None, 16]  # the build, the open's spot check; nothing for the new parameters


def test_concurrent_writers_lose_nothing(corpus, tok, tmp_path):
    """Two indexes (processes) adding documents at the same time through one folder: the manifest names every
    segment (the file lock serialises read-modify-write)."""
    items = [(c, t) for c, _, t in corpus]
    src = Source([])
    a, b = BM25Index(tmp_path / "bm25", src), BM25Index(tmp_path / "bm25", src)
    a.open(1.5, 0.75, set())
    b.open(1.5, 0.75, set())
    halves = [items[0:60:2], items[1:60:2]]
    threads = [threading.Thread(target=lambda ix=ix, h=h: [ix.add_ready([it]) for it in h])
               for ix, h in zip((a, b), halves)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_until(lambda: a.settled and b.settled, 30, message="merges to finish")
    src.tokens.update(dict(items[:60]))
    src.ready = {c for c, _ in items[:60]}
    c = BM25Index(tmp_path / "bm25", src)
    assert c.open(1.5, 0.75, src.ready) == "followed"  # nothing missing: every add is in the manifest
    assert c.indexed_ids() == src.ready


def test_a_folder_from_another_database_is_rebuilt_at_open(corpus, tok, tmp_path):
    """Chunk ids belong to one database: segments left by another one (a files dir reused with a fresh database)
    hold other chunks' tokens under the same ids. The open's spot check sees it and writes them anew."""
    items = [(c, t) for c, _, t in corpus]
    old = Source(items[:40])
    BM25Index(tmp_path / "bm25", old).open(1.5, 0.75, old.ready)
    new = Source([(c, t) for (c, _), (_, t) in zip(items[:40], items[40:80])])  # same ids, other texts
    idx = BM25Index(tmp_path / "bm25", new)
    assert idx.open(1.5, 0.75, new.ready) == "rebuilt"
    query = tok(QUERIES[0])
    full = dict(zip(sorted(new.ready), _full_scores(sorted(new.tokens.items()), query)))
    assert _by_id(idx, query) == pytest.approx(full, rel=1e-5, abs=1e-6)


def test_merged_segment_equals_a_fresh_build(corpus):
    items = [(c, t) for c, _, t in corpus[:30]]
    parts = [Segment.build("a", items[:12]), Segment.build("b", items[12:]), Segment.build("c", items[5:8])]
    keep = [np.ones(p.size, dtype=bool) for p in parts]
    keep[0][3] = False
    merged = Segment.merge("m", list(zip(parts, keep)))
    want = [it for k, it in enumerate(items) if k != 3]
    fresh = Segment.build("f", want)
    assert merged.chunk_ids.tolist() == fresh.chunk_ids.tolist()
    assert merged.terms[:] == fresh.terms[:]
    for arr in ("lengths", "indptr", "docs", "tfs"):
        assert np.array_equal(getattr(merged, arr), getattr(fresh, arr)), arr


def test_full_information_fusion_reads_new_segments_like_old_ones(corpus, tok, tmp_path):
    """LiveBM25Retriever hands the fusion one scorer: a chunk's real score is the same whether it came by the
    first build or by a later add."""
    items = [(c, t) for c, _, t in corpus]
    src = Source(items[:-5])
    idx = BM25Index(tmp_path / "bm25", src)
    idx.open(1.5, 0.75, src.ready)
    idx.add_ready(items[-5:])
    live = LiveBM25Retriever(idx, tok, _lookup_for(corpus), 10)
    inner, scores = live.query_scores(QUERIES[1])
    full = _full_scores(items, tok(QUERIES[1]))
    got = inner.scores_of(scores, [str(c) for c, _ in items])
    np.testing.assert_allclose([got[str(c)] for c, _ in items], full, rtol=1e-5, atol=1e-6)
    top = inner.hits(scores)
    assert [h.score for h in top] == sorted((h.score for h in top), reverse=True)
    assert 0 < inner.coverage(QUERIES[1], top[0].node.node_id) <= 1


def test_visible_share_is_the_idf_share_of_the_question_words_some_chunk_holds(corpus, tok, tmp_path):
    """The keyword route sees only the words the knowledge base holds: 「钱撕成两半」 asked of a regulation that
    never says 撕 leaves part of the question invisible to it (fusion.fuse scales the auto weight by this share).
    Checked against the arithmetic of the index's own IDF, for one index and for two knowledge bases together."""
    from pipeline.retrieval.lexical import content_terms
    from pipeline.retrieval.scope import MergedBM25

    items = [(c, t) for c, _, t in corpus]
    idx = BM25Index(tmp_path / "bm25", Source(items))
    idx.open(1.5, 0.75, set(c for c, _ in items))
    live = LiveBM25Retriever(idx, tok, _lookup_for(corpus), 10)
    inner, _ = live.query_scores(QUERIES[0])
    held = {t for _, t in items for t in t}
    assert inner.visible_share("人民检察院行政诉讼监督") == 1.0  # every word is in some chunk
    q = "人民检察院把钱撕成两半扔进垃圾桶"
    terms = content_terms(tok(q))
    unseen = [t for t in terms if t not in held]
    assert unseen and len(unseen) < len(terms)
    w = inner.view.weights()
    want = sum(w.idf(t) for t in terms if t in held) / sum(w.idf(t) for t in terms)
    assert inner.visible_share(q) == pytest.approx(want) and 0 < want < 1
    assert inner.visible_share("撕成两半") == 0.0 and inner.visible_share("吗？") == 1.0  # no content word: all seen
    # two knowledge bases: a word either holds is visible, weighed by the summed statistics
    other = [(10_000 + c, t) for c, t in [(1, tok("钱被撕成两半了"))]]
    idx2 = BM25Index(tmp_path / "bm25b", Source(other))
    idx2.open(1.5, 0.75, {c for c, _ in other})
    merged = MergedBM25([live, LiveBM25Retriever(idx2, tok, _lookup_for(corpus), 10)], 10)
    m_inner, _ = merged.query_scores(q)
    assert inner.visible_share(q) < m_inner.visible_share(q) <= 1.0
