"""👍 / 👎 in the 问答 tab and the 反馈 admin tab through gradio_client against the live app."""
from __future__ import annotations

import pytest

from pipeline.access.policy import AccessPolicy
from tests.live import live_with_doc
from tests.test_ui_chat import LAST_CONV, QUESTION, LiveUI, run_ask

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    yield from live_with_doc(tmp_path_factory, "uifb")


@pytest.fixture
def engine(live):
    return live.engine


def test_thumbs_down_with_reason_reaches_the_admin_tab(live, engine):
    client = live.client()
    _, final = run_ask(client, QUESTION)
    turn_id = engine.get_conversation(final[LAST_CONV], None)["turns"][-1]["turn_id"]
    status = client.predict(api_name="/feedback_up")
    assert 'data-rating="up"' in str(status) and "第 1 轮" in str(status)
    client.predict(api_name="/feedback_down")  # opens the reason form
    status = client.predict("引用错误", "引用的不是客服那一段", api_name="/feedback_submit")
    assert 'data-rating="down"' in str(status) and "引用错误" in str(status)
    fb = engine.list_feedback("down")["items"][0]
    assert (fb["turn_id"], fb["reason"], fb["comment"]) == (turn_id, "引用错误", "引用的不是客服那一段")

    listing = client.predict("仅 👎", api_name="/feedback_list")
    assert f'data-fb="{fb["fb_id"]}"' in listing and "引用的不是客服那一段" in listing and QUESTION in listing
    assert 'data-rating="up"' not in listing
    path = client.predict("仅 👎", api_name="/feedback_export")
    text = open(path["value"] if isinstance(path, dict) else path, encoding="utf-8").read()
    assert "引用错误" in text

    q, a = client.predict(fb["fb_id"], api_name="/feedback_pick")[:2]
    assert q == QUESTION and "400-800-1234" in a
    status, table = client.predict(fb["fb_id"], q, "客服电话是 400-800-1234（已核实）。", api_name="/verified_create")
    assert "已创建已核实问答" in status and "客服电话是 400-800-1234（已核实）" in table
    assert engine.wait_idle(120)
    qa_id = engine.list_verified()[0]["qa_id"]
    _, again = run_ask(client, QUESTION)
    assert "已核实问答" in again[2] and "（已核实）" in str(again[0])  # sources tag, answer
    table = client.predict(qa_id, api_name="/verified_delete")
    assert "还没有已核实问答" in table


def test_feedback_needs_an_answer_and_admin_tab_needs_the_role(engine):
    r = engine.ask_sync(QUESTION)
    engine.give_feedback(r["turn_id"], None, "down", "其他")
    policy = AccessPolicy.from_args(["boss:pw1", "joe:pw2"], kb_admins=["boss"])
    ui = LiveUI(engine, policy)
    try:
        joe = ui.client(auth=("joe", "pw2"))
        joe.predict(api_name="/new_conversation")
        assert "data-rating" not in str(joe.predict(api_name="/feedback_up"))  # nothing answered yet
        with pytest.raises(Exception, match="知识库管理员"):  # refused on the server: not a KB admin
            joe.predict("全部", api_name="/feedback_list")
        assert "data-fb=" in ui.client(auth=("boss", "pw1")).predict("全部", api_name="/feedback_list")
    finally:
        ui.stop()
