"""文件夹同步 through the real engine on a temp folder holding real documents from ../shared/docs (copied into tmp at
test time): a sync adds them, a modified file becomes a new version, a deleted file deletes its document (or,
with folder_sync_delete_mode = flag, is only reported), an unsupported file is a failure in the report, every
report's counts are kept; the folder's files are never modified (size, mtime and hash before and after)."""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.errors import EngineError
from tests.live import LiveApp
from tests.shared_data import DOCS, RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

TEXT = DOCS / "chatchat" / "test.txt"
DOCX = DOCS / "mineru" / "zh_procurement_contract_template.docx"
IMAGE = DOCS / "chatchat" / "ocr_test.jpg"
pytestmark = needs(RULES, TEXT, DOCX, IMAGE)

ADDED_WORD = "翡翠湾同步专用词"
ADMIN, KBA = ("root", "r-pw"), ("kba", "k-pw")


def fingerprint(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file's (size, mtime_ns, sha256): what "files are read, never modified" is checked against."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(folder).as_posix()] = (st.st_size, st.st_mtime_ns,
                                                      hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("folder-sync")
    folder = tmp / "shared-folder"
    (folder / "规则").mkdir(parents=True)
    shutil.copy2(RULES, folder / "规则" / RULES.name)
    shutil.copy2(TEXT, folder / "test.txt")
    shutil.copy2(DOCX, folder / DOCX.name)
    shutil.copy2(IMAGE, folder / "ocr_test.jpg")  # not a supported type: a failure in the report
    (folder / ".hidden.txt").write_text("隐藏文件不应被同步", encoding="utf-8")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    kb = engine.create_kb("共享文件夹")["kb_id"]
    yield engine, folder, kb
    engine.close()


def names(engine, kb: int) -> dict[str, dict]:
    return {d["file_name"]: d for d in engine.list_documents(1, 100, kb_id=kb)["items"]}


def bm25_texts(engine, query: str, kb: int) -> list[str]:
    return [h["text"] for h in engine.search(query, 10, kb_ids=[kb])["bm25"]]


def test_sync_adds_versions_and_removes_files_never_modified(env):
    engine, folder, kb = env
    engine.set_folder_source(kb, str(folder))
    before = fingerprint(folder)

    first = engine.sync_folder(kb)
    assert sorted(first["added"]) == sorted([f"规则/{RULES.name}", "test.txt", DOCX.name])
    assert [f["name"] for f in first["failed"]] == ["ocr_test.jpg"] and first["removed"] == []
    wait_idle(engine)
    docs = names(engine, kb)
    rules_name = f"规则／{RULES.name}"
    assert {rules_name, "test.txt", DOCX.name} <= set(docs) and ".hidden.txt" not in docs
    assert all(docs[n]["status"] == "ready" for n in (rules_name, "test.txt", DOCX.name))
    assert fingerprint(folder) == before  # read, never modified
    meta = engine.components.doc_tags.get(docs["test.txt"]["doc_id"])["metadata"]
    assert meta["source"] == str(folder / "test.txt")  # the file it came from: automatic metadata

    # nothing changed: nothing happens
    again = engine.sync_folder(kb)
    assert again["added"] == again["updated"] == again["removed"] == []
    assert sorted(again["unchanged"]) == sorted([f"规则/{RULES.name}", "test.txt", DOCX.name])

    # a modified file becomes the next version of its document
    target = folder / "test.txt"
    target.write_text(target.read_text(encoding="utf-8") + f"\n新增的一段：{ADDED_WORD}，用于检查同步后的新版本。\n",
                      encoding="utf-8")
    os.utime(target, (time.time() + 5, time.time() + 5))
    changed = fingerprint(folder)
    upd = engine.sync_folder(kb)
    assert upd["updated"] == ["test.txt"] and upd["added"] == [] and upd["removed"] == []
    wait_idle(engine)
    versions = engine.document_versions(names(engine, kb)["test.txt"]["doc_id"])
    assert [v["version"] for v in versions] == [2, 1] and versions[0]["active"] == 1
    assert any(ADDED_WORD in t for t in bm25_texts(engine, ADDED_WORD, kb))

    # a deleted file deletes its document (every version)
    target.unlink()
    rem = engine.sync_folder(kb)
    assert rem["removed"] == [{"name": "test.txt", "action": "deleted"}]
    assert "test.txt" not in names(engine, kb)
    assert not any(ADDED_WORD in t for t in bm25_texts(engine, ADDED_WORD, kb))
    del changed["test.txt"]
    assert fingerprint(folder) == changed

    # the reports are kept, newest first, with their counts
    src = engine.folder_source(kb)
    counts = [(r["added"], r["updated"], r["removed"], r["failed"]) for r in src["reports"]]
    assert counts == [(0, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 1), (3, 0, 0, 1)]
    assert src["last_report"]["report_id"] == rem["report_id"] and src["last_sync_at"] is not None
    actions = [r["action"] for r in engine.audit_log(1, 200, kind="admin")["items"]]
    assert actions.count("folder_source.sync") == 4 and "folder_source.set" in actions


def test_flag_mode_keeps_the_document(env):
    engine, folder, kb = env
    engine.update_settings({"folder_sync_delete_mode": "flag"})
    try:
        (folder / DOCX.name).unlink()
        rep = engine.sync_folder(kb)
        assert rep["removed"] == [{"name": DOCX.name, "action": "flagged"}]
        assert names(engine, kb)[DOCX.name]["status"] == "ready"  # kept
        assert engine.sync_folder(kb)["removed"] == []  # flagged once, not every sync
        shutil.copy2(DOCX, folder / DOCX.name)  # back, same content: no new version
        back = engine.sync_folder(kb)
        assert DOCX.name in back["unchanged"]
        assert len(engine.document_versions(names(engine, kb)[DOCX.name]["doc_id"])) == 1
    finally:
        engine.update_settings({"folder_sync_delete_mode": "delete"})


def test_interval_sync_claimed_once(env):
    engine, folder, kb = env
    engine.set_folder_source(kb, str(folder), interval_min=10)
    fs = engine.folder_sync
    n = len(engine.folder_source(kb)["reports"])
    now = time.time()
    assert fs.run_due(now=now + 60) == 0
    assert fs.run_due(now=now + 601) == 1
    assert fs.run_due(now=now + 601) == 0
    src = engine.folder_source(kb)
    assert len(src["reports"]) == n + 1 and src["last_report"]["cause"] == "interval"


def test_folder_path_checked(env, tmp_path):
    engine, _, kb = env
    for bad in ("relative/path", str(tmp_path / "nope"), str(engine.data_dir), str(engine.data_dir.parent)):
        with pytest.raises(EngineError) as exc:
            engine.set_folder_source(kb, bad)
        assert exc.value.field == "path"


@pytest.mark.slow  # the real app (REST + Gradio page) started in a thread
def test_rest_folder_path_admin_only_sync_kb_admin(env, tmp_path):
    engine, _, kb = env
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy2(TEXT, other / "说明.txt")
    policy = AccessPolicy.from_args([":".join(ADMIN), ":".join(KBA)], [ADMIN[0]], [KBA[0]])
    other_kb = engine.create_kb("REST 文件夹")["kb_id"]  # before the app: the page's picker lists it
    app = LiveApp(engine, policy)
    try:
        with app.http(auth=KBA) as http:
            r = http.put(f"/api/kbs/{other_kb}/folder", json={"path": str(other)})
            assert r.status_code == 403 and r.json()["code"] == 4003  # the path is the admin's to set
        with app.http(auth=ADMIN) as http:
            assert http.put(f"/api/kbs/{other_kb}/folder", json={"path": str(other)}).json()["code"] == 0
        with app.http(auth=KBA) as http:
            rep = http.post(f"/api/kbs/{other_kb}/folder/sync").json()["data"]
            assert rep["added"] == ["说明.txt"]
            got = http.get(f"/api/kbs/{other_kb}/folder").json()["data"]
            assert got["path"] == str(other.resolve()) and got["last_report"]["added"] == 1
        wait_idle(engine)

        # the page: the path is the admin's (a KB admin is refused), 同步 shows the report
        third = tmp_path / "third"
        third.mkdir()
        shutil.copy2(RULES, third / "规则.md")
        with pytest.raises(Exception, match="仅管理员"):
            app.client(auth=KBA).predict(str(third), None, other_kb, api_name="/src_set_folder")
        msg, _, report = app.client(auth=ADMIN).predict(str(third), None, other_kb, api_name="/src_set_folder")
        assert "已保存" in msg and str(third.resolve()) in report
        msg, _, report = app.client(auth=KBA).predict(other_kb, api_name="/src_sync")
        assert "新增 1" in msg and "新增：规则.md" in report  # (a new path starts afresh: 说明.txt stays)
        wait_idle(engine)
    finally:
        app.stop(close_engine=False)


def test_symlinks_and_hidden_entries_never_followed(env, tmp_path):
    """A link inside the folder pointing elsewhere (a file or a directory outside) is not read: only what is
    really in the folder is synced."""
    engine, _, _ = env
    kb = engine.create_kb("链接检查")["kb_id"]
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    shutil.copy2(TEXT, outside / "secret.txt")
    shutil.copy2(TEXT, outside / "deep" / "more.txt")
    folder = tmp_path / "linked"
    (folder / ".git").mkdir(parents=True)
    shutil.copy2(TEXT, folder / ".git" / "config.txt")
    shutil.copy2(TEXT, folder / "real.txt")
    (folder / "link.txt").symlink_to(outside / "secret.txt")
    (folder / "linkdir").symlink_to(outside / "deep", target_is_directory=True)
    engine.set_folder_source(kb, str(folder))
    rep = engine.sync_folder(kb)
    assert rep["added"] == ["real.txt"] and rep["failed"] == []
    wait_idle(engine)
    assert set(names(engine, kb)) == {"real.txt"}
