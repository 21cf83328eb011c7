"""问答 tab (F3) with the browser-side history (F4).

Every answer comes from `engine.ask(question, retry=...)`, an Event stream (pipeline.events); this module only
turns those events into streamed Gradio updates. Retry (F3-5) reuses the engine's cached retrieval for the
same question (`retry=True`). History replays never call the engine.

API names (gradio_client): /ask, /retry, /history_list, /history_replay, /history_delete,
/history_clear_ask, /history_clear_confirm, /history_clear_cancel.
"""
from __future__ import annotations

import html
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipeline.access import AccessPolicy
from pipeline.errors import CODE_ENGINE, CODE_LLM

from . import history as hist
from .guard import request_user
from .render import answer_markdown, render_sources, render_stage, render_trace, trace_marks

log = logging.getLogger(__name__)

STREAM_MIN_INTERVAL = 0.05  # seconds between streamed answer updates (the engine may emit many tiny deltas)
RETRYABLE = {CODE_LLM, CODE_ENGINE}
KB_HINT_ADMIN = "请到「知识库」标签页上传相关资料后再提问。"
KB_HINT_USER = "（知识库由管理员维护，请联系管理员补充相关资料。）"


@dataclass
class ChatTab:
    chatbot: gr.Chatbot
    question: gr.Textbox
    send: gr.Button
    retry: gr.Button
    goto_kb: gr.Button
    stage: gr.HTML
    sources: gr.HTML
    trace: gr.HTML
    history: gr.BrowserState
    history_list: gr.Radio
    refresh_history: Any  # fn(history, request) -> Radio update, for demo.load


def _messages(question: str, answer_md: str | None) -> list[dict]:
    msgs = [{"role": "user", "content": html.escape(question, quote=False)}]
    if answer_md is not None:
        msgs.append({"role": "assistant", "content": answer_md})
    return msgs


