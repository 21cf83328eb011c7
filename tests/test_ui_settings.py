"""配置 tab through gradio_client against a launched app on a temp data dir (real engine, fake LLM server)."""
from __future__ import annotations

import logging
import re
import urllib.request
from types import SimpleNamespace

import gradio as gr  # noqa: E402
import pytest  # noqa: E402

from pipeline.access.policy import AccessPolicy  # noqa: E402
from pipeline.settings import GROUPS, Settings  # noqa: E402
from tests.live import launch_local, launched_ui  # noqa: E402
from tests.shared_data import DOCS, needs  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow  # the packaged e5 model: the module's engine loads it

TEST_TXT = DOCS / "chatchat" / "test.txt"
FIELDS = [f for fs in GROUPS.values() for f in fs]
N = len(FIELDS)
SECRET = "sk-UItest-7f3c9e1d2b4a8899wxyz"
QUESTION = "什么是 Prompt 工程？"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from pipeline.engine import Engine

    data = tmp_path_factory.mktemp("cfgui") / "data"
    engine = Engine(data, load_async=False)
    engine.update_settings({"llm_api_key": SECRET})
    if TEST_TXT.exists():
        res = engine.upload([("test.txt", TEST_TXT)])
        assert res[0].ok, res[0].msg
        assert engine.wait_idle(300)
    with launched_ui(engine) as ui:
        yield SimpleNamespace(engine=engine, demo=ui.demo, client=ui.client, tmp=data.parent)
    engine.close()


def load(live) -> dict:
    out = live.client.predict(api_name="/settings_load")
    assert len(out) == 2 * N + 1
    return dict(zip(FIELDS, out[:N]))


def save(live, form: dict, **changes):
    vals = {**form, **changes}
    out = live.client.predict(**vals, api_name="/settings_save")
    values = dict(zip(FIELDS, out[:N]))
    errors = dict(zip(FIELDS, out[N:2 * N]))
    return values, errors, out[-1]


def shown_errors(errors: dict) -> dict:
    """Field → message of the error lines that are visible (outputs arrive as update dicts)."""
    out = {}
    for k, v in errors.items():
        if isinstance(v, dict):
            v = v.get("value") if v.get("visible", True) else ""
        if v:
            out[k] = v
    return out


def test_load_shows_masked_key_only(live):
    form = load(live)
    assert form["llm_api_key"] == "****wxyz"
    assert form["final_top_k"] == live.engine.settings.final_top_k
    # the page config every visitor downloads holds no live value at all, let alone the key
    with urllib.request.urlopen(live.demo.local_url + "config") as r:
        config = r.read().decode()
    assert SECRET not in config and "****wxyz" not in config


def test_out_of_range_shows_message_and_saves_nothing(live):
    before = live.engine.settings.model_dump()
    stored = live.engine.components.config.load()
    form = load(live)
    values, errors, banner = save(live, form, final_top_k=99, llm_temperature=1.5, chunk_overlap=400)
    errs = shown_errors(errors)
    assert set(errs) == {"final_top_k", "llm_temperature"}, errs
    assert "最终 Top-K" in errs["final_top_k"] and "1–20" in errs["final_top_k"]
    assert "温度" in errs["llm_temperature"] and "0–1" in errs["llm_temperature"]
    assert "未保存" in banner
    assert live.engine.settings.model_dump() == before
    assert live.engine.components.config.load() == stored
    # cross-field rule and type rule
    _, errors, banner = save(live, form, chunk_overlap=400)
    assert "chunk_overlap 必须小于 chunk_size" in shown_errors(errors)["chunk_overlap"]
    _, errors, _ = save(live, form, recall_size=2.5)
    assert "必须是整数" in shown_errors(errors)["recall_size"]
    assert live.engine.settings.model_dump() == before


@needs(TEST_TXT)
def test_retrieval_param_takes_effect_on_next_question(live):
    form = load(live)
    # min_similarity 0: the question must pass the relevance gate whatever embedding model is installed
    values, errors, banner = save(live, form, final_top_k=2, min_similarity=0.0)
    assert not shown_errors(errors)
    assert "已立即生效" in banner and "最终 Top-K = 2" in banner
    assert "重载引擎" not in banner
    assert live.engine.settings.final_top_k == 2 and values["final_top_k"] == 2
    res = live.engine.ask_sync(QUESTION)
    assert len(res["sources"]) == 2, res
    values, _, banner = save(live, values, final_top_k=3)
    assert len(live.engine.ask_sync(QUESTION)["sources"]) == 3
    values, _, banner = save(live, values)
    assert "没有参数改动" in banner
    save(live, values, final_top_k=form["final_top_k"], min_similarity=form["min_similarity"])
    assert live.engine.settings.min_similarity == form["min_similarity"]


