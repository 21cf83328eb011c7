"""配置 tab live validation (issue 18): a refused value is marked red under its field and 保存 is disabled."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from pipeline.settings import GROUPS
from tests.live import launched_ui
from tests.tiny_engine import tiny_engine, tiny_model
from ui.settings_tab import build_settings_tab

FIELDS = [f for fs in GROUPS.values() for f in fs]
N = len(FIELDS)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cfgcheck")
    engine = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"))
    with launched_ui(engine) as ui:
        yield SimpleNamespace(engine=engine, client=ui.client, tmp=tmp)
    engine.close()


def form(live) -> dict:
    return dict(zip(FIELDS, live.client.predict(api_name="/settings_load")[:N]))


def check(live, values: dict, **changes) -> tuple[dict, str]:
    """Through the app's API: the red line per field and the summary beside 保存 (the button itself is not an
    API output; its state is checked on the handler below)."""
    out = live.client.predict(**{**values, **changes}, api_name="/settings_check")
    assert len(out) == N + 1
    shown = {f: u["value"] for f, u in zip(FIELDS, out[:N]) if isinstance(u, dict) and u.get("visible")}
    return shown, out[N]


def test_bad_values_are_red_and_save_is_disabled_until_fixed(live):
    values = form(live)
    shown, note = check(live, values)
    assert shown == {} and note == ""
    before = live.engine.settings.model_dump()

    shown, note = check(live, values, llm_api_url="not a url", chunk_overlap=400, final_top_k=99,
                        reranker_model_path=str(live.tmp / "missing"))
    assert set(shown) == {"llm_api_url", "final_top_k"} and 'data-invalid="2"' in note
    assert "http:// 或 https://" in shown["llm_api_url"] and "color:#b42318" in shown["llm_api_url"]
    assert "1–20" in shown["final_top_k"] and "修正后才能保存" in note and "API 地址" in note
    # cross-field rules are judged once every field is valid on its own
    shown, note = check(live, values, chunk_overlap=400)
    assert set(shown) == {"chunk_overlap"} and "chunk_size" in shown["chunk_overlap"]
    # once the field rules pass, the model path (checked against the disk) is named too
    shown, note = check(live, values, reranker_model_path=str(live.tmp / "missing"))
    assert set(shown) == {"reranker_model_path"} and "config.json" in shown["reranker_model_path"]

    shown, note = check(live, values, llm_api_url="https://api.deepseek.com/v1")
    assert shown == {} and note == ""
    assert live.engine.settings.model_dump() == before  # checking saves nothing


def test_save_button_is_disabled_exactly_while_the_form_is_invalid(live):
    with gr.Blocks():
        tab = build_settings_tab(live.engine)
    handler = tab["handlers"]["settings_check"]
    values = form(live)
    out = handler(**{**values, "llm_api_url": "ftp://x"})
    assert out[N]["interactive"] is False and out[FIELDS.index("llm_api_url")]["visible"] is True
    out = handler(**values)
    assert out[N]["interactive"] is True and not any(u["visible"] for u in out[:N])
