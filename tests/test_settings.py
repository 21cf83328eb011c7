"""Settings contract (SRS F1.1): defaults, ranges, masking, persistence in SQLite sys_config, updated_at."""
from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from pipeline.settings import (
    GROUPS,
    Settings,
    SettingsError,
    effect_of,
    flatten_grouped,
    mask_secret,
    merge_update,
    validate_settings,
)
from store.config_store import ConfigStore
from store.db import Database
from tests.waiting import wait_until

# Marked slow: the engine restart test — the packaged e5 model (real quality, minutes on 2 cores).


def test_defaults_match_the_contract():
    s = Settings()
    assert (s.llm_model, s.llm_api_url, s.llm_api_key, s.llm_temperature) == ("", "", "", 0.3)
    assert (s.recall_size, s.final_top_k, s.rrf_k, s.bm25_k1, s.bm25_b) == (50, 6, 60, 1.5, 0.75)
    assert (s.min_similarity, s.chunk_size, s.chunk_overlap, s.rerank_candidates) == (0.3, 300, 50, 20)
    assert s.embedding_model_path == "models/bge-small-zh-v1.5"
    assert s.reranker_model_path == "models/bge-reranker-base"
    assert set(s.grouped()) == set(GROUPS)


@pytest.mark.parametrize("field,bad,range_text", [
    ("llm_temperature", 1.5, "0–1"), ("recall_size", 0, "1–200"), ("recall_size", 201, "1–200"),
    ("final_top_k", 21, "1–20"), ("rrf_k", 0, "≥ 1"), ("bm25_k1", 3.5, "0–3"), ("bm25_b", -0.1, "0–1"),
    ("min_similarity", 2, "0–1"), ("chunk_size", 49, "50–2000"), ("chunk_size", 2001, "50–2000"),
])
def test_out_of_range_is_refused_naming_field_and_range(field, bad, range_text):
    with pytest.raises(SettingsError) as ei:
        validate_settings({field: bad})
    assert field in ei.value.errors and range_text in ei.value.errors[field]


def test_type_errors_and_cross_field_rule():
    with pytest.raises(SettingsError) as ei:
        validate_settings({"recall_size": "many"})
    assert "整数" in ei.value.errors["recall_size"]
    with pytest.raises(SettingsError) as ei:
        validate_settings({"chunk_size": 100, "chunk_overlap": 100})
    assert "chunk_overlap" in str(ei.value)
    with pytest.raises(SettingsError):
        merge_update(Settings(), {"no_such_key": 1})


def test_masking_and_masked_save_keeps_key():
    assert mask_secret("sk-1234567890abcd") == "****abcd" and mask_secret("") == ""
    s = Settings(llm_api_key="sk-1234567890abcd")
    assert s.grouped()["llm"]["llm_api_key"] == "****abcd"
    assert "sk-1234567890abcd" not in str(s.grouped())
    new, changed = merge_update(s, {"llm_api_key": "****abcd", "llm_temperature": 0.5})
    assert new.llm_api_key == "sk-1234567890abcd" and changed == ["llm_temperature"]
    new, changed = merge_update(s, {"llm_api_key": "sk-new"})
    assert new.llm_api_key == "sk-new" and changed == ["llm_api_key"]


def test_grouped_payload_and_effects():
    flat = flatten_grouped({"retrieval": {"final_top_k": 3}, "llm": {"llm_model": "m"}})
    assert flat == {"final_top_k": 3, "llm_model": "m"}
    with pytest.raises(SettingsError):
        flatten_grouped({"retrieval": {"llm_model": "x"}})  # wrong group
    eff = effect_of(["final_top_k", "llm_model", "chunk_size"])
    assert eff == {"immediate": ["final_top_k"], "need_reload": ["llm_model"], "need_rebuild": ["chunk_size"]}


def test_persistence_and_updated_at(tmp_path):
    db = Database(tmp_path / "app.db")
    store = ConfigStore(db)
    defaults = Settings().model_dump()
    assert sorted(store.write_defaults(defaults)) == sorted(defaults)
    assert store.write_defaults(defaults) == []  # second start writes nothing
    before = store.updated_at()
    # TODO(clock): advance db.clock instead; until then let the wall clock pass the stored stamp (µs ISO text)
    wait_until(lambda: datetime.now(UTC).isoformat(timespec="microseconds") > max(before.values()), 5, 0.001,
               "the clock to pass the stored updated_at")
    assert store.save({"final_top_k": 6, "recall_size": 80}) == ["recall_size"]  # 6 is unchanged
    after = store.updated_at()
    assert after["recall_size"] > before["recall_size"]
    assert after["final_top_k"] == before["final_top_k"]
    db.close()
    # survives a restart (a new connection to the same file)
    assert ConfigStore(Database(tmp_path / "app.db")).load()["recall_size"] == 80


@pytest.mark.slow
def test_engine_settings_survive_restart_and_never_log_key(tmp_path, caplog):
    from pipeline.engine import Engine

    caplog.set_level(logging.DEBUG)
    e = Engine(tmp_path / "data")
    assert e.settings.min_similarity == e.default_settings().min_similarity  # calibrated for the model
    r = e.update_settings({"retrieval": {"final_top_k": 4}, "llm": {"llm_api_key": "sk-verysecret-9876"}})
    assert r["immediate"] == ["final_top_k"] and r["need_reload"] == ["llm_api_key"]
    with pytest.raises(SettingsError):
        e.update_settings({"retrieval": {"final_top_k": 99}})
    assert e.settings.final_top_k == 4  # nothing saved from the invalid change
    e.close()
    e2 = Engine(tmp_path / "data")
    try:
        assert e2.settings.final_top_k == 4 and e2.settings.llm_api_key == "sk-verysecret-9876"
        assert e2.health()["llm"] and "sk-verysecret" not in str(e2.health())
    finally:
        e2.close()
    assert "sk-verysecret-9876" not in caplog.text


def test_field_metadata_is_the_one_source():
    from pipeline.settings import IMMEDIATE_FIELDS, LABELS, REBUILD_FIELDS, RELOAD_FIELDS, field_meta, range_text

    for name in Settings.model_fields:
        meta = field_meta(name)
        assert meta["group"] in GROUPS and name in GROUPS[meta["group"]]
        assert meta["effect"] in ("immediate", "reload", "rebuild") and LABELS[name] == meta["label"]
        assert Settings.model_fields[name].description
    assert IMMEDIATE_FIELDS | RELOAD_FIELDS | REBUILD_FIELDS == set(Settings.model_fields)
    assert range_text("recall_size") == "1–200" and range_text("rrf_k") == "≥ 1" and range_text("llm_model") == ""


def test_readme_settings_table_matches_the_fields():
    from tools.docs.settings_table import BEGIN, END, README, table

    text = README.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md lost its settings-table markers"
    assert text.split(BEGIN)[1].split(END)[0].strip() == table(), "run: python -m tools.docs.settings_table --write"
