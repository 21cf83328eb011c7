"""标签与元数据 of a document in 知识库 → 文档管理: read and edit its tags and key = value metadata (KB admins).

Opening a document's 查看块 loads it here too; 保存 replaces its tags and metadata (recorded in the audit log) and
the next question's tag filter sees the change. The automatic metadata (type, version, pages, upload date) is
shown, not edited. Also the 「上传标签」 field whose tags go onto every file uploaded next.
API names: kb_doc_tags_load, kb_doc_tags_save.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role

from . import guard
from .render import esc
from .safe_markdown import safe_markdown


def meta_text(meta: dict) -> str:
    """{key: value} as the editor's lines 「key = value」."""
    return "\n".join(f"{k} = {v}" for k, v in (meta or {}).items())


def parse_meta(text: str | None) -> dict[str, str]:
    """「key = value」 (or 「key: value」 / 「key：value」) per line; blank lines skipped."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = re.split(r"\s*[=:：]\s*", line.strip(), maxsplit=1)
        if len(parts) != 2 or not parts[0]:
            raise ValueError(f"无法识别的元数据行：「{line.strip()}」（应为 键 = 值）")
        out[parts[0]] = parts[1]
    return out


def auto_text(auto: dict) -> str:
    if not auto:
        return ""
    pages = f" · {auto['pages']} 页" if auto.get("pages") else ""
    return (f"自动元数据：类型 {esc((auto.get('file_type') or '').upper())} · 版本 v{esc(auto.get('version'))}"
            f"{pages} · 上传于 {esc(auto.get('uploaded'))}")


@dataclass
class DocTagsEditor:
    doc_id: gr.Number
    tags: gr.Textbox
    meta: gr.Textbox
    info: gr.Markdown
    upload_tags: gr.Textbox  # tags for the next upload (kb_tab passes it to engine.upload)
    load: Any  # fn(doc_id, request) -> (doc_id, tags, meta, info): wire to the table's 查看块


def build_doc_tags_editor(engine, policy: AccessPolicy | None = None) -> DocTagsEditor:
    policy = policy or AccessPolicy()
    upload_tags = gr.Textbox(label="上传标签（可选，逗号分隔，加到接下来上传的每个文件）", max_lines=1, max_length=3000,
                             elem_id="kb-upload-tags")
    with gr.Accordion("标签与元数据", open=False, elem_id="kb-doc-tags-acc"):
        with gr.Row(equal_height=True):
            doc_id = gr.Number(None, label="文档 id（点表格里的「查看块」自动填入）", precision=0, scale=1,
                               elem_id="kb-doc-tags-id")
            load_btn = gr.Button("读取", size="sm", scale=0, min_width=70, elem_id="kb-doc-tags-load")
        info = gr.Markdown("", elem_id="kb-doc-tags-info")
        tags = gr.Textbox(label="标签（逗号分隔）", max_lines=2, max_length=3000, elem_id="kb-doc-tags")
        meta = gr.Textbox(label="元数据（每行 键 = 值，如 source = https://…）", lines=3, max_length=30000,
                          elem_id="kb-doc-meta")
        save_btn = gr.Button("保存标签与元数据", variant="primary", size="sm", elem_id="kb-doc-tags-save")
        msg = gr.Markdown("", elem_id="kb-doc-tags-msg")

    def load(did, request: gr.Request):
        guard.require(policy, request, Role.KB_ADMIN)
        if did is None:
            return None, "", "", ""
        try:
            got = engine.document_tags(int(did), guard.reader_of(policy, request))
            doc = engine.get_document(int(did))
        except Exception as exc:
            return did, "", "", f"⚠️ {esc(getattr(exc, 'msg', None) or str(exc))}"
        head = f"**{safe_markdown(doc.get('file_name'))}** · {auto_text(got.get('auto') or {})}"
        return int(did), ", ".join(got["tags"]), meta_text(got["metadata"]), head

    def save(did, tags_value, meta_value, request: gr.Request):
        guard.require(policy, request, Role.KB_ADMIN)
        if did is None:
            return "⚠️ 请先选择文档"
        try:
            got = engine.set_document_tags(int(did), tags_value or "", parse_meta(meta_value),
                                           actor=guard.page_actor(request))
        except Exception as exc:  # EngineError (validation / 3002) or a malformed metadata line
            return f"⚠️ {esc(getattr(exc, 'msg', None) or str(exc))}"
        return f"已保存：{len(got['tags'])} 个标签，{len(got['metadata'])} 项元数据"

    load_btn.click(load, [doc_id], [doc_id, tags, meta, info], api_name="kb_doc_tags_load")
    doc_id.submit(load, [doc_id], [doc_id, tags, meta, info], api_name=False)
    save_btn.click(save, [doc_id, tags, meta], [msg], api_name="kb_doc_tags_save")
    return DocTagsEditor(doc_id, tags, meta, info, upload_tags, load)