def test_llm_and_chunk_changes_say_reload_and_rebuild(live):
    form = load(live)
    values, errors, banner = save(live, form, llm_model="other-model", chunk_size=400, chunk_overlap=60)
    assert not shown_errors(errors)
    assert "重载引擎" in banner and "模型名称" in banner
    assert "全量重建" in banner and "块大小" in banner
    # back to the previous values
    save(live, values, llm_model=form["llm_model"], chunk_size=form["chunk_size"], chunk_overlap=form["chunk_overlap"])
    assert live.engine.settings.chunk_size == form["chunk_size"]


def test_llm_test_uses_unsaved_form_values(live, fake_llm):
    stored_url = live.engine.settings.llm_api_url
    out = live.client.predict(llm_model="fake-model", llm_api_url=fake_llm.base_url, llm_api_key="sk-form-only-1234",
                              llm_temperature=0.3, llm_timeout=5, api_name="/settings_test_llm")
    assert "成功" in out, out
    assert fake_llm.requests, "no request reached the server"
    req = fake_llm.requests[-1]
    assert req["headers"].get("authorization") == "Bearer sk-form-only-1234"
    assert live.engine.settings.llm_api_url == stored_url  # nothing saved

    fake_llm.mode = "auth"
    out = live.client.predict(llm_model="fake-model", llm_api_url=fake_llm.base_url, llm_api_key="sk-wrong-0000",
                              llm_temperature=0.3, llm_timeout=5, api_name="/settings_test_llm")
    assert "失败" in out and "sk-wrong-0000" not in out
    # masked key in the form → the stored key is used (and never shown)
    fake_llm.mode = "normal"
    out = live.client.predict(llm_model="fake-model", llm_api_url=fake_llm.base_url, llm_api_key="****wxyz",
                              llm_temperature=0.3, llm_timeout=5, api_name="/settings_test_llm")
    assert "成功" in out and SECRET not in out
    assert fake_llm.requests[-1]["headers"].get("authorization") == f"Bearer {SECRET}"


def test_llm_test_unreachable(live):
    out = live.client.predict(llm_model="m", llm_api_url="http://127.0.0.1:9/v1", llm_api_key="",
                              llm_temperature=0.3, llm_timeout=3, api_name="/settings_test_llm")
    assert "失败" in out


def test_model_path_must_hold_config_json(live, tmp_path):
    before = live.engine.settings.model_dump()
    form = load(live)
    missing = tmp_path / "no-such-model"
    _, errors, banner = save(live, form, embedding_model_path=str(missing))
    assert "config.json" in shown_errors(errors)["embedding_model_path"] and "未保存" in banner
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    _, errors, _ = save(live, form, reranker_model_path=str(empty))
    assert "config.json" in shown_errors(errors)["reranker_model_path"]
    assert live.engine.settings.model_dump() == before
    # a directory with config.json is accepted, with the rebuild warning; then put the old value back
    good = tmp_path / "my-embedder"
    good.mkdir()
    (good / "config.json").write_text("{}", encoding="utf-8")
    values, errors, banner = save(live, form, embedding_model_path=str(good))
    assert not shown_errors(errors)
    assert "全量重建" in banner and "重载引擎" in banner
    save(live, values, embedding_model_path=form["embedding_model_path"])
    assert live.engine.settings.embedding_model_path == before["embedding_model_path"]


def test_key_masked_on_every_way_out(live, caplog):
    caplog.set_level(logging.DEBUG)
    form = load(live)
    # saving the mask back keeps the stored key
    values, errors, banner = save(live, form, llm_temperature=0.2)
    assert live.engine.settings.llm_api_key == SECRET and values["llm_api_key"] == "****wxyz"
    # a new key: stored in full, shown masked
    new_key = "sk-another-secret-key-5555mnop"
    values, errors, banner = save(live, values, llm_api_key=new_key)
    assert live.engine.settings.llm_api_key == new_key
    assert values["llm_api_key"] == "****mnop" and new_key not in str(banner)
    assert "****mnop" in load(live)["llm_api_key"]
    # restore-defaults never clears (nor reveals) the key
    out = live.client.predict(emb_path=form["embedding_model_path"], api_name="/settings_defaults_llm")
    assert new_key not in str(out)
    assert live.engine.settings.llm_api_key == new_key
    values, _, _ = save(live, values, llm_api_key=SECRET, llm_temperature=form["llm_temperature"])
    assert SECRET not in str(values) and new_key not in caplog.text and SECRET not in caplog.text


