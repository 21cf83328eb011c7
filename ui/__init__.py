"""Gradio Blocks UI: four tabs (问答, 知识库, 配置, 反馈) over one engine. The UI holds no retrieval or storage
logic of its own.

Gradio 6: theme/css/head are arguments of `launch()` / `gr.mount_gradio_app()`, not of `gr.Blocks()`; use
`ui.page_kwargs()` there. `build_ui()` also leaves them on the Blocks as
`demo.page_kwargs` for callers that only get the Blocks.
"""
from __future__ import annotations

import gradio as gr

from pipeline.access.policy import AccessPolicy

from .audit_log_tab import build_audit_log_tab
from .chat_tab import build_chat_tab
from .feedback_tab import build_feedback_tab
from .header import build_header
from .kb_tab import build_kb_tab
from .settings_tab import build_settings_tab
from .theme import CSS, HEAD_JS, page_kwargs

__all__ = ["build_ui", "page_kwargs", "CSS", "HEAD_JS", "DOCUMENTED_EVENTS"]

# The page's events that other programs may call through Gradio (shown in /gradio_api/info and the page's
# "Use via API"): asking and the two-route search. Both apply the same per-KB permissions as the REST API.
# Every other event is the page's own plumbing and is left out of the API description ("undocumented");
# "private" would hide nothing more — the browser calls every event by index through the same queue — so
# what protects them is the permission check each handler makes (docs/security.md). Programs use /api, /v1
# or /mcp.
DOCUMENTED_EVENTS = frozenset({"ask", "debug_search"})


def build_ui(engine, policy: AccessPolicy | None = None) -> gr.Blocks:
    policy = policy or AccessPolicy()
    with gr.Blocks(title="中文知识库问答", analytics_enabled=False) as demo:
        badge = build_header(engine, policy)
        with gr.Tabs(selected="qa", elem_id="kb-tabs") as tabs:
            with gr.Tab("问答", id="qa", elem_id="tab-qa"):
                chat = build_chat_tab(engine, policy)
            # With logins on, the restricted tabs start hidden and are shown on load to who may use them
            # (Gradio 6.31: updating a rendered Tab to visible=False does not hide it; False → True works).
            shown = not policy.enabled
            with gr.Tab("知识库", id="kb", visible=shown, elem_id="tab-kb") as kb_tab:
                build_kb_tab(engine, badge, policy)
            with gr.Tab("配置", id="config", visible=shown, elem_id="tab-config") as cfg_tab:
                build_settings_tab(engine, policy)
            with gr.Tab("反馈", id="feedback", visible=shown, elem_id="tab-feedback") as fb_tab:
                fb_list, fb_verified, show_fb, show_verified, fb_filter = build_feedback_tab(engine, policy)
            with gr.Tab("审计", id="audit-log", visible=shown, elem_id="tab-audit-log") as audit_tab:
                audit_list, show_audit, audit_inputs = build_audit_log_tab(engine, policy)
        fb_tab.select(show_fb, [fb_filter], [fb_list], api_visibility="private", queue=False)
        fb_tab.select(show_verified, None, [fb_verified], api_visibility="private", queue=False)
        audit_tab.select(show_audit, audit_inputs, [audit_list], api_visibility="private", queue=False)

        chat.goto_kb.click(lambda: gr.Tabs(selected="kb"), None, tabs, api_visibility="private", queue=False)
        # Every page load: the user's conversations → the 历史 list, and the conversation that was open before
        # the reload (its id is the only thing the browser keeps) comes back.
        demo.load(chat.on_load, [chat.last_conv], chat.view, api_name="restore_conversation", queue=False)

        if policy.enabled:
            # Hide what the logged-in user may not use. This is cosmetic: the handlers of those tabs check
            # request.username server-side as well.
            def roles(request: gr.Request):
                user = getattr(request, "username", None) if request else None
                return (gr.Tab(visible=True) if policy.is_kb_admin(user) else gr.skip(),
                        gr.Tab(visible=True) if policy.is_admin(user) else gr.skip(),
                        gr.Tab(visible=True) if policy.is_kb_admin(user) else gr.skip(),
                        gr.Tab(visible=True) if policy.is_admin(user) else gr.skip())

            demo.load(roles, None, [kb_tab, cfg_tab, fb_tab, audit_tab], api_visibility="private", queue=False)
    _leave_out_of_api(demo)
    demo.page_kwargs = page_kwargs()
    return demo


def _leave_out_of_api(demo: gr.Blocks) -> None:
    for fn in demo.fns.values():
        if fn.api_visibility == "public" and fn.api_name not in DOCUMENTED_EVENTS:
            fn.api_visibility = "undocumented"
