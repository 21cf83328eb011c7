"""The one change hook (pipeline.services.changes) on a real database: what it does for this process and what
another process sharing the database sees. Two `SharedSync`s over one SQLite file stand for two app processes
(the team-mode tests do the same with real app processes on PostgreSQL)."""
from __future__ import annotations

import threading

from pipeline.services.changes import SearchableChanges
from pipeline.services.shared_sync import SharedSync
from store.db import Database
from store.shared_state import KB_GENERATION, SharedState


class Process:
    """One process's view: its refresh passes are counted, its caches cleared counted."""

    def __init__(self, db: Database):
        self.passes = 0
        self.cleared = 0
        self.followed = 0
        self.pass_done = threading.Event()
        self.sync = SharedSync(SharedState(db), on_kb=self._pass, on_config=lambda: None, on_engine=lambda: None)
        self.changes = SearchableChanges(self.sync, clear_caches=self._clear, follow_ingest=self._follow)

    def _pass(self):
        self.passes += 1
        self.pass_done.set()

    def _clear(self):
        self.cleared += 1

    def _follow(self):
        self.followed += 1


def test_a_change_clears_bumps_and_refreshes_here(tmp_path):
    db = Database(tmp_path / "app.db")
    a = Process(db)
    before = SharedState(db).read()[KB_GENERATION]
    a.changes.changed(wait=True)
    assert a.passes == 1 and a.cleared == 1
    assert SharedState(db).read()[KB_GENERATION] == before + 1
    a.sync.check()  # its own bump is not a change from elsewhere: no second pass
    assert a.passes == 1


def test_another_process_notices_the_change(tmp_path):
    db = Database(tmp_path / "app.db")
    a, b = Process(db), Process(db)
    a.changes.changed()
    assert a.pass_done.wait(10)  # a background pass here
    b.sync.check()               # b's next request: the counter moved, b refreshes its indexes
    assert b.pass_done.wait(10) and b.passes == 1
    b.sync.check()
    assert b.passes == 1         # seen once, refreshed once


def test_a_change_already_counted_in_its_transaction_is_not_bumped_again(tmp_path):
    db = Database(tmp_path / "app.db")
    a = Process(db)
    SharedState(db).bump(KB_GENERATION)  # what the ingest queue does in the transaction that marks 就绪
    gen = SharedState(db).read()[KB_GENERATION]
    a.changes.changed(bumped=True, wait=True)
    assert SharedState(db).read()[KB_GENERATION] == gen and a.passes == 1 and a.cleared == 1


def test_an_ingest_here_follows_without_a_full_pass_and_other_processes_notice(tmp_path):
    db = Database(tmp_path / "app.db")
    a, b = Process(db), Process(db)
    for _ in range(3):  # three documents turn 就绪: each moves the counter in its own transaction (jobs.complete)
        a.sync.bumped(KB_GENERATION, SharedState(db).bump(KB_GENERATION))
    a.changes.ingested()  # the queue drained
    assert (a.followed, a.cleared, a.passes) == (1, 1, 0)
    a.sync.check()  # the moves were its own: still no full pass here
    assert a.passes == 0
    b.sync.check()  # the other process rebuilds its indexes
    assert b.pass_done.wait(10) and b.passes == 1


def test_a_move_by_another_process_between_ones_own_is_not_taken_for_ones_own(tmp_path):
    db = Database(tmp_path / "app.db")
    a, b = Process(db), Process(db)
    a.sync.bumped(KB_GENERATION, SharedState(db).bump(KB_GENERATION))
    b.changes.changed(wait=True)  # b's change lands between two of a's
    a.sync.bumped(KB_GENERATION, SharedState(db).bump(KB_GENERATION))
    a.sync.check()
    assert a.pass_done.wait(10) and a.passes == 1  # b's change is picked up by a full pass
