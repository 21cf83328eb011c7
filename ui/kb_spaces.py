"""知识库 selector and management (create / rename / delete after confirmation) at the top of 知识库 → 文档管理.

The picked knowledge base scopes the document table, uploads and 全量重建 below it. Everything goes through
Engine's list_kbs / create_kb / update_kb / delete_kb; every change re-checks the caller (KB admin).
API names: kb_spaces_save (create or rename), kb_spaces_delete.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipeline.access.policy import AccessPolicy, Reader, Role
from pipeline.retrieval.kb_indexes import DEFAULT_KB_ID

from . import guard
from .confirm import confirm_panel
from .render import esc
from .safe_markdown import safe_markdown


def kb_choices(engine, reader: Reader | None = None) -> list[tuple[str, int]]:
    """(name, kb_id) of the knowledge bases the reader may read (None: all)."""
    return [(k["name"], k["kb_id"]) for k in engine.list_kbs(reader)]


def readers_text(kb: dict) -> str:
    return "、".join(kb["readers"]) if kb.get("readers") is not None else ""


def parse_readers(text: str | None) -> list[str] | None:
    """「可读用户」 field: names split by commas / 、 / spaces; empty = every logged-in user."""
    names = [n for n in re.split(r"[,，、;；\s]+", text or "") if n]
    return names or None


OPEN_ONLY = Reader(None, privileged=False)  # sees only the knowledge bases open to every logged-in user


def kb_summary(engine, kb_id: Any, reader: Reader | None = None) -> str:
    """The line under the selector; '' for a knowledge base the reader may not read (the same check as REST)."""
    try:
        kb = engine.get_kb(int(kb_id), reader)
    except Exception:
        return ""
    desc = f" · {safe_markdown(kb['description'])}" if kb.get("description") else ""
    default = "（默认知识库：未指定知识库的接口都作用于它）" if kb.get("is_default") else ""
    who = (f" · 仅限 {esc(readers_text(kb))} 可读（知识库管理员总可读）" if kb.get("readers") is not None
           else " · 所有登录用户可读")
    return f"**{safe_markdown(kb['name'])}**{default} · {kb['docs']} 个文档 · {kb['chunks']} 块{who}{desc}"


@dataclass
class KBManager:
    pick: gr.Dropdown
    info: gr.Markdown
    wire: Callable[[Callable[..., tuple], list], None]  # (refresh(kb_id, request) → values, their outputs)


def build_kb_manager(engine, policy: AccessPolicy) -> KBManager:
    """The selector row (laid out where this is called); `.wire(refresh, refresh_outputs)` connects it once the
    document table exists: `refresh(kb_id, request)` returns the values of `refresh_outputs` for that KB."""
    with gr.Row(equal_height=True, elem_id="kb-spaces"):
        pick = gr.Dropdown(choices=kb_choices(engine, OPEN_ONLY), value=DEFAULT_KB_ID, label="知识库", scale=3,
                           elem_id="kb-pick", interactive=True, filterable=False)
        new_btn = gr.Button("新建知识库", scale=1, min_width=100, elem_id="kb-space-new")
        rename_btn = gr.Button("重命名", scale=1, min_width=80, elem_id="kb-space-rename")
        del_btn = gr.Button("删除知识库", variant="stop", scale=1, min_width=100, elem_id="kb-space-delete")
    info = gr.Markdown(kb_summary(engine, DEFAULT_KB_ID, OPEN_ONLY), elem_id="kb-space-info")  # before login
    mode = gr.State("new")
    with gr.Group(visible=False) as form:
        name = gr.Textbox(label="名称", max_lines=1, max_length=50, elem_id="kb-space-name")
        desc = gr.Textbox(label="描述（可选）", max_lines=3, max_length=500, elem_id="kb-space-desc")
        readers = gr.Textbox(label="可读用户（用逗号分隔；留空 = 所有登录用户可读，知识库管理员总可读）", max_lines=2,
                             elem_id="kb-space-readers")
        with gr.Row():
            save = gr.Button("保存", variant="primary", elem_id="kb-space-save")
            cancel = gr.Button("取消")
    panel = confirm_panel("确认删除知识库", "kb-space-del-yes")
    confirm, confirm_text, del_yes, del_no = panel.group, panel.text, panel.yes, panel.no
    msg = gr.Markdown("", elem_id="kb-space-msg")

    def wire(refresh: Callable[..., tuple], refresh_outputs: list) -> None:
        # Every handler here is reachable by fn_index through /gradio_api/queue/join whatever its api_name (Gradio's
        # "private" only hides it from the docs and the client libraries): each checks the caller itself.
        def picked(kb_id, request: gr.Request):
            return (kb_summary(engine, kb_id, guard.reader_of(policy, request)), *refresh(kb_id, request))

        def open_new():
            return gr.update(visible=True), "new", "", "", ""

        def open_rename(kb_id, request: gr.Request):
            guard.require(policy, request, Role.KB_ADMIN)  # renaming is a KB admin's; readers are theirs to see
            kb = engine.get_kb(int(kb_id), guard.reader_of(policy, request))
            return gr.update(visible=True), "rename", kb["name"], kb.get("description") or "", readers_text(kb)

        def kb_spaces_save(mode_value, name_value, desc_value, readers_value, kb_id, request: gr.Request):
            guard.require(policy, request, Role.KB_ADMIN)
            try:
                who = parse_readers(readers_value)
                unknown = policy.unknown_users(who)
                if unknown:
                    raise ValueError(f"可读用户中有不存在的用户：{'、'.join(unknown)}")
                if mode_value == "rename":
                    kb = engine.update_kb(int(kb_id), name_value, desc_value, who, actor=guard.page_actor(request))
                    text = f"已保存「{safe_markdown(kb['name'])}」"
                else:
                    kb = engine.create_kb(name_value, desc_value or "", who, actor=guard.page_actor(request))
                    text = f"已新建知识库「{safe_markdown(kb['name'])}」"
            except Exception as exc:  # EngineError: empty / duplicate name …
                return (gr.skip(), gr.skip(), f"⚠️ {esc(guard.error_text(exc))}", gr.skip(),
                        *(gr.skip(),) * len(refresh_outputs))
            return (gr.update(visible=False), gr.Dropdown(choices=kb_choices(engine), value=kb["kb_id"]), text,
                    kb_summary(engine, kb["kb_id"]), *refresh(kb["kb_id"], request))

        def ask_delete(kb_id, request: gr.Request):
            guard.require(policy, request, Role.KB_ADMIN)
            kb = engine.get_kb(int(kb_id))
            if kb.get("is_default"):
                return gr.update(visible=False), "", "⚠️ 默认知识库不能删除（可以重命名）"
            return (gr.update(visible=True),
                    f"**确定删除知识库「{safe_markdown(kb['name'])}」吗？** 其中的 {kb['docs']} 个文档（含全部版本）、"
                    f"{kb['chunks']} 个块、向量和原文件都会被删除，无法恢复。", "")

        def kb_spaces_delete(kb_id, request: gr.Request):
            guard.require(policy, request, Role.KB_ADMIN)
            try:
                res = engine.delete_kb(int(kb_id), actor=guard.page_actor(request))
                text = f"已删除知识库「{safe_markdown(res['name'])}」（{res['docs_removed']} 个文档）"
                kb_id = DEFAULT_KB_ID
            except Exception as exc:
                text = f"⚠️ 删除失败：{esc(guard.error_text(exc))}"
            return (gr.update(visible=False), gr.Dropdown(choices=kb_choices(engine), value=int(kb_id)), text,
                    kb_summary(engine, kb_id), *refresh(kb_id, request))

        pick.input(picked, [pick], [info, *refresh_outputs], api_name=False, show_progress="hidden")
        new_btn.click(open_new, None, [form, mode, name, desc, readers], api_name=False)
        rename_btn.click(open_rename, [pick], [form, mode, name, desc, readers], api_name=False)
        cancel.click(lambda: gr.update(visible=False), None, form, api_name=False)
        save.click(kb_spaces_save, [mode, name, desc, readers, pick], [form, pick, msg, info, *refresh_outputs],
                   api_name="kb_spaces_save", concurrency_limit=1)
        del_btn.click(ask_delete, [pick], [confirm, confirm_text, msg], api_name=False)
        del_no.click(lambda: gr.update(visible=False), None, confirm, api_name=False)
        del_yes.click(kb_spaces_delete, [pick], [confirm, pick, msg, info, *refresh_outputs],
                      api_name="kb_spaces_delete", concurrency_limit=1)

    return KBManager(pick, info, wire)


# --- scope pickers (问答, 双路检索调试): one or several knowledge bases, all by default ----------------------------
def scope_picker(engine, elem_id: str, label: str = "检索的知识库") -> gr.Dropdown:
    """Built before anyone logs in: only the knowledge bases open to every user; refresh_scope fills in the
    caller's on page load."""
    choices = kb_choices(engine, OPEN_ONLY)
    return gr.Dropdown(choices=choices, value=[v for _, v in choices], multiselect=True, label=label,
                       elem_id=elem_id, interactive=True, filterable=False)


def refresh_scope(engine, reader: Reader | None = None) -> gr.Dropdown:
    """On page load: the knowledge bases the caller may read as they are now (some may have been created since
    the page was built), all selected."""
    choices = kb_choices(engine, reader)
    return gr.Dropdown(choices=choices, value=[v for _, v in choices], multiselect=True)  # a list value: many picked


def scope_ids(engine, value: Any, reader: Reader | None = None) -> list[int]:
    """The picked knowledge bases; none picked = all the reader may read."""
    ids = [int(v) for v in (value or []) if str(v).lstrip("-").isdigit()]
    return ids or [k["kb_id"] for k in engine.list_kbs(reader)]
