"""知识库 → 文档 → 分块: the KB admin's chunk editor under a document's chunk list (pipeline/services/chunks.py).

Pick a chunk, change its text (re-tokenized and re-embedded at once), restore the parsed original, switch it off /
on (out of both retrieval routes and of citations, in every process), or add a chunk by hand. Every handler checks
the KB-admin role on the server and records the user in the audit log; the chunk list is re-rendered after each
change by the renderer the 知识库 tab hands in (ui.kb_tab.chunks_html).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role

from . import guard
from .render import esc

EDITOR_CSS = """
.kbc-off { color: #b42318; font-weight: 600; }
.kbc-edited { color: #8a5200; }
.kbc-manual { color: #1d4ed8; }
"""
NOTE = ("修改立即生效：关键词检索与向量检索同时更新，所有服务进程同步；停用的块不会被检索到，也不会被引用。"
        "全量重建保留这些修改。**修改只属于这个版本**：上传新版本时，新版本从它自己的解析结果开始，不带过这些修改。")
LABEL_CHARS = 24


def chunk_marks(c: dict) -> list[str]:
    """What the chunk list shows beside a chunk's place: its length, 已停用, 已修改 (who · when), 手动添加."""
    marks = [f"{len(c.get('text') or '')} 字"]
    if not c.get("enabled", 1):
        marks.append('<span class="kbc-off">已停用</span>')
    if c.get("original_text") is not None:
        who = " · ".join(esc(x) for x in (c.get("edited_by"), c.get("edited_at")) if x)
        marks.append(f'<span class="kbc-edited">已修改{f"（{who}）" if who else ""}</span>')
    if c.get("manual"):
        marks.append('<span class="kbc-manual">手动添加</span>')
    return marks


def _label(c: dict) -> str:
    text = " ".join((c.get("text") or "").split())
    state = "" if c.get("enabled", 1) else "［停用］"
    return f"块 {c['chunk_id']} {state}{text[:LABEL_CHARS]}{'…' if len(text) > LABEL_CHARS else ''}"


def _info(c: dict | None) -> str:
    if c is None:
        return ""
    bits = [f"块 {c['chunk_id']}", f"{c['length']} 字", "已启用" if c["enabled"] else "**已停用**"]
    if c.get("context"):
        bits.append(f"上下文：{esc(c['context'])}")
    if c["manual"]:
        bits.append(f"手动添加（{esc(c.get('edited_by') or '本机')} · {esc(c.get('edited_at') or '')}）")
    elif c["edited"]:
        bits.append(f"已修改（{esc(c.get('edited_by') or '本机')} · {esc(c.get('edited_at') or '')}），可恢复原文")
    return " · ".join(bits)


@dataclass
class ChunkEditor:
    load: Callable  # doc_id → the editor reset for that document (wired after the chunk list opens)
    outputs: list


def build_chunk_editor(engine, policy: AccessPolicy, doc_id: gr.Number, view: gr.HTML,
                       render: Callable[[list[dict]], str]) -> ChunkEditor:
    """The editor's components (inside the chunk panel). `doc_id` holds the open document; `view` is the chunk list
    that `render(chunks)` redraws after a change."""

    def require(request) -> None:
        guard.require(policy, request, Role.KB_ADMIN)

    with gr.Accordion("编辑分块（修改 / 恢复原文 / 停用 / 启用 / 添加）", open=False, elem_id="kb-chunk-editor"):
        gr.Markdown(NOTE, elem_id="kb-chunk-note")
        pick = gr.Dropdown(label="选择块", choices=[], value=None, interactive=True, allow_custom_value=True,
                           elem_id="kb-chunk-pick")  # custom: API clients send a chunk id the page never listed
        info = gr.Markdown("", elem_id="kb-chunk-info")
        text = gr.Textbox(label="块文本", lines=5, max_lines=20, elem_id="kb-chunk-text")
        with gr.Row(equal_height=True):
            save = gr.Button("保存修改", variant="primary", size="sm", elem_id="kb-chunk-save")
            restore = gr.Button("恢复原文", size="sm", elem_id="kb-chunk-restore")
            off = gr.Button("停用", variant="stop", size="sm", elem_id="kb-chunk-disable")
            on = gr.Button("启用", size="sm", elem_id="kb-chunk-enable")
        new_text = gr.Textbox(label="添加手动块：文本", lines=3, elem_id="kb-chunk-new-text")
        new_context = gr.Textbox(label="上下文（标题路径，可选）", max_lines=1, elem_id="kb-chunk-new-context")
        add = gr.Button("添加块", size="sm", elem_id="kb-chunk-add")
        reparse = gr.Button("放弃这个文档的全部分块修改，重新解析", variant="stop", size="sm", elem_id="kb-chunk-reparse")
        msg = gr.Markdown("", elem_id="kb-chunk-msg")
    outputs = [view, pick, text, info, msg]

    def state(did: int | None, chunk_id: int | None, message: str) -> tuple:
        """The chunk list, the picker and the picked chunk after a change (or on opening)."""
        if did is None:
            return gr.update(), gr.update(choices=[], value=None), "", "", message
        chunks = engine.list_chunks(did)["chunks"]
        picked = next((c for c in chunks if c["chunk_id"] == chunk_id), None)
        return (render(engine.document_chunks(did)),
                gr.update(choices=[(_label(c), c["chunk_id"]) for c in chunks],
                          value=picked["chunk_id"] if picked else None),
                picked["text"] if picked else "", _info(picked), message)

    def load(did):
        did = guard.to_int(did)
        if did is None:
            return gr.update(), gr.update(choices=[], value=None), "", "", ""
        try:
            return state(did, None, "")
        except Exception as exc:
            return gr.update(), gr.update(choices=[], value=None), "", "", f"⚠️ {esc(getattr(exc, 'msg', exc))}"

    def show(chunk_id):
        cid = guard.to_int(chunk_id)
        if cid is None:
            return "", ""
        try:
            c = engine.get_chunk(cid)
        except Exception as exc:
            return "", f"⚠️ {esc(getattr(exc, 'msg', exc))}"
        return c["text"], _info(c)

    def act(did, chunk_id, request, change: Callable[[int], dict], done: str) -> tuple:
        require(request)
        did, cid = guard.to_int(did), guard.to_int(chunk_id)
        if cid is None:
            return gr.update(), gr.update(), gr.update(), gr.update(), "⚠️ 请先选择一个块"
        try:
            change(cid)
        except Exception as exc:
            return gr.update(), gr.update(), gr.update(), gr.update(), f"⚠️ {esc(getattr(exc, 'msg', exc))}"
        return state(did, cid, done)

    def kb_chunk_edit(did, chunk_id, new, request: gr.Request):
        return act(did, chunk_id, request, lambda cid: engine.edit_chunk(cid, new, actor=guard.page_actor(request)),
                   "✓ 已保存：关键词与向量索引已按新文本更新")

    def kb_chunk_restore(did, chunk_id, request: gr.Request):
        return act(did, chunk_id, request, lambda cid: engine.restore_chunk(cid, actor=guard.page_actor(request)),
                   "✓ 已恢复解析出的原文")

    def kb_chunk_disable(did, chunk_id, request: gr.Request):
        return act(did, chunk_id, request,
                   lambda cid: engine.set_chunk_enabled(cid, False, actor=guard.page_actor(request)),
                   "✓ 已停用：它不再被检索，也不会被引用")

    def kb_chunk_enable(did, chunk_id, request: gr.Request):
        return act(did, chunk_id, request,
                   lambda cid: engine.set_chunk_enabled(cid, True, actor=guard.page_actor(request)), "✓ 已启用")

    def kb_chunk_add(did, body, context, request: gr.Request):
        require(request)
        did = guard.to_int(did)
        if did is None:
            return gr.update(), gr.update(), gr.update(), gr.update(), "⚠️ 请先打开一个文档的分块", gr.update()
        try:
            made = engine.add_chunk(did, body, (context or "").strip() or None, actor=guard.page_actor(request))
        except Exception as exc:
            return (gr.update(), gr.update(), gr.update(), gr.update(), f"⚠️ {esc(getattr(exc, 'msg', exc))}",
                    gr.update())
        return (*state(did, made["chunk_id"], f"✓ 已添加块 {made['chunk_id']}，已可检索"), "")

    def kb_chunk_reparse(did, request: gr.Request):
        require(request)
        did = guard.to_int(did)
        if did is None:
            return gr.update(), gr.update(), gr.update(), gr.update(), "⚠️ 请先打开一个文档的分块"
        try:
            engine.reparse_document(did, actor=guard.page_actor(request))
        except Exception as exc:
            return gr.update(), gr.update(), gr.update(), gr.update(), f"⚠️ {esc(getattr(exc, 'msg', exc))}"
        return (gr.update(), gr.update(choices=[], value=None), "", "",
                "✓ 已开始重新解析：完成后（就绪）块从原始文件重新生成，之前的修改、停用和手动块都不再保留")

    pick.change(show, [pick], [text, info], api_name=False)
    save.click(kb_chunk_edit, [doc_id, pick, text], outputs, api_name="kb_chunk_edit", concurrency_limit=1)
    restore.click(kb_chunk_restore, [doc_id, pick], outputs, api_name="kb_chunk_restore", concurrency_limit=1)
    off.click(kb_chunk_disable, [doc_id, pick], outputs, api_name="kb_chunk_disable", concurrency_limit=1)
    on.click(kb_chunk_enable, [doc_id, pick], outputs, api_name="kb_chunk_enable", concurrency_limit=1)
    add.click(kb_chunk_add, [doc_id, new_text, new_context], [*outputs, new_text], api_name="kb_chunk_add",
              concurrency_limit=1)
    reparse.click(kb_chunk_reparse, [doc_id], outputs, api_name="kb_chunk_reparse", concurrency_limit=1)
    return ChunkEditor(load, outputs)
