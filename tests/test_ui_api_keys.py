"""配置 → 开放接口 through gradio_client against the live app with logins: an admin creates a key (the secret
comes back once, works on /v1 at once), the list shows its prefix and never the secret, revoking it stops it at
once; a non-admin is refused by the server."""
from __future__ import annotations

import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import LiveApp
from tests.tiny_engine import tiny_engine, tiny_model

pytestmark = pytest.mark.slow  # ~1 min: the Gradio client round trips on 2 shared cores
USERS = AccessPolicy.from_args(["boss:pw-b", "alice:pw-a"], admins=["boss"])


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-keys")
    app = LiveApp(tiny_engine(tmp / "data", tiny_model(tmp_path_factory.getbasetemp() / "tiny-bert")), USERS)
    yield app
    app.stop(close_engine=True)


def value(out):
    """An output as gradio_client returns it: a gr.update comes as a dict with its value."""
    return out.get("value") if isinstance(out, dict) else out


def test_create_list_revoke(live):
    client = live.client(auth=("boss", "pw-b"))
    shown, table, status = client.predict("报表脚本", "reader", [1], 0, None, api_name="/keys_create")
    assert shown.get("visible") is True
    secret = value(shown)
    assert secret.startswith("kbqa-") and "只显示这一次" in status
    assert secret[:12] in table and secret not in table and "默认知识库" in table and 'data-state="有效"' in table
    with live.http() as http:
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    listed = value(client.predict(api_name="/keys_list")[0])
    assert secret not in str(listed) and secret[:12] in listed
    key_id = live.engine.list_api_keys()[0]["key_id"]
    table, status, cleared = client.predict(key_id, api_name="/keys_revoke")
    assert 'data-state="已吊销"' in table and "立即失效" in status and not value(cleared)
    with live.http() as http:
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    _, _, bad = client.predict("", "reader", [], 0, None, api_name="/keys_create")
    assert "名称不能为空" in bad


def test_non_admin_is_refused(live):
    client = live.client(auth=("alice", "pw-a"))
    with pytest.raises(Exception, match="无权限"):
        client.predict("偷偷", "admin", [], 0, None, api_name="/keys_create")
    assert all(k["name"] != "偷偷" for k in live.engine.list_api_keys())
