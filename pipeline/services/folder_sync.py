"""文件夹同步: a knowledge base follows one server-side folder (its path set by an admin only).

A sync walks the folder (hidden entries and symlinks skipped, so nothing outside it is read) and compares each
file with what the last sync saw (`folder_file`: size, mtime, md5): a new file is uploaded, a changed one is
uploaded under the same name and so becomes the next version of its document (the ordinary version mechanism:
document name + content hash), an unchanged one is skipped without being read again; a file gone from the
folder deletes its document with every version — or, with the setting folder_sync_delete_mode = flag, is only
reported and its document kept. Files are only read: uploads copy them into the file store.

Every sync leaves a report (added / updated / removed / failed / unchanged with the names, `sync_report`). On an
interval the scheduler of any app process claims the folder (store/sources.py claim_due); each sync runs under
the named lease `folder_sync:<id>` so two processes never sync one folder at once.
"""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import CODE_ENGINE, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.services.audit_log import Actor
from pipeline.services.source_schedule import FollowedSources
from pipeline.services.web_sources import check_interval
from store.files import md5_of
from store.sources import FolderSourceStore

LEASE_S = 3600.0
MAX_FILES = 10_000  # a sync looks at no more files than this (a path pointing at / would walk forever)


def doc_name_for(rel_path: str) -> str:
    """A file's document name: its path inside the folder, slashes as ／ (a name is one path component)."""
    return rel_path.replace("/", "／")


