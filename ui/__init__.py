"""Gradio Blocks UI: three tabs over one engine. The UI holds no retrieval or storage logic of its own."""
from __future__ import annotations

import gradio as gr

from pipeline.access import AccessPolicy

from .chat_tab import build_chat_tab
from .header import build_header
from .kb_tab import build_kb_tab
from .settings_tab import build_settings_tab
from .theme import CSS, HEAD_JS

__all__ = ["build_ui"]


def build_ui(engine, policy: AccessPolicy | None = None) -> gr.Blocks:
    policy = policy or AccessPolicy()
    with gr.Blocks(title="中文知识库问答", analytics_enabled=False) as demo:
        badge = build_header(engine)
        with gr.Tabs():
            with gr.Tab("问答", id="qa"):
                build_chat_tab(engine)
            with gr.Tab("知识库", id="kb", visible=True) as kb_tab:
                build_kb_tab(engine, badge)
            with gr.Tab("配置", id="config", visible=True) as cfg_tab:
                build_settings_tab(engine)

        def roles(request: gr.Request):
            user = getattr(request, "username", None) if request else None
            return gr.update(visible=policy.is_kb_admin(user)), gr.update(visible=policy.is_admin(user))

        if policy.enabled:
            demo.load(roles, None, [kb_tab, cfg_tab])
    demo.css_text = CSS  # applied at launch/mount (Gradio 6 takes css/head at launch)
    demo.head_js = HEAD_JS
    return demo
