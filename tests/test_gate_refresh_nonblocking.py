"""Issue 27, availability 3: a question never waits for the gate background being measured again.

Before: 8 clients asking during a 40-document ingest had p95 21.9 s: the knowledge base's 64-probe background
was re-measured for 22.7 s and the questions arriving meanwhile waited on its lock. Here the refresh is held
inside its run (its save into the real gate-stats store blocks on an Event, with the measurement's lock held)
while a question goes through the live app: it returns, and its trace says the previous background was used.
"""
from __future__ import annotations

import threading

import pytest

from pipeline.retrieval.gate_background import Background, GateBackground
from pipeline.retrieval.gate_features import GateFeatures
from store.gate_stats import GateStatsStore
from tests.waiting import wait_until


def _feats(sim: float) -> GateFeatures:
    return GateFeatures(max_similarity=sim, similarity_gap=0.0, similarity_gap50=0.0, coverage=0.5,
                        phrase_coverage=0.5, coverage_vector=0.5, coverage_mass=0.0, unseen=0.0, agreement=0.0,
                        top_agreement=0.5, bm25_top=0.0, n_terms=3)


@pytest.mark.slow
def test_live_question_uses_the_previous_background_while_the_refresh_runs(tmp_path):
    from tests.live import LiveApp, backgrounds_measured
    from tests.tiny_engine import tiny_engine, tiny_model

    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    live = LiveApp(engine)
    c = engine.components
    stats = c.gate_stats
    real_save = stats.save
    saving, release = threading.Event(), threading.Event()

    def held_save(kb_id, fingerprint, data):  # the refresh has measured, holds its lock, and waits here
        saving.set()
        assert release.wait(120), "the test never released the refresh"
        return real_save(kb_id, fingerprint, data)

    try:
        with live.http() as http:
            def upload(name: str, text: str) -> None:
                r = http.post("/api/kb/documents", files=[("file", (name, text.encode("utf-8")))]).json()
                assert r["data"][0]["ok"], r
                assert engine.wait_idle(120)

            def ask() -> dict:
                r = http.post("/api/qa/ask/sync", json={"question": "星河电子的客服电话是多少？"}, timeout=60).json()
                assert r["code"] == 0, r
                return r["data"]["trace"]["gate"]

            upload("客服.txt", "星河电子的客服电话是 400-800-1234，服务时间为每天 9 点到 21 点。")
            backgrounds_measured(engine)
            first = ask()
            assert first["background_state"] == "current" and first["background_median"] is not None
            fp_before = stats.load(1)[0]

            stats.save = held_save
            upload("保修.txt", "保修政策：智能手表整机保修一年，电池保修六个月。")
            assert saving.wait(120), "the post-ingest refresh did not run"
            # the refresh is in progress (its lock held): the question does not wait for it
            during = ask()
            assert during["background_state"] == "previous", during
            assert during["background_median"] == first["background_median"]
            assert not release.is_set()

            release.set()
            wait_until(lambda: stats.load(1)[0] != fp_before, 60, 0.1, "the refreshed background to be stored")
            after = wait_until(lambda: (g := ask())["background_state"] == "current" and g, 30, 0.2,
                               "a question to use the new background")
            assert after["background_state"] == "current"
    finally:
        release.set()
        stats.save = real_save
        live.stop(close_engine=True)


def test_stale_background_is_not_measured_on_the_question_when_a_refresh_can(tmp_path):
    """GateBackground alone (no scheduler): measured on the question, as before. With a scheduler
    (GateBackgrounds): the question gets the previous one at once and the measurement is scheduled."""
    from sqlalchemy import text

    from tests.test_gate import _db_with_chunks

    db = _db_with_chunks(tmp_path, 1)
    calls: list[str] = []
    snapshot = [object()]
    gb = GateBackground(GateStatsStore(db), lambda: "m", lambda q: calls.append(q) or _feats(0.8),
                        lambda: snapshot[0], probes=["甲", "乙"])
    first = gb.current()
    assert isinstance(first, Background) and first.state == "current" and len(calls) == 2
    scheduled: list[int] = []
    gb.schedule = lambda: scheduled.append(1)
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO kb_chunk(doc_id, chunk_index, text) VALUES (1, 1, 't')"))
    snapshot[0] = object()
    prev = gb.current()
    assert prev.state == "previous" and prev.sim_median == first.sim_median
    assert len(calls) == 2 and scheduled == [1]  # not measured on the question
    gb.refresh_if_changed()  # what the scheduled refresh runs
    assert len(calls) == 4 and gb.current().state == "current"
    db.close()


def test_the_trace_line_says_the_previous_background_was_used():
    from ui.render import render_gate

    gate = {"outcome": "answer", "hit": True, "max_similarity": 0.9, "min_similarity": 0.3, "similarity_above": 3.0,
            "background_median": 0.87, "background_state": "previous"}
    assert "本库背景正在重新测量，本次使用上一次的测量结果" in render_gate(gate)
    assert "重新测量" not in render_gate({**gate, "background_state": "current"})


def test_a_never_measured_kb_gets_a_quick_background_without_waiting_for_the_full_one(tmp_path):
    """No previous background at all (a new knowledge base, or an old data dir's first start): the question scores
    every QUICK_STRIDE-th probe itself and goes on; the full measurement runs in the scheduler's thread — and a
    question arriving while that runs does not wait for it either."""
    from pipeline.retrieval.gate_background import QUICK_STRIDE
    from tests.test_gate import _db_with_chunks

    db = _db_with_chunks(tmp_path, 1)
    probes = [f"探测{i}" for i in range(4 * QUICK_STRIDE)]
    calls: list[str] = []
    in_full, release = threading.Event(), threading.Event()

    def measure(q: str) -> GateFeatures:
        calls.append(q)
        if threading.current_thread().name == "full-refresh" and len(calls) > 4:
            in_full.set()
            assert release.wait(60)
        return _feats(0.8)

    snap = object()
    gb = GateBackground(GateStatsStore(db), lambda: "m", measure, lambda: snap, probes=probes)
    scheduled: list[int] = []
    gb.schedule = lambda: scheduled.append(1)
    first = gb.current()
    assert first.state == "quick" and first.probes == 4 and len(calls) == 4 and scheduled == [1]
    assert calls == probes[::QUICK_STRIDE]
    assert gb.current() is first  # kept for this snapshot: not measured again per question

    full = threading.Thread(target=gb.refresh_if_changed, name="full-refresh")
    gb._cached = None  # as after a restart: nothing cached, nothing stored, and the full measurement running
    full.start()
    try:
        assert in_full.wait(30)
        during = gb.current()  # the lock is held by the full measurement: a quick one again, at once
        assert during.state == "quick" and not release.is_set()
    finally:
        release.set()
        full.join(60)
    done = gb.current()
    assert done.state == "current" and done.probes == len(probes)
    db.close()