def walk(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of the regular files under `root`, sorted; hidden entries and symlinks
    skipped."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                             and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if name.startswith(".") or p.is_symlink() or not p.is_file():
                continue
            out.append((p.relative_to(root).as_posix(), p))
            if len(out) >= MAX_FILES:
                return out
    return out


class FolderSync(FollowedSources):
    store_type = FolderSourceStore
    kind = "folder source"

    # ---- configuration (the path: admins only — the doors check the role)
    def set_folder(self, kb_id: int, path: str, interval_min: int | None = None, actor: Actor | None = None) -> dict:
        kb_id = self.c.kbs.check(kb_id, fresh=True)
        raw = (path or "").strip()
        if not raw or not os.path.isabs(raw):
            raise EngineError(CODE_VALIDATION, "请填写服务器上文件夹的绝对路径", "path")
        folder = Path(raw).resolve()
        if not folder.is_dir():
            raise EngineError(CODE_VALIDATION, f"文件夹不存在或不可读：{folder}", "path")
        data = self.c.data_dir.resolve()
        if folder == data or data in folder.parents or folder in data.parents:
            raise EngineError(CODE_VALIDATION, "不能同步应用的数据目录（或包含它的文件夹）", "path")
        src = self.store.set(kb_id, str(folder), check_interval(interval_min), actor.name if actor else None,
                             self.clock())
        self.audit.admin(actor, "folder_source.set", {"path": str(folder), "interval_min": src["interval_min"]},
                         [kb_id])
        return self.get(kb_id)

    def remove(self, kb_id: int, actor: Actor | None = None) -> dict:
        """Stop following the folder; the documents it brought stay."""
        src = self._source(kb_id)
        self.store.remove(kb_id)
        self.audit.admin(actor, "folder_source.remove", {"path": src["path"]}, [src["kb_id"]])
        return {"kb_id": kb_id, "removed": True}

    def get(self, kb_id: int) -> dict | None:
        """The folder the knowledge base follows with its last reports (newest first), or None."""
        self.c.kbs.check(kb_id)
        src = self.store.of_kb(kb_id)
        if src is None:
            return None
        src["reports"] = self.store.reports(src["source_id"], limit=10)
        src["last_report"] = src["reports"][0] if src["reports"] else None
        return src

    def _source(self, kb_id: int) -> dict:
        src = self.store.of_kb(self.c.kbs.check(kb_id))
        if src is None:
            raise EngineError(CODE_NO_DOC, "该知识库没有设置同步文件夹")
        return src

    # ---- syncing
    def sync(self, kb_id: int, actor: Actor | None = None) -> dict:
        """同步 now; returns the report. Refused while another process syncs this folder."""
        src = self._source(kb_id)
        report = self._sync(src, "manual", actor)
        if report is None:
            raise EngineError(CODE_ENGINE, "该文件夹正在同步中，请稍后再试")
        return report

    def _run_due_one(self, src: dict) -> None:
        self._sync(src, "interval", None)

    def _sync(self, src: dict, cause: str, actor: Actor | None) -> dict | None:
        lease, owner = f"folder_sync:{src['source_id']}", self.c.ingest.owner
        if not self.c.leases.acquire(lease, owner, LEASE_S):
            return None
        try:
            report = self._walk_and_apply(src, cause, actor)
            report["report_id"] = self.store.add_report(src["source_id"], src["kb_id"], report)
        finally:
            self.c.leases.release(lease, owner)
        self.audit.admin(actor, "folder_source.sync", {
            "path": src["path"], "cause": cause, **{k: len(report[k]) for k in ("added", "updated", "removed", "failed")}},
            [src["kb_id"]])
        return report

    def _walk_and_apply(self, src: dict, cause: str, actor: Actor | None) -> dict:
        report: dict = {"started_at": self.clock(), "cause": cause, "actor": actor.name if actor else None,
                        "added": [], "updated": [], "removed": [], "failed": [], "unchanged": []}
        root = Path(src["path"])
        seen = self.store.files(src["source_id"])
        if not root.is_dir():
            report["failed"].append({"name": str(root), "reason": "文件夹不存在或不可读"})
            report["finished_at"] = self.clock()
            return report  # a folder that vanished (unmounted share) removes nothing
        present = walk(root)
        for rel, path in present:
            try:
                self._one_file(src, rel, path, seen.get(rel), report)
            except EngineError as exc:
                report["failed"].append({"name": rel, "reason": exc.msg})
            except OSError as exc:
                report["failed"].append({"name": rel, "reason": f"读取失败：{exc.strerror or exc}"})
        here = {rel for rel, _ in present}
        mode = self.settings().folder_sync_delete_mode
        for rel, row in seen.items():
            if rel in here or row["state"] == "flagged":
                continue
            if mode == "flag":
                self.store.put_file(src["source_id"], rel, **{**_file_values(row), "state": "flagged"})
                report["removed"].append({"name": rel, "action": "flagged"})
                continue
            if row.get("lineage_id"):
                versions = self.c.docs.versions_of(row["lineage_id"])
                doc = next((d for d in versions if d["active"] == 1), versions[0] if versions else None)
                if doc is not None:
                    try:
                        self.documents.delete(doc["doc_id"], actor)
                    except EngineError as exc:  # 全量重建 running: the next sync deletes it
                        report["failed"].append({"name": rel, "reason": f"未能删除：{exc.msg}"})
                        continue
            self.store.drop_file(src["source_id"], rel)
            report["removed"].append({"name": rel, "action": "deleted"})
        report["finished_at"] = self.clock()
        return report

    def _one_file(self, src: dict, rel: str, path: Path, prev: dict | None, report: dict) -> None:
        st = path.stat()
        if prev is not None and prev["state"] == "ok" and prev["size"] == st.st_size and prev["mtime"] == st.st_mtime:
            report["unchanged"].append(rel)
            return
        md5 = md5_of(path)
        values = {"doc_name": doc_name_for(rel), "size": st.st_size, "mtime": st.st_mtime, "md5": md5,
                  "lineage_id": prev.get("lineage_id") if prev else None}
        if prev is not None and prev["md5"] == md5 and prev["state"] in ("ok", "flagged"):
            self.store.put_file(src["source_id"], rel, **{**values, "state": "ok"})  # touched, not changed
            report["unchanged"].append(rel)
            return
        result = self.documents.upload([(values["doc_name"], path)], src["kb_id"])[0]
        if not result.ok:
            self.store.put_file(src["source_id"], rel, **{**values, "state": "failed"})
            report["failed"].append({"name": rel, "reason": result.msg})
            return
        doc = self.c.docs.get(result.doc_id) if result.doc_id else None
        if doc is not None and not result.existed and self.c.doc_tags is not None:
            self.c.doc_tags.put(doc["doc_id"], "source", str(Path(src["path"]) / rel))  # automatic: the file it is
        if doc is not None and not (result.existed and values["lineage_id"] is None):
            # (an identical file already in the knowledge base under another name is not this file's document:
            # deleting this file must not delete that one)
            values["lineage_id"] = doc["lineage_id"]
        self.store.put_file(src["source_id"], rel, **{**values, "state": "ok"})
        if result.existed:
            report["unchanged"].append(rel)
        elif prev is None or prev.get("lineage_id") is None:
            report["added"].append(rel)
        else:
            report["updated"].append(rel)


def _file_values(row: dict) -> dict:
    return {k: row[k] for k in ("doc_name", "size", "mtime", "md5", "lineage_id")}