def build_chat_tab(engine, policy: AccessPolicy | None = None) -> ChatTab:
    policy = policy or AccessPolicy()
    data_dir = getattr(engine, "data_dir", "data")

    with gr.Row(equal_height=False):
        with gr.Column(scale=6, min_width=360):
            stage = gr.HTML(render_stage(None), elem_id="kb-stage")
            chatbot = gr.Chatbot(
                label="问答", elem_id="kb-chatbot", height=460, feedback_options=None, buttons=["copy"],
                placeholder="向知识库提问，回答会标注引用编号 [n]，点击编号可定位右侧的来源。",
                group_consecutive_messages=False)
            with gr.Row():
                retry = gr.Button("重试", visible=False, elem_id="kb-retry", size="sm", variant="secondary")
                goto_kb = gr.Button("前往「知识库」补充资料", visible=False, elem_id="kb-goto-kb", size="sm")
            with gr.Row(equal_height=True):
                question = gr.Textbox(show_label=False, placeholder="输入问题，按 Enter 发送", lines=1, max_lines=6,
                                      scale=8, elem_id="kb-question", autofocus=True)
                send = gr.Button("发送", variant="primary", scale=1, min_width=90, elem_id="kb-send")
            with gr.Accordion("检索过程", open=False, elem_id="kb-trace-acc"):
                trace = gr.HTML(render_trace(None), elem_id="kb-trace")
        with gr.Column(scale=4, min_width=300):
            gr.HTML("<h3 style='margin:4px 0'>引用来源</h3>")
            sources = gr.HTML(render_sources(None), elem_id="kb-sources")
            with gr.Accordion("历史记录（保存在本浏览器，最近 50 条）", open=False, elem_id="kb-history-acc"):
                history_list = gr.Radio(choices=[], value=None, show_label=False, elem_id="kb-history-list",
                                        interactive=True)
                with gr.Row():
                    del_btn = gr.Button("删除所选", size="sm", elem_id="kb-history-delete")
                    clear_btn = gr.Button("清空全部", size="sm", variant="stop", elem_id="kb-history-clear")
                with gr.Row(visible=False, elem_id="kb-history-confirm") as confirm_row:
                    confirm_text = gr.Markdown("")
                    confirm_yes = gr.Button("确认清空", size="sm", variant="stop", elem_id="kb-history-clear-yes")
                    confirm_no = gr.Button("取消", size="sm", elem_id="kb-history-clear-no")

    history = gr.BrowserState([], storage_key=hist.storage_key(data_dir), secret=hist.storage_secret(data_dir))
    current = gr.State(None)  # the question being / last answered (for 重试)

    # ------------------------------------------------------------------ the answer stream
    outputs = [chatbot, stage, sources, trace, send, retry, goto_kb, question, history, current]

    def _kb_hint(user):
        return KB_HINT_ADMIN if policy.is_kb_admin(user) else KB_HINT_USER

    def run(q: str, history_value, user, retry_flag: bool) -> Iterator[tuple]:
        skip = gr.skip()
        q = (q or "").strip()
        if not q:
            gr.Warning("请输入问题")
            yield (skip,) * len(outputs)
            return
        answer, sources_list, trace_data = "", None, None
        # The previous answer area clears, the button disables, the stage indicator starts.
        yield (_messages(q, "…"), render_stage("recall"), render_sources(None, empty_text="检索中…"),
               render_trace(None), gr.Button(interactive=False), gr.Button(visible=False),
               gr.Button(visible=False), "", skip, q)
        last = 0.0
        try:
            for e in engine.ask(q, retry=retry_flag):
                if e.type == "stage":
                    yield (skip, render_stage(e.data.get("phase")), skip, skip, skip, skip, skip, skip, skip, skip)
                elif e.type == "trace":
                    trace_data = dict(e.data)
                    yield (skip, skip, skip, render_trace(trace_data), skip, skip, skip, skip, skip, skip)
                elif e.type == "delta":
                    answer += e.data.get("text", "")
                    now = time.monotonic()
                    if now - last >= STREAM_MIN_INTERVAL:
                        last = now
                        yield (_messages(q, answer_markdown(answer, **trace_marks(trace_data))), skip, skip, skip,
                               skip, skip, skip, skip, skip, skip)
                elif e.type == "sources":
                    sources_list = e.data.get("sources") or []
                elif e.type == "done":
                    d = e.data
                    no_answer = bool(d.get("no_answer"))
                    elapsed = d.get("elapsed_ms")
                    hint = _kb_hint(user)
                    if trace_data is not None and "support_summary" in d:  # 检索过程 counts unsupported citations
                        trace_data.update(support=d["support_summary"], support_sentences=d.get("support") or [])
                    rec = hist.make_record(q, answer, sources_list, trace_data, elapsed, user,
                                           no_answer=no_answer, mode=d.get("mode"))
                    shown = answer_markdown(answer, **trace_marks(trace_data))
                    if no_answer and not policy.is_kb_admin(user):  # the fixed text says "go to 知识库"
                        shown += f"\n\n*{hint}*"
                    yield (_messages(q, shown),
                           render_stage(done_ms=elapsed, note="未命中相关资料" if no_answer else None),
                           render_sources(sources_list, no_answer=no_answer, kb_hint=hint),
                           render_trace(trace_data, elapsed), gr.Button(interactive=True), gr.Button(visible=False),
                           gr.Button(visible=no_answer and policy.is_kb_admin(user)), skip,
                           hist.add(history_value, rec), q)
                    return
                elif e.type == "error":
                    yield _error_update(q, answer, e.data.get("code"), e.data.get("msg") or "未知错误", trace_data)
                    return
        except Exception as exc:  # an engine bug must not leave the page stuck with a disabled button
            log.exception("answer stream failed")
            yield _error_update(q, answer, CODE_ENGINE, f"内部错误：{exc}", trace_data)
            return
        # The stream ended without done/error (should not happen): unlock the page.
        yield _error_update(q, answer, CODE_ENGINE, "回答意外中断", trace_data)

    def _error_update(q, answer, code, msg, trace_data):
        skip = gr.skip()
        partial = (answer_markdown(answer) + "\n\n---\n") if answer else ""
        can_retry = code in RETRYABLE
        bubble = f"{partial}⚠️ **回答失败**：{html.escape(str(msg), quote=False)}"
        if can_retry:
            bubble += "\n\n可点击下方「重试」按钮重新生成。"
        return (_messages(q, bubble), render_stage(error=f"{msg}（错误码 {code}）"), skip,
                render_trace(trace_data) if trace_data else skip, gr.Button(interactive=True),
                gr.Button(visible=can_retry), gr.Button(visible=False), skip, skip, q)

    def ask(question_text: str, history_value: list, request: gr.Request):
        yield from run(question_text, history_value, request_user(request), retry_flag=False)

    def retry_fn(current_q: str, history_value: list, request: gr.Request):
        yield from run(current_q or "", history_value, request_user(request), retry_flag=True)

    gr.on([send.click, question.submit], ask, [question, history], outputs, api_name="ask",
          concurrency_limit=4, concurrency_id="kb-ask", show_progress="hidden")
    retry.click(retry_fn, [current, history], outputs, api_name="retry", concurrency_limit=4,
                concurrency_id="kb-ask", show_progress="hidden")

    # ------------------------------------------------------------------ history
    def refresh_history(history_value: list, request: gr.Request):
        return gr.Radio(choices=hist.choices(history_value, request_user(request)), value=None)

    def replay(rec_id: str, history_value: list, request: gr.Request):
        rec = hist.find(history_value, rec_id, request_user(request))
        if rec is None:
            return (gr.skip(),) * 7
        q = str(rec.get("question") or "")
        no_answer = bool(rec.get("no_answer"))
        hint = _kb_hint(request_user(request))
        tr = rec.get("trace") if isinstance(rec.get("trace"), dict) else None
        shown = answer_markdown(str(rec.get("answer") or ""), **trace_marks(tr))
        if no_answer and not policy.is_kb_admin(request_user(request)):
            shown += f"\n\n*{hint}*"
        srcs = rec.get("sources") if isinstance(rec.get("sources"), list) else []
        srcs = [s for s in srcs if isinstance(s, dict)]
        return (_messages(q, shown),
                render_stage(done_ms=rec.get("elapsed_ms"), note=f"历史记录 {rec.get('time', '')}"),
                render_sources(srcs, no_answer=no_answer, kb_hint=hint), render_trace(tr, rec.get("elapsed_ms")),
                gr.Button(visible=False), gr.Button(visible=False), q)

    def delete_selected(rec_id: str, history_value: list, request: gr.Request):
        if not rec_id:
            gr.Warning("请先在列表中选择一条历史记录")
            return gr.skip()
        return hist.delete(history_value, rec_id, request_user(request))

    def ask_clear(history_value: list, request: gr.Request):
        n = len(hist.for_user(history_value, request_user(request)))
        if n == 0:
            gr.Info("没有历史记录")
            return gr.Row(visible=False), gr.skip()
        return gr.Row(visible=True), f"确认清空全部 **{n}** 条历史记录？此操作不可撤销。"

    def do_clear(history_value: list, request: gr.Request):
        return hist.clear(history_value, request_user(request)), gr.Row(visible=False)

    history.change(refresh_history, [history], [history_list], api_name="history_list", show_progress="hidden",
                   queue=False)
    history_list.input(replay, [history_list, history],
                       [chatbot, stage, sources, trace, retry, goto_kb, current], api_name="history_replay",
                       show_progress="hidden", queue=False)
    del_btn.click(delete_selected, [history_list, history], [history], api_name="history_delete", queue=False)
    clear_btn.click(ask_clear, [history], [confirm_row, confirm_text], api_name="history_clear_ask", queue=False)
    confirm_yes.click(do_clear, [history], [history, confirm_row], api_name="history_clear_confirm", queue=False)
    confirm_no.click(lambda: gr.Row(visible=False), None, [confirm_row], api_name="history_clear_cancel",
                     queue=False)

    return ChatTab(chatbot, question, send, retry, goto_kb, stage, sources, trace, history, history_list,
                   refresh_history)