def test_restore_defaults_fills_form_without_saving(live):
    form = load(live)
    save(live, form, recall_size=77, bm25_weight=2.0)
    before = live.engine.settings.model_dump()
    out = live.client.predict(emb_path=live.engine.settings.embedding_model_path,
                              api_name="/settings_defaults_retrieval")
    vals = dict(zip(FIELDS, out[:N]))
    d = live.engine.default_settings(live.engine.settings)
    for f in GROUPS["retrieval"]:
        assert vals[f] == getattr(d, f), f
    assert "点击「保存」后生效" in out[-1]
    assert live.engine.settings.model_dump() == before  # not saved
    save(live, load(live), recall_size=Settings().recall_size, bm25_weight=Settings().bm25_weight)


@pytest.mark.slow
def test_reload_window_answers_2002(live):
    job = live.client.submit(api_name="/settings_reload")
    seen = None

    def window_seen_or_over() -> bool:  # ask once the engine reads reloading; stop when the reload is over
        nonlocal seen
        if live.engine.state == "reloading":
            events = list(live.engine.ask(QUESTION))
            if live.engine.state == "reloading" or events[0].type == "error":
                seen = events
                return True
        return job.done()

    wait_until(window_seen_or_over, 60, 0.002, "the reload window (or the reload's end)")
    final = job.result(timeout=300)
    assert seen is not None, "never observed the reload window"
    assert seen[0].type == "error" and seen[0].data["code"] == 2002
    assert seen[0].data["msg"] == "引擎重载中，请稍后"
    assert re.search(r"引擎已重载，用时 [\d.]+ (秒|ms)", final), final
    assert live.engine.state == "ready"


# ---------------------------------------------------------------------------------------------- roles
class FakeRequest:
    def __init__(self, username):
        self.username = username


def test_only_admins_use_settings(live):
    from ui.settings_tab import build_settings_tab

    policy = AccessPolicy(users={"a": "x", "u": "y"}, admins={"a"}, kb_admins={"a"})
    with gr.Blocks():
        tab = build_settings_tab(live.engine, policy=policy)
    h = tab["handlers"]
    before = live.engine.settings.model_dump()
    form = {k: (v if k != "llm_api_key" else "****wxyz") for k, v in before.items()}
    for req in (FakeRequest("u"), FakeRequest(None), None):
        with pytest.raises(gr.Error):
            h["settings_save"](**{**form, "final_top_k": 5}, request=req)
        with pytest.raises(gr.Error):
            h["settings_test_llm"](**{k: form[k] for k in GROUPS["llm"]}, request=req)
        with pytest.raises(gr.Error):
            next(iter(h["settings_reload"](req)))
        out = h["settings_load"](req)
        assert "无权限" in out[-1] and SECRET not in str(out)
    assert live.engine.settings.model_dump() == before
    out = h["settings_save"](**{**form, "final_top_k": 5}, request=FakeRequest("a"))
    assert "已保存" in out[-1] and live.engine.settings.final_top_k == 5
    h["settings_save"](**{**form, "final_top_k": before["final_top_k"]}, request=FakeRequest("a"))


def test_only_admins_through_login(live):
    """The same, through Gradio's own login (gradio_client auth=) on a Blocks holding just this tab."""
    from tests.live import ui_client
    from ui.settings_tab import build_settings_tab

    policy = AccessPolicy(users={"a": "x", "u": "y"}, admins={"a"}, kb_admins={"a"})
    with gr.Blocks() as demo:
        build_settings_tab(live.engine, policy=policy)
    launch_local(demo, auth=policy.gradio_auth())
    try:
        before = live.engine.settings.model_dump()
        user = ui_client(demo.local_url, auth=("u", "y"))
        out = user.predict(api_name="/settings_load")
        assert "无权限" in out[-1] and SECRET not in str(out)
        with pytest.raises(Exception):  # noqa: B017 — gradio_client wraps the refusal in its own type
            user.predict(**{**before, "llm_api_key": "****wxyz", "final_top_k": 4}, api_name="/settings_save")
        assert live.engine.settings.model_dump() == before
        admin = ui_client(demo.local_url, auth=("a", "x"))
        out = admin.predict(api_name="/settings_load")
        assert "****wxyz" in out and SECRET not in str(out)
    finally:
        demo.close()
