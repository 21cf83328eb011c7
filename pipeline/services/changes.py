"""The one change hook: every change of what is searchable goes through `SearchableChanges.changed`.

Ingest done, delete, version restore, rebuild, repair, a verified entry added or removed, a knowledge base
dropped: each of them leaves stored retrievals (重试) that may cite what changed, a BM25 index that no longer
matches the 就绪 chunks, and a gate background measured on the old contents — here and in every other app process
of a team deployment. One call deals with all three, so no call site can forget one of them:

    changes.changed()                 # clear caches, bump kb_generation, refresh BM25 + gate background soon
    changes.changed(wait=True)        # … and return once this process's BM25 holds the change
    changes.changed(bumped=True)      # the counter already moved in the transaction that made the change
    changes.ingested()                # this process's ingest queue drained (no full BM25 build: see below)

`noticed()` is the same refresh for a change another process made (SharedSync saw the counter move): nothing
to bump, the rest alike.
"""
from __future__ import annotations

from collections.abc import Callable

from pipeline.services.shared_sync import SharedSync
from store.shared_state import KB_GENERATION


class SearchableChanges:
    def __init__(self, sync: SharedSync, clear_caches: Callable[[], None], follow_ingest: Callable[[], None]):
        self.sync = sync
        self.clear_caches = clear_caches  # stored retrievals (they may hold changed chunks)
        self.follow_ingest = follow_ingest  # Lifecycle.follow_ingest

    def changed(self, *, wait: bool = False, bumped: bool = False) -> None:
        """What is searchable changed in this process. `wait`: block until the local BM25 follows (the caller's
        response must already see the change); else the refresh runs in the background."""
        self.clear_caches()
        if not bumped:
            self.sync.bump(KB_GENERATION)  # other processes rebuild their BM25 and backgrounds (SharedSync.check)
        # SharedSync's refresh pass rebuilds every knowledge base's BM25 and schedules the gate backgrounds
        self.sync.refresh_kb(wait=None if wait else 0)

    def ingested(self) -> None:
        """This process's ingest queue drained. Each document's chunks reached the local BM25 delta before it
        turned 就绪 and each 就绪 moved the counter in its own transaction (the ingest reports the values to
        SharedSync), so the local BM25 only follows what else moved — no full build on the request path's CPU
        (Lifecycle.follow_ingest). Other processes see the counter and refresh theirs."""
        self.clear_caches()
        self.follow_ingest()
