"""Settings validated for what they mean (issue 18): URLs, printable strings, unknown groups/fields — named."""
from __future__ import annotations

import logging

import pytest

from pipeline.settings import SettingsError, flatten_grouped, merge_update, settings_from_stored, validate_settings
from store.config_store import ConfigStore
from store.db import Database
from tests.live import LiveApp
from tests.tiny_engine import tiny_engine, tiny_model

GOOD_URLS = ["", "http://127.0.0.1:8000/v1", "https://api.deepseek.com/v1", "http://localhost:11434/v1",
             "  https://api.example.com/v1  ", "http://[::1]:8080/v1"]
BAD_URLS = ["not a url", "api.deepseek.com/v1", "ftp://example.com/v1", "http://", "https:///v1",
            "http://exa mple.com/v1", "http://host:99999/v1", "http://host:port/v1", "javascript:alert(1)",
            "file:///etc/passwd"]


@pytest.mark.parametrize("url", GOOD_URLS)
def test_http_urls_with_a_host_are_accepted(url):
    assert validate_settings({"llm_api_url": url}).llm_api_url == url.strip()


@pytest.mark.parametrize("url", BAD_URLS)
def test_other_urls_are_refused_naming_the_field(url):
    with pytest.raises(SettingsError) as ei:
        validate_settings({"llm_api_url": url})
    assert list(ei.value.errors) == ["llm_api_url"]
    assert "http:// 或 https://" in ei.value.errors["llm_api_url"] and "API 地址" in ei.value.errors["llm_api_url"]


@pytest.mark.parametrize("field", ["llm_model", "llm_api_key", "embedding_model_path", "reranker_model_path"])
def test_control_characters_and_overlong_strings_are_refused(field):
    for bad, part in (("abc\ndef", "控制字符"), ("a\x00b", "控制字符"), ("x" * 501, "过长")):
        with pytest.raises(SettingsError) as ei:
            validate_settings({field: bad})
        assert part in ei.value.errors[field]


def test_unknown_groups_and_fields_are_all_named():
    with pytest.raises(SettingsError) as ei:
        merge_update(validate_settings({}), flatten_grouped({"llmm": {"llm_model": "x"}, "retrieval": {"top": 1}}))
    assert "top" in ei.value.errors and "分组 retrieval 中没有" in ei.value.errors["top"]
    with pytest.raises(SettingsError) as ei:
        flatten_grouped({"retrieval": {"top": 1, "llm_model": "m"}, "ocr": 3})
    assert set(ei.value.errors) == {"top", "llm_model", "ocr"}
    assert "应在 llm" in ei.value.errors["llm_model"] and "必须是对象" in ei.value.errors["ocr"]
    with pytest.raises(SettingsError) as ei:
        merge_update(validate_settings({}), flatten_grouped({"llmm": {"llm_model": "x"}}))
    assert "未知分组 llmm" in ei.value.errors["llmm"]


def test_a_stored_value_that_no_longer_validates_falls_back_alone():
    s, dropped = settings_from_stored({"llm_api_url": "not a url", "final_top_k": 4, "recall_size": 999,
                                       "retired_setting": 1})
    assert (s.llm_api_url, s.final_top_k, s.recall_size) == ("", 4, 50)
    assert set(dropped) == {"llm_api_url", "recall_size"}


def test_api_put_refuses_bad_values_with_code_1001_and_saves_nothing(tmp_path):
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"))
    live = LiveApp(engine)
    try:
        with live.http() as c:
            before = c.get("/api/config").json()["data"]
            for body, field in (({"llm": {"llm_api_url": "not a url"}}, "llm_api_url"),
                                ({"llm": {"llm_api_url": "ftp://x.y"}}, "llm_api_url"),
                                ({"llm": {"llm_model": "qwen\n2.5"}}, "llm_model"),
                                ({"models": {"reranker_model_path": "models/\x00x"}}, "reranker_model_path"),
                                ({"nosuch": {"a": 1}}, "nosuch"),
                                ({"llm": {"llm_modle": "x"}}, "llm_modle"),
                                ({"retrieval": {"final_top_k": 0}}, "final_top_k")):
                r = c.put("/api/config", json=body)
                assert r.status_code == 400 and r.json()["code"] == 1001, (body, r.text)
                assert r.json()["data"]["field"] == field and field in r.json()["msg"]
            assert c.get("/api/config").json()["data"] == before
            r = c.put("/api/config", json={"llm": {"llm_api_url": " http://127.0.0.1:9/v1 ", "llm_model": "m"}})
            assert r.json()["code"] == 0 and r.json()["data"]["config"]["llm"]["llm_api_url"] == "http://127.0.0.1:9/v1"
            r = c.post("/api/config/test-llm", json={"llm": {"llm_api_url": "not a url"}}).json()["data"]
            assert r["ok"] is False and "http:// 或 https://" in r["msg"]
    finally:
        live.stop(close_engine=True)


def test_engine_start_keeps_other_settings_when_one_stored_value_is_invalid(tmp_path, caplog):
    """A URL saved before URLs were checked must not reset every setting at the next start."""
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"), final_top_k=4)
    engine.close()
    db = Database(tmp_path / "data" / "app.db")
    ConfigStore(db).save({"llm_api_url": "not a url"})
    db.close()
    caplog.set_level(logging.ERROR)
    from pipeline.engine import Engine

    e = Engine(tmp_path / "data")
    try:
        assert e.settings.final_top_k == 4 and e.settings.llm_api_url == ""
        assert "llm_api_url" in caplog.text
    finally:
        e.close()
