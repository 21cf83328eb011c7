"""Operations on the live data dir: the read-only audit, the repair of derived state, a consistent backup."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import CODE_ENGINE, CODE_VALIDATION, EngineError
from pipeline.ops import backup as backup_ops
from pipeline.ops.audit import KBAuditor
from pipeline.ops.repair import KBRepairer
from pipeline.services.changes import SearchableChanges
from pipeline.services.lifecycle import Lifecycle

if TYPE_CHECKING:
    from pipeline.components import Components


class OperationsService:
    def __init__(self, c: Components, lifecycle: Lifecycle, changes: SearchableChanges, auditor: KBAuditor,
                 repairer: KBRepairer):
        self.c = c
        self.lifecycle = lifecycle
        self.changes = changes
        self.auditor = auditor
        self.repairer = repairer

    def audit(self, check_tokens: bool = True) -> dict:
        """Read-only consistency report (pipeline.ops.audit)."""
        self.lifecycle.require_ready()
        return self.auditor.audit(check_tokens).to_dict()

    def repair(self, wait: bool = False, timeout: float | None = None) -> dict:
        """Repair derived state; with `wait`, requeued documents are re-ingested before the closing audit."""
        self.lifecycle.require_ready()
        if self.lifecycle.rebuild.running:
            raise EngineError(CODE_ENGINE, "全量重建进行中，请完成后再修复")
        with self.lifecycle.lock:
            res = self.repairer.repair(
                wait_requeued=(lambda: self.c.ingest.wait_idle(timeout)) if wait else lambda: None)
        # repaired chunks, vectors or tokens: caches, BM25 and other processes follow — once (a BM25 repair already
        # went through the hook, inside the repair, before its closing audit)
        if res.actions and not any(a["check"] == "bm25_missing" for a in res.actions):
            self.changes.changed()
        return res.to_dict()

    def backup(self, dest: str | Path) -> dict:
        """Consistent backup of the live data dir into `dest` (absolute, new or empty); returns the manifest."""
        c = self.c
        if c.deployment.database_url or c.deployment.chroma_url:
            raise EngineError(CODE_VALIDATION, "团队模式的数据在 PostgreSQL / Chroma 服务中：请用 pg_dump 备份数据库，"
                              "并备份 Chroma 服务的数据目录和共享的 --files-dir（docs/deploy.md）", "dest")
        try:
            return backup_ops.backup(Path(dest), c.data_dir, c.db, c.kbs.all_vectors, c.files, c.write_lock)
        except backup_ops.BackupError as exc:
            raise EngineError(CODE_VALIDATION, exc.msg, exc.field) from None
