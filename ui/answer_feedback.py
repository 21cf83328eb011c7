"""👍 / 👎 under the chat, acting on the answer whose sources are on screen (the active turn).

👎 opens a small form: a reason (不准确 / 引用错误 / 没回答 / 其他) and an optional comment. Everything is
stored on the server with the turn (engine.give_feedback); the admin sees it in the 反馈 tab.
API names: /feedback_up, /feedback_down, /feedback_submit, /feedback_cancel.
"""
from __future__ import annotations

import gradio as gr

from pipeline.conversation.feedback import REASONS
from pipeline.errors import EngineError

from .guard import request_user
from .render import esc


def _active(turns, active) -> dict | None:
    turns = list(turns or [])
    return turns[active] if isinstance(active, int) and 0 <= active < len(turns) else None


def build_answer_feedback(engine, turns_state: gr.State, active_state: gr.State) -> None:
    with gr.Row(elem_id="kb-fb-row", equal_height=True):
        up = gr.Button("👍 有帮助", size="sm", elem_id="kb-fb-up", min_width=80, scale=0)
        down = gr.Button("👎 没帮助", size="sm", elem_id="kb-fb-down", min_width=80, scale=0)
        status = gr.HTML("", elem_id="kb-fb-status")
    with gr.Group(visible=False, elem_id="kb-fb-box") as box:
        reason = gr.Radio(list(REASONS), label="哪里不好？", elem_id="kb-fb-reason")
        comment = gr.Textbox(label="补充说明（可选，最多 500 字）", max_lines=3, elem_id="kb-fb-text")
        with gr.Row():
            submit = gr.Button("提交反馈", size="sm", variant="primary", elem_id="kb-fb-submit")
            cancel = gr.Button("取消", size="sm", elem_id="kb-fb-cancel")

    def _give(turns, active, request, rating, why=None, text=None):
        t = _active(turns, active)
        if t is None or not t.get("turn_id"):
            gr.Warning("请先提问：反馈针对已完成的回答")
            return None
        try:
            engine.give_feedback(t["turn_id"], request_user(request), rating, why, text)
        except EngineError as exc:
            gr.Warning(exc.msg)
            return None
        n = list(turns).index(t) + 1
        label = "👍 有帮助" if rating == "up" else f"👎 {why or '没帮助'}"
        return f'<span class="kb-fb-done" data-rating="{rating}">已记录第 {n} 轮的反馈：{esc(label)}，谢谢！</span>'

    def on_up(turns, active, request: gr.Request):
        msg = _give(turns, active, request, "up")
        return (msg if msg is not None else gr.skip()), gr.Group(visible=False)

    def on_down(turns, active):
        if _active(turns, active) is None:
            gr.Warning("请先提问：反馈针对已完成的回答")
            return gr.skip(), gr.skip(), gr.skip()
        return gr.Group(visible=True), None, ""

    def on_submit(why, text, turns, active, request: gr.Request):
        if not why:
            gr.Warning("请选择原因")
            return gr.skip(), gr.skip()
        msg = _give(turns, active, request, "down", why, text)
        return (msg, gr.Group(visible=False)) if msg is not None else (gr.skip(), gr.skip())

    up.click(on_up, [turns_state, active_state], [status, box], api_name="feedback_up", queue=False)
    down.click(on_down, [turns_state, active_state], [box, reason, comment], api_name="feedback_down", queue=False)
    submit.click(on_submit, [reason, comment, turns_state, active_state], [status, box],
                 api_name="feedback_submit", queue=False)
    cancel.click(lambda: gr.Group(visible=False), None, [box], api_name="feedback_cancel", queue=False)
    # a new answer / another turn on screen: the last feedback note no longer applies
    active_state.change(lambda: ("", gr.Group(visible=False)), None, [status, box], api_visibility="private",
                        queue=False)
