"""问答 tab (F3) with the server-side conversation history (F4).

Every answer comes from `engine.ask(question, retry=..., conversation_id=..., user=..., use_kb=...)`, an Event
stream (pipeline.events); this module only turns those events into streamed Gradio updates. The conversation
lives on the server (pipeline.conversation): the chat keeps its id and its turns; the browser keeps only the id
of the open conversation (so a reload reopens it). The 历史 panel lists the user's conversations; choosing one
replays every turn with its citations and trace. Retry reuses the engine's cached retrieval (`retry=True`).

API names (gradio_client): /ask, /retry, /select_turn, /new_conversation, /history_list, /history_open,
/history_rename, /history_delete, /history_clear_ask, /history_clear_confirm, /history_clear_cancel,
/history_export, /restore_conversation.
"""
from __future__ import annotations

import html
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from pipeline import events as ev
from pipeline.access.policy import AccessPolicy
from pipeline.errors import CODE_ENGINE, CODE_LLM, EngineError
from pipeline.services.audit_log import Actor

from . import history as hist
from .answer_feedback import build_answer_feedback
from .guard import request_user
from .kb_spaces import scope_ids, scope_picker
from .render import answer_markdown, mark_replaced, render_sources, render_stage, render_trace, trace_marks
from .safe_markdown import safe_markdown
from .tag_filter import build_tag_filter, filter_of, wire_scope
from .viewer import OPENER_JS, build_viewer

log = logging.getLogger(__name__)

STREAM_MIN_INTERVAL = 0.05  # seconds between streamed answer updates (the engine may emit many tiny deltas)
RETRYABLE = {CODE_LLM, CODE_ENGINE}
KB_HINT_ADMIN = "请到「知识库」标签页上传相关资料后再提问。"
KB_HINT_USER = "（知识库由管理员维护，请联系管理员补充相关资料。）"
HISTORY_PAGE = 100  # conversations listed in the panel (newest first)


@dataclass
class ChatTab:
    """What the page wires around the tab (ui/__init__.py)."""
    goto_kb: gr.Button
    last_conv: gr.BrowserState
    view: list  # the components a conversation view fills (chat, panels, states)
    on_load: Any  # fn(last_conv, request) -> view updates + history list, for demo.load


def done_note(route: str | None, refusal: dict | None) -> str | None:
    """The note under a finished answer: no knowledge base used, or who refused after the gate let it through (the
    LLM's 「资料不足」, the extractive reader's 「资料中未找到…」)."""
    if route == "DIRECT":
        return "未使用知识库"
    return {"llm": "大模型判定资料不足", "extractive": "原文中未找到答案"}.get((refusal or {}).get("by"))


