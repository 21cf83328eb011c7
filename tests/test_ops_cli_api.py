"""Audit / repair / backup through the REST API (roles), the CLIs against a live app and offline, the 审计 button."""
from __future__ import annotations

import shutil

import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import LiveApp
from tests.shared_data import DOCS, RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle
from tools.ops import audit as audit_cli
from tools.ops import backup as backup_cli

pytestmark = needs(RULES, DOCS / "gbk" / "iconv-lite_gbkFile_baidu_html.txt")
USERS = AccessPolicy.from_args(["boss:pw-b", "kb:pw-k", "reader:pw-r"], admins=["boss"], kb_admins=["kb"])


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    engine.upload([(p.name, p) for p in (RULES, DOCS / "gbk" / "iconv-lite_gbkFile_baidu_html.txt")])
    wait_idle(engine)
    app = LiveApp(engine, USERS)
    app.tmp = tmp
    yield app
    app.stop(close_engine=True)


def add_orphan(engine, cid: int = 910001) -> None:
    engine.components.vectors.collection.add(ids=[str(cid)], embeddings=[[0.3] * engine.components.models.embedding.dim], documents=["孤儿"],
                                  metadatas=[{"doc_id": 777, "doc_name": "ghost"}])


def test_api_roles_and_envelopes(live):
    with live.http() as c:
        assert c.get("/api/kb/audit", auth=("reader", "pw-r")).json()["code"] == 4003
        r = c.get("/api/kb/audit", auth=("kb", "pw-k")).json()
        assert r["code"] == 0 and r["data"]["ok"] and r["data"]["counts"]["ready_docs"] == 2
        assert c.get("/api/kb/audit", params={"quick": "true"}, auth=("kb", "pw-k")).json()["data"]["tokens_checked"] is False
        assert c.post("/api/kb/repair", auth=("kb", "pw-k")).json()["code"] == 4003
        assert c.post("/api/kb/backup", json={"dest": "/tmp/x"}, auth=("kb", "pw-k")).json()["code"] == 4003
        add_orphan(live.engine)
        r = c.get("/api/kb/audit", auth=("boss", "pw-b")).json()["data"]
        assert r["problems"] == 1 and r["findings"][0]["check"] == "orphan_vectors"
        r = c.post("/api/kb/repair", auth=("boss", "pw-b")).json()
        assert r["code"] == 0 and r["data"]["before"] == 1 and r["data"]["after"] == 0
        for dest, msg in (("relative/dir", "绝对路径"), (str(live.engine.data_dir / "bk"), "数据目录")):
            r = c.post("/api/kb/backup", json={"dest": dest}, auth=("boss", "pw-b"))
            assert r.status_code == 400 and r.json()["code"] == 1001 and msg in r.json()["msg"]
            assert r.json()["data"]["field"] == "dest"
        assert c.post("/api/kb/backup", json={"dest": "/x", "oops": 1}, auth=("boss", "pw-b")).json()["code"] == 1001


def test_audit_cli_against_the_live_app(live, capsys, monkeypatch):
    monkeypatch.setenv("KBQA_PASSWORD", "pw-b")
    args = ["--url", live.url, "--user", "boss"]
    assert audit_cli.main(args) == 0
    assert "一致" in capsys.readouterr().out
    add_orphan(live.engine, 910002)
    assert audit_cli.main(args) == 1
    assert "910002" in capsys.readouterr().out
    assert audit_cli.main(args + ["--repair"]) == 0
    out = capsys.readouterr().out
    assert "修复前 1 项问题，修复后 0 项" in out and "删除孤立向量" in out
    monkeypatch.setenv("KBQA_PASSWORD", "wrong")
    assert audit_cli.main(args) == 2
    assert audit_cli.main(["--url", "http://127.0.0.1:9"]) == 2  # nothing listens there


def test_offline_tools_refuse_a_data_dir_the_app_holds(live, capsys, tmp_path):
    assert audit_cli.main(["--data-dir", str(live.engine.data_dir)]) == 2
    assert "正被运行中的应用" in capsys.readouterr().err
    assert backup_cli.main([str(tmp_path / "bk"), "--data-dir", str(live.engine.data_dir)]) == 1
    assert "正被运行中的应用" in capsys.readouterr().err
    assert not (tmp_path / "bk").exists()


def test_kb_tab_audit_and_repair_buttons(live):
    add_orphan(live.engine, 910003)
    kb = live.client(auth=("kb", "pw-k"))
    html = kb.predict(api_name="/kb_audit")
    assert 'data-audit="problems"' in html and 'data-check="orphan_vectors"' in html and "910003" in html
    with pytest.raises(Exception, match="仅管理员"):
        kb.predict(api_name="/kb_repair")
    boss = live.client(auth=("boss", "pw-b"))
    html = boss.predict(api_name="/kb_repair")
    assert "修复前 1 项 → 修复后 0 项" in html and 'data-audit="ok"' in html
    with pytest.raises(Exception, match="无权限"):
        live.client(auth=("reader", "pw-r")).predict(api_name="/kb_audit")


def test_offline_audit_and_repair_of_a_stopped_app(tmp_path, capsys):
    """No app running: the audit opens the stores only; --repair starts the engine, repairs, waits."""
    data = tmp_path / "data"
    engine = tiny_engine(data, tiny_model(tmp_path / "tiny"))
    engine.upload([(RULES.name, RULES)])
    wait_idle(engine)
    engine.close()
    assert audit_cli.main(["--data-dir", str(data)]) == 0
    shutil.rmtree(data / "bm25")  # killed before the BM25 index was written
    assert audit_cli.main(["--data-dir", str(data), "--json"]) == 1
    assert '"bm25_missing"' in capsys.readouterr().out
    assert audit_cli.main(["--data-dir", str(data), "--repair"]) == 0
    assert audit_cli.main(["--data-dir", str(data)]) == 0
    assert audit_cli.main(["--data-dir", str(tmp_path / "nope")]) == 2
