"""The gate's background and term statistics per knowledge base, and the schema / settings migrations that go
with them (11: one background row per kb_id; 12: the old e5 min_similarity default) on SQLite and PostgreSQL.

The engine part runs the real packaged embedding model over two real-text knowledge bases that share nothing.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from sqlalchemy import text as sql_text

from pipeline.retrieval.gate_background import Background, combine
from pipeline.retrieval.lexical import MergedWeights, TermWeights, merged_weights
from store.config_store import ConfigStore
from store.db import Database
from store.migrations import MIGRATIONS, migrate
from tests.live import backgrounds_measured, engine_with_texts
from tests.test_kb_migration_dialects import target  # noqa: F401, F811 — the fixture: SQLite file or PostgreSQL db
from tests.test_support import DOCS as SHOP_DOCS
from tests.waiting import holds_for, wait_until

# Marked slow: tests on the `two_kbs` fixture and the stale-background test — the packaged e5 model (real quality, minutes on 2 cores).

NOVEL = {
    "三国演义.txt": "刘备听说诸葛亮隐居在隆中卧龙岗，便同关羽、张飞一起前去拜访。第一次去，诸葛亮出游未归；第二次冒着"
                 "大雪前往，又没有见到。第三次刘备斋戒三日，终于见到了诸葛亮。诸葛亮为刘备分析天下形势，提出先取荆州、"
                 "再取益州、联合孙权、北抗曹操的策略，史称隆中对。",
    "赤壁.txt": "曹操率大军南下，孙权与刘备联合抗曹。周瑜用黄盖诈降之计，借东南风火烧曹军战船，曹操大败而回，"
              "天下三分的局面由此形成。",
}


def _bg(sims: list[float], covs: list[float] | None = None) -> Background:
    covs = covs or [0.0] * len(sims)
    v = np.asarray(sims)
    med = float(np.median(v))
    return Background(len(sims), med, 0.01, 0.0, 0.05, 0.0, tuple(sims), tuple(covs))


# --- combining knowledge bases ----------------------------------------------------------------------------------
def test_a_question_over_several_kbs_gets_the_probes_best_over_them():
    a = _bg([0.80, 0.81, 0.90, 0.82, 0.83])
    b = _bg([0.86, 0.70, 0.71, 0.87, 0.72])
    both = combine([a, b, None])  # an empty knowledge base adds nothing
    assert both.probe_sims == (0.86, 0.81, 0.90, 0.87, 0.83)  # per probe: the best cosine over the scope
    assert both.sim_median == 0.86 and both.sim_median >= max(a.sim_median, b.sim_median)
    assert combine([a]) is a and combine([None]) is None
    # a row stored before probe values were kept cannot be merged per probe: the strictest one stands for all
    old = Background(64, 0.95, 0.01, 0.0, 0.05)
    assert combine([a, old]) is old


def test_the_probes_sentence_cosines_combine_per_probe_too():
    a = Background(3, 0.8, 0.01, 0.0, 0.05, 0.0, (0.80, 0.81, 0.90), (0.0,) * 3, 0.85, (0.85, 0.70, 0.92))
    b = Background(3, 0.8, 0.01, 0.0, 0.05, 0.0, (0.86, 0.70, 0.71), (0.0,) * 3, 0.80, (0.80, 0.88, 0.60))
    both = combine([a, b])
    assert both.probe_sents == (0.85, 0.88, 0.92) and both.sent_median == 0.88  # per probe: the best sentence
    # a KB measured before sentence values were kept: the union has none (the gate falls back to its quick score)
    plain = Background(3, 0.8, 0.01, 0.0, 0.05, 0.0, (0.80, 0.81, 0.90), (0.0,) * 3)
    merged = combine([a, plain])
    assert merged.sent_median is None and merged.probe_sims == (0.80, 0.81, 0.90)


def test_idf_over_several_kbs_is_the_idf_of_their_union():
    a = TermWeights({"违约金": 0, "合同": 1}, np.array([1, 9]), 10)
    b = TermWeights({"诸葛亮": 0, "合同": 1}, np.array([5, 1]), 20)
    u = merged_weights([a, b])
    assert isinstance(u, MergedWeights) and u.n == 30
    assert u.df_of("合同") == 10 and u.df_of("违约金") == 1 and u.df_of("诸葛亮") == 5 and u.df_of("梅西") == 0
    assert u.idf("梅西") == u.max_idf > u.idf("违约金") > u.idf("合同")
    assert merged_weights([a]) is a


# --- migrations 11 and 12 on both dialects ----------------------------------------------------------------------
def _release_db(db_target, min_similarity: float, admin_set: bool) -> None:
    """A database at schema 10 as the release before wrote it: every default stored at first start with one
    timestamp (ConfigStore.write_defaults), later admin edits with their own (ConfigStore.save), one gate row."""
    old = Database(db_target, migrate=False)
    assert migrate(old, MIGRATIONS[:10]) == list(range(1, 11))
    cfg = ConfigStore(old)
    cfg.write_defaults({"min_similarity": 0.88 if not admin_set else 0.5, "chunk_size": 300, "rrf_k": 60})
    cfg.save({"chunk_size": 280})  # an admin edit of another key
    if admin_set:
        cfg.save({"min_similarity": min_similarity})  # the admin chose this value (it may well be 0.88)
    with old.transaction() as conn:
        conn.execute(sql_text("INSERT INTO kb_gate_background(id, fingerprint, stats, updated_at)"
                          " VALUES (1, 'm|3|3|64', '{}', '2026-11-30 10:00:00')"))
    old.close()


@pytest.mark.parametrize("admin_set, expected", [(False, 0.82), (True, 0.88)])
def test_old_min_similarity_default_moves_unless_an_admin_set_it(target, admin_set, expected):  # noqa: F811
    _release_db(target, 0.88, admin_set)
    db = Database(target)
    try:
        assert db.applied_migrations == [m.version for m in MIGRATIONS[10:]]
        cfg = ConfigStore(db)
        assert cfg.load()["min_similarity"] == expected and cfg.load()["chunk_size"] == 280
        stamps = cfg.updated_at()
        # the migrated value still reads as an untouched default (the oldest timestamp), so nothing later
        # mistakes it for an admin's choice
        assert (stamps["min_similarity"] == min(stamps.values())) is (not admin_set)
        with db.connect() as conn:  # the old whole-data-dir row is gone; rows are per kb_id now
            assert conn.execute(sql_text("SELECT COUNT(*) FROM kb_gate_background")).scalar_one() == 0
        from store.gate_stats import GateStatsStore

        gs = GateStatsStore(db)
        gs.save(1, "a", {"sim_median": 0.85})
        gs.save(2, "b", {"sim_median": 0.91})
        gs.save(2, "b2", {"sim_median": 0.92})
        assert gs.load(1) == ("a", {"sim_median": 0.85}) and gs.load(2) == ("b2", {"sim_median": 0.92})
        gs.delete(2)
        assert gs.load(2) is None and gs.load(1) is not None
    finally:
        db.close()


def test_a_value_other_than_the_old_default_is_never_touched(tmp_path):
    old = Database(tmp_path / "app.db", migrate=False)
    migrate(old, MIGRATIONS[:10])
    ConfigStore(old).write_defaults({"min_similarity": 0.3, "rrf_k": 60})  # another embedding model's default
    old.close()
    db = Database(tmp_path / "app.db")
    try:
        assert ConfigStore(db).load()["min_similarity"] == 0.3
    finally:
        db.close()


# --- through the engine: two knowledge bases that share nothing -------------------------------------------------
@pytest.fixture(scope="module")
def two_kbs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate-kbs")
    e = engine_with_texts(tmp, SHOP_DOCS)
    kb = e.create_kb("三国")["kb_id"]
    items = []
    for name, text in NOVEL.items():
        p = tmp / name
        p.write_text(text, encoding="utf-8")
        items.append((name, p))
    assert all(r.ok for r in e.upload(items, kb))
    assert e.wait_idle(300)
    backgrounds_measured(e, (1, kb))
    yield e, kb
    e.close()


@pytest.mark.slow
def test_each_kb_gets_its_own_stored_background(two_kbs):
    e, kb = two_kbs
    c = e.components
    a, b = c.gate_background.of(1).current(), c.gate_background.of(kb).current()
    assert a is not None and b is not None and a.probe_sims != b.probe_sims
    for kb_id, bg in ((1, a), (kb, b)):
        fp, stats = c.gate_stats.load(kb_id)
        assert fp == c.gate_background.of(kb_id).fingerprint() and Background.from_dict(stats) == bg
    fp_a, fp_b = c.gate_stats.load(1)[0], c.gate_stats.load(kb)[0]
    assert fp_a.split("|")[1:3] != fp_b.split("|")[1:3]  # each counts its own chunks
    # the term statistics follow the scope too: 诸葛亮 is common in KB B and unknown to KB A
    rs = c.retrieval
    assert rs.term_weights((kb,)).df_of("诸葛亮") > 0 and rs.term_weights((1,)).df_of("诸葛亮") == 0
    assert rs.term_weights((1, kb)).n == rs.term_weights((1,)).n + rs.term_weights((kb,)).n


@pytest.mark.slow
def test_a_question_scoped_to_kb_b_is_gated_with_b_background(two_kbs):
    e, kb = two_kbs
    gb = e.components.gate_background
    b = gb.of(kb).current()
    r = e.ask_sync("刘备第三次去隆中见到了谁？", kb_ids=[kb])
    assert r["trace"]["gate"]["background_median"] == round(b.sim_median, 4)
    assert r["trace"]["gate"]["outcome"] in ("answer", "weak") and "诸葛亮" in r["answer"]
    both = e.ask_sync("刘备第三次去隆中见到了谁？", kb_ids=[1, kb])
    assert both["trace"]["gate"]["background_median"] == round(combine([gb.of(1).current(), b]).sim_median, 4)
    # the shop knowledge base alone: the same question is off-topic there
    assert e.ask_sync("刘备第三次去隆中见到了谁？", kb_ids=[1])["trace"]["gate"]["outcome"] == "refuse"


@pytest.mark.slow
def test_extractive_picker_and_support_check_read_the_sources_kb(two_kbs):
    """The picker's 「未找到」 level and the citation check read the background, IDF and stored vectors of the
    knowledge base the sources come from — not the default one's (whose collection does not hold KB B's chunks)."""
    e, kb = two_kbs
    c = e.components
    final = e.retrieve("刘备第三次去隆中见到了谁？", kb_ids=[kb]).final
    assert final and {n.node.metadata["kb_id"] for n in final} == {kb}
    seen = []
    picker_bg, support_bg = c.picker.background, c.support.background
    c.picker.background = lambda ids: seen.append(("picker", tuple(ids))) or picker_bg(ids)
    c.support.background = lambda ids: seen.append(("support", tuple(ids))) or support_bg(ids)
    try:
        assert c.picker.pick("刘备第三次去隆中见到了谁？", final).found
        vecs = c.support.source_vectors(final)
        assert all(v is not None for v in vecs)  # read from KB B's own collection
        stored = c.kbs.get(kb).vectors.embeddings_of([int(final[0].node.node_id)])
        assert np.allclose(vecs[0], stored[int(final[0].node.node_id)])
        report = c.support.check("第三次刘备终于见到了诸葛亮[1]。", final)
        assert report.sentences and not report.sentences[0].unsupported
    finally:
        c.picker.background, c.support.background = picker_bg, support_bg
    assert ("picker", (kb,)) in seen and ("support", (kb,)) in seen
    assert c.picker.weights_of([kb]).df_of("诸葛亮") > 0  # B's IDF table, where 诸葛亮 is a known word


@pytest.mark.slow
def test_a_change_in_one_kb_remeasures_that_kb_only(two_kbs, tmp_path):
    e, kb = two_kbs
    c = e.components
    c.gate_background.of(1).current(), c.gate_background.of(kb).current()  # both measured and stored
    before_a, before_b = c.gate_stats.load(1), c.gate_stats.load(kb)
    p = tmp_path / "华容道.txt"
    p.write_text("曹操败走华容道，关羽念及旧恩，放走了曹操。", encoding="utf-8")
    assert e.upload([(p.name, p)], kb)[0].ok and e.wait_idle(300)
    # the engine's post-change hook (debounced REFRESH_DELAY_S after the ingest queue drains) re-measures KB B
    wait_until(lambda: c.gate_stats.load(kb)[0] != before_b[0], 120, 0.5, "KB B's gate background to be re-measured")
    after_b = c.gate_stats.load(kb)
    assert after_b[0] != before_b[0] and after_b[1]["probes"] == 64
    assert after_b[0] == c.gate_background.of(kb).fingerprint()
    assert c.gate_stats.load(1) == before_a  # KB A did not change: its row is not measured again
    # deleting the knowledge base deletes its background row
    e.delete_kb(kb)
    assert c.gate_stats.load(kb) is None and c.gate_stats.load(1) == before_a


def test_closing_waits_for_a_running_background_refresh_and_stops_the_rest():
    """Components.close → GateBackgrounds.cancel: a refresh already inside the model is waited for (a daemon
    thread still in onnxruntime at interpreter exit crashes the process), the next knowledge base is not started,
    and nothing is scheduled after close."""
    import threading

    from pipeline.retrieval.gate_background import GateBackgrounds

    started, finished = [], []
    inside = threading.Event()

    class SlowRefresh:
        def __init__(self, kb_id):
            self.kb_id = kb_id

        def refresh_if_changed(self):
            started.append(self.kb_id)
            inside.set()
            time.sleep(0.5)  # a refresh that takes a while (the work this stand-in simulates, not a wait)
            finished.append(self.kb_id)

    bgs = GateBackgrounds(None, SlowRefresh, lambda: [1, 2, 3])
    bgs.refresh_soon(delay=0)
    assert inside.wait(10)
    bgs.cancel()
    assert started == [1] and finished == [1]  # waited for KB 1, KB 2 and 3 never started
    bgs.refresh_soon(delay=0)
    holds_for(lambda: started == [1], 0.2, message="nothing scheduled after close")


@pytest.mark.slow
def test_a_stale_background_from_an_older_release_is_remeasured_after_start_without_a_question(tmp_path):
    import sqlite3

    from pipeline.engine import Engine
    from tests.live import engine_with_texts
    from tests.test_support import DOCS

    e = engine_with_texts(tmp_path, DOCS)
    e.components.gate_background.current()  # measured and stored
    e.close()
    db = sqlite3.connect(tmp_path / "data" / "app.db")
    fp = db.execute("SELECT fingerprint FROM kb_gate_background WHERE kb_id = 1").fetchone()[0]
    assert fp.endswith("|s")
    old = fp[: -len("|s")]  # the row as the previous release stored it (no probe sentence values)
    db.execute("UPDATE kb_gate_background SET fingerprint = ? WHERE kb_id = 1", (old,))
    db.commit()
    e2 = Engine(tmp_path / "data")
    try:
        # re-measured in the background after the load, no question asked
        wait_until(lambda: db.execute("SELECT fingerprint FROM kb_gate_background WHERE kb_id = 1").fetchone()[0] == fp,
                   120, 0.5, "the stale background to be re-measured")
        stats = e2.components.gate_stats.load(1)[1]
        assert stats["sent_median"] is not None and len(stats["probe_sents"]) == stats["probes"]
    finally:
        e2.close()
        db.close()