def build_chat_tab(engine, policy: AccessPolicy | None = None) -> ChatTab:
    policy = policy or AccessPolicy()
    data_dir = getattr(engine, "data_dir", "data")
    export_dir = Path(tempfile.mkdtemp(prefix="kbqa-export-"))
    conv_state = gr.State(None)      # id of the conversation in the chat (None: the next question starts one)
    turns_state = gr.State([])       # its turns (hist.turn_record dicts)
    active_state = gr.State(None)    # index of the turn whose sources / trace are shown

    with gr.Row(equal_height=False):
        with gr.Column(scale=6, min_width=360):
            stage = gr.HTML(render_stage(None), elem_id="kb-stage")
            chatbot = gr.Chatbot(
                label="问答", elem_id="kb-chatbot", height=460, feedback_options=None, buttons=["copy"],
                placeholder="向知识库提问，回答会标注引用编号 [n]，点击编号可定位右侧的来源。"
                            "可以直接追问（如「那乙方呢？」）。",
                group_consecutive_messages=False)
            with gr.Row():
                retry = gr.Button("重试", visible=False, elem_id="kb-retry", size="sm", variant="secondary")
                goto_kb = gr.Button("前往「知识库」补充资料", visible=False, elem_id="kb-goto-kb", size="sm")
            build_answer_feedback(engine, turns_state, active_state)
            with gr.Row(equal_height=True):
                question = gr.Textbox(show_label=False, placeholder="输入问题，按 Enter 发送", lines=1, max_lines=6,
                                      scale=8, elem_id="kb-question", autofocus=True)
                send = gr.Button("发送", variant="primary", scale=1, min_width=90, elem_id="kb-send")
            with gr.Row(equal_height=True):
                use_kb = gr.Checkbox(True, label="知识库检索", elem_id="kb-use-kb", scale=2, min_width=120,
                                     info="关闭后直接与大模型对话，不检索知识库、没有引用")
                new_conv = gr.Button("＋ 新对话", size="sm", elem_id="kb-new-conv", scale=1, min_width=90)
            with gr.Row(equal_height=True):
                kbs = scope_picker(engine, "kb-scope")
                tag_filter = build_tag_filter(engine)  # beside the KB picker: ask within some tags (ui/tag_filter.py)
            with gr.Accordion("检索过程", open=False, elem_id="kb-trace-acc"):
                trace = gr.HTML(render_trace(None), elem_id="kb-trace", js_on_load=OPENER_JS)
        with gr.Column(scale=4, min_width=300):
            turn_list = gr.Radio(choices=[], value=None, label="查看本对话的第几轮（来源与检索过程）",
                                 elem_id="kb-turn-list", interactive=True)
            gr.HTML("<h3 style='margin:4px 0'>引用来源</h3>")
            sources = gr.HTML(render_sources(None), elem_id="kb-sources", js_on_load=OPENER_JS)
            with gr.Accordion("历史对话（保存在服务器）", open=False, elem_id="kb-history-acc") as history_acc:
                history_list = gr.Radio(choices=[], value=None, show_label=False, elem_id="kb-history-list",
                                        interactive=True)
                with gr.Row():
                    title_box = gr.Textbox(show_label=False, placeholder="新标题", scale=3, elem_id="kb-history-title")
                    rename_btn = gr.Button("重命名", size="sm", scale=1, elem_id="kb-history-rename")
                with gr.Row():
                    export_btn = gr.Button("导出 Markdown", size="sm", elem_id="kb-history-export")
                    del_btn = gr.Button("删除所选", size="sm", elem_id="kb-history-delete")
                    clear_btn = gr.Button("清空全部", size="sm", variant="stop", elem_id="kb-history-clear")
                export_file = gr.File(label="导出的对话", visible=False, elem_id="kb-history-file", interactive=False)
                with gr.Row(visible=False, elem_id="kb-history-confirm") as confirm_row:
                    confirm_text = gr.Markdown("")
                    confirm_yes = gr.Button("确认清空", size="sm", variant="stop", elem_id="kb-history-clear-yes")
                    confirm_no = gr.Button("取消", size="sm", elem_id="kb-history-clear-no")

    viewer = build_viewer(engine, "kb-viewer", policy)  # a source clicked → its document, the passage highlighted
    viewer.connect(sources, engine)
    viewer.connect(trace, engine)
    current = gr.State(None)         # the question being / last answered (for 重试)
    last_conv = gr.BrowserState("", storage_key=hist.storage_key(data_dir), secret=hist.storage_secret(data_dir))

    def _kb_hint(user):
        return KB_HINT_ADMIN if policy.is_kb_admin(user) else KB_HINT_USER

    def _suffixes(turns, user) -> dict[int, str]:
        if policy.is_kb_admin(user):  # the fixed text already says "go to 知识库"
            return {}
        return {i: f"\n\n*{_kb_hint(user)}*" for i, t in enumerate(turns) if t.get("no_answer")}

    # ------------------------------------------------------------------ one conversation on screen
    view = [chatbot, stage, sources, trace, turn_list, conv_state, turns_state, active_state, last_conv]

    def show(turns: list, active: int | None, conv_id: str | None, user, note: str | None = None) -> dict:
        t = turns[active] if active is not None and 0 <= active < len(turns) else None
        if t is None:
            panels = {stage: render_stage(None), sources: render_sources(None), trace: render_trace(None)}
        else:
            panels = {
                # a replayed turn says what the live one said (its refusal is kept in the stored trace)
                stage: render_stage(done_ms=t.get("elapsed_ms"),
                                    note=note or done_note(t.get("route"), (t.get("trace") or {}).get("refusal"))
                                    or ("未命中相关资料" if t.get("no_answer") else None)),
                # a replayed answer keeps the versions it cited; replaced ones say 旧版本
                sources: render_sources(mark_replaced(engine, [x for x in t.get("sources") or [] if isinstance(x, dict)]),
                                        no_answer=t.get("no_answer"), kb_hint=_kb_hint(user),
                                        direct=t.get("route") == "DIRECT"),
                trace: render_trace(t.get("trace"), t.get("elapsed_ms"))}
        return {chatbot: hist.messages(turns, active, _suffixes(turns, user)), **panels,
                turn_list: gr.Radio(choices=hist.turn_choices(turns), value=active), conv_state: conv_id,
                turns_state: turns, active_state: active, last_conv: conv_id or ""}

    def list_update(user, selected: str | None = None) -> gr.Radio:
        items = engine.list_conversations(user, 1, HISTORY_PAGE)["items"]
        return gr.Radio(choices=hist.conversation_choices(items), value=selected)

    # ------------------------------------------------------------------ the answer stream
    run_outputs = view + [send, retry, goto_kb, question, current, history_list, viewer.group]

    def run(q: str, conv_id, turns, use_kb_value, user, retry_flag: bool, kb_value=None,
            doc_filter=None) -> Iterator[dict]:
        q = (q or "").strip()
        turns = list(turns or [])
        if not q:
            gr.Warning("请输入问题")
            return
        answer, sources_list, trace_data = "", None, None
        earlier = hist.messages(turns, None, _suffixes(turns, user))

        def pending(body: str) -> list:
            return earlier + [{"role": "user", "content": safe_markdown(q)},
                              {"role": "assistant", "content": body}]

        # The previous answer area clears, the button disables, the stage indicator starts.
        yield {chatbot: pending("…"), stage: render_stage("recall"),
               sources: render_sources(None, empty_text="检索中…"), trace: render_trace(None),
               send: gr.Button(interactive=False), retry: gr.Button(visible=False),
               goto_kb: gr.Button(visible=False), question: "", current: q,
               viewer.group: gr.update(visible=False)}  # a new question closes the document viewer
        last = 0.0
        try:
            for e in engine.ask(q, retry=retry_flag, conversation_id=conv_id, user=user, use_kb=bool(use_kb_value),
                                kb_ids=scope_ids(engine, kb_value, policy.reader(user)),
                                reader=policy.reader(user), actor=Actor(user, "page"), doc_filter=doc_filter):
                if e.type is ev.EventType.STAGE:
                    yield {stage: render_stage(e.data.get("phase"))}
                elif e.type is ev.EventType.TRACE:
                    trace_data = dict(e.data)
                    yield {trace: render_trace(trace_data)}
                elif e.type is ev.EventType.DELTA:
                    answer += e.data.get("text", "")
                    now = time.monotonic()
                    if now - last >= STREAM_MIN_INTERVAL:
                        last = now
                        yield {chatbot: pending(answer_markdown(answer, **trace_marks(trace_data)))}
                elif e.type is ev.EventType.REPLACE:  # the streamed text is void: the bubble shows only this
                    answer = e.data.get("text", "")
                    yield {chatbot: pending(answer_markdown(answer))}
                elif e.type is ev.EventType.SOURCES:
                    sources_list = e.data.get("sources") or []
                elif e.type is ev.EventType.DONE:
                    trace_data = ev.trace_with_support(trace_data, e.data)  # 检索过程 counts unsupported cites
                    rec = hist.turn_record(q, answer, sources_list, trace_data, e.data)
                    turns2 = turns + [rec]
                    cid = e.data.get("conversation_id")
                    no_answer = rec["no_answer"]
                    note = done_note(rec["route"], e.data.get("refusal"))
                    yield {**show(turns2, len(turns2) - 1, cid, user, note=note),
                           send: gr.Button(interactive=True), retry: gr.Button(visible=False),
                           goto_kb: gr.Button(visible=no_answer and policy.is_kb_admin(user)),
                           history_list: list_update(user, cid)}
                    return
                elif e.type is ev.EventType.ERROR:
                    yield _error_update(pending, answer, e.data.get("code"), e.data.get("msg") or "未知错误",
                                        trace_data)
                    return
        except Exception as exc:  # an engine bug must not leave the page stuck with a disabled button
            log.exception("answer stream failed")
            yield _error_update(pending, answer, CODE_ENGINE, f"内部错误：{exc}", trace_data)
            return
        # The stream ended without done/error (should not happen): unlock the page.
        yield _error_update(pending, answer, CODE_ENGINE, "回答意外中断", trace_data)

    def _error_update(pending, answer, code, msg, trace_data) -> dict:
        partial = (answer_markdown(answer) + "\n\n---\n") if answer else ""
        can_retry = code in RETRYABLE
        bubble = f"{partial}⚠️ **回答失败**：{html.escape(str(msg), quote=False)}"
        if can_retry:
            bubble += "\n\n可点击下方「重试」按钮重新生成。"
        out = {chatbot: pending(bubble), stage: render_stage(error=f"{msg}（错误码 {code}）"),
               send: gr.Button(interactive=True), retry: gr.Button(visible=can_retry),
               goto_kb: gr.Button(visible=False)}
        if trace_data:
            out[trace] = render_trace(trace_data)
        return out

    # `kb_value` comes after `request` (Gradio injects the request by its annotation): callers from before
    # knowledge bases existed still pass the same positional inputs.
    def ask(question_text: str, use_kb_value: bool, conv_id, turns, request: gr.Request, kb_value=None,
            tags_value=None, mode_value=None):
        yield from run(question_text, conv_id, turns, use_kb_value, request_user(request), retry_flag=False,
                       kb_value=kb_value, doc_filter=filter_of(tags_value, mode_value))

    def retry_fn(use_kb_value: bool, current_q: str, conv_id, turns, request: gr.Request, kb_value=None,
                 tags_value=None, mode_value=None):
        yield from run(current_q or "", conv_id, turns, use_kb_value, request_user(request), retry_flag=True,
                       kb_value=kb_value, doc_filter=filter_of(tags_value, mode_value))

    gr.on([send.click, question.submit], ask, [question, use_kb, conv_state, turns_state, kbs, *tag_filter.inputs],
          run_outputs, api_name="ask", concurrency_limit=4, concurrency_id="kb-ask", show_progress="hidden")
    retry.click(retry_fn, [use_kb, current, conv_state, turns_state, kbs, *tag_filter.inputs], run_outputs,
                api_name="retry", concurrency_limit=4, concurrency_id="kb-ask", show_progress="hidden")
    wire_scope(engine, policy, kbs, tag_filter, tags_api_name="chat_tags")

    # ------------------------------------------------------------------ turns of the open conversation
    def select_turn(idx, turns, conv_id, request: gr.Request):
        turns = list(turns or [])
        if not isinstance(idx, int) or not 0 <= idx < len(turns):
            return {}
        return show(turns, idx, conv_id, request_user(request))

    turn_list.input(select_turn, [turn_list, turns_state, conv_state], view, api_name="select_turn",
                    show_progress="hidden", queue=False)

    def new_conversation():
        return {**show([], None, None, None), retry: gr.Button(visible=False), goto_kb: gr.Button(visible=False),
                history_list: gr.Radio(value=None)}

    new_conv.click(new_conversation, None, view + [retry, goto_kb, history_list], api_name="new_conversation",
                   queue=False)

    # ------------------------------------------------------------------ history (server side)
    def open_conversation(conv_id, user, note: str = "历史对话") -> dict:
        try:
            conv = engine.get_conversation(conv_id, user, policy.reader(user))
        except EngineError as exc:
            gr.Warning(exc.msg)
            return {}
        turns = [hist.turn_record(t["question"], t["answer"], t["sources"], t["trace"],
                                  {"turn_id": t["turn_id"], "elapsed_ms": t["elapsed_ms"], "no_answer": t["no_answer"],
                                   "route": t["route"], "rewritten_query": t["rewritten"], "mode": t["mode"]})
                 for t in conv["turns"]]
        return {**show(turns, len(turns) - 1 if turns else None, conv["conv_id"], user,
                       note=f"{note} {conv['time']}"),
                retry: gr.Button(visible=False), goto_kb: gr.Button(visible=False)}

    open_outputs = view + [retry, goto_kb]

    def history_open(conv_id: str, request: gr.Request):
        return open_conversation(conv_id, request_user(request)) if conv_id else {}

    def refresh_history(request: gr.Request):
        return list_update(request_user(request))

    def restore(last: str, request: gr.Request):
        """Page load: the list, and the conversation that was open before the reload (if it is still the user's)."""
        user = request_user(request)
        out = {history_list: list_update(user, last or None)}
        if last:
            try:
                engine.get_conversation(last, user)
            except EngineError:
                return {**out, last_conv: ""}  # deleted meanwhile, or another user's id in this browser
            out.update(open_conversation(last, user))
        return out

    def rename(conv_id: str, title: str, request: gr.Request):
        if not conv_id:
            gr.Warning("请先在列表中选择一个对话")
            return gr.skip(), gr.skip()
        try:
            engine.rename_conversation(conv_id, request_user(request), title)
        except EngineError as exc:
            gr.Warning(exc.msg)
            return gr.skip(), gr.skip()
        return list_update(request_user(request), conv_id), ""

    def delete_selected(conv_id: str, open_id, request: gr.Request):
        user = request_user(request)
        if not conv_id:
            gr.Warning("请先在列表中选择一个对话")
            return {}
        try:
            engine.delete_conversation(conv_id, user)
        except EngineError as exc:
            gr.Warning(exc.msg)
            return {}
        out = {history_list: list_update(user)}
        if conv_id == open_id:
            out.update(new_conversation())
            out[history_list] = list_update(user)
        return out

    def ask_clear(request: gr.Request):
        n = engine.list_conversations(request_user(request), 1, 1)["total"]
        if n == 0:
            gr.Info("没有历史对话")
            return gr.Row(visible=False), gr.skip()
        return gr.Row(visible=True), f"确认清空全部 **{n}** 个历史对话？此操作不可撤销。"

    def do_clear(request: gr.Request):
        engine.clear_conversations(request_user(request))
        return {**new_conversation(), history_list: list_update(request_user(request)),
                confirm_row: gr.Row(visible=False)}

    def export(conv_id: str, open_id, request: gr.Request):
        cid = conv_id or open_id
        if not cid:
            gr.Warning("请先选择或打开一个对话")
            return gr.File(visible=False)
        try:
            md = engine.export_conversation(cid, request_user(request), policy.reader(request_user(request)))
        except EngineError as exc:
            gr.Warning(exc.msg)
            return gr.File(visible=False)
        path = export_dir / f"对话-{cid[:8]}.md"
        path.write_text(md, encoding="utf-8")
        return gr.File(value=str(path), visible=True)

    history_list.input(history_open, [history_list], open_outputs, api_name="history_open",
                       show_progress="hidden", queue=False)
    rename_btn.click(rename, [history_list, title_box], [history_list, title_box], api_name="history_rename",
                     queue=False)
    del_btn.click(delete_selected, [history_list, conv_state], view + [retry, goto_kb, history_list],
                  api_name="history_delete", queue=False)
    clear_btn.click(ask_clear, None, [confirm_row, confirm_text], api_name="history_clear_ask", queue=False)
    confirm_yes.click(do_clear, None, view + [retry, goto_kb, history_list, confirm_row],
                      api_name="history_clear_confirm", queue=False)
    confirm_no.click(lambda: gr.Row(visible=False), None, [confirm_row], api_name="history_clear_cancel",
                     queue=False)
    export_btn.click(export, [history_list, conv_state], [export_file], api_name="history_export", queue=False)
    history_acc.expand(refresh_history, None, [history_list], api_name="history_list", show_progress="hidden",
                       queue=False)

    return ChatTab(goto_kb, last_conv, view + [retry, goto_kb, history_list], restore)
