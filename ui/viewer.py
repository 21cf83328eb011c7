"""Document viewer: a side drawer with a document's text, the cited chunk highlighted and scrolled into view.

Opened by clicking a source (the [n] citation, a source card's 查看原文, a 检索过程 row, a 双路检索调试 card or a
chunk of 查看块): those HTML components call `trigger('click', {chunk_id})` from their js_on_load and their
`.click` is wired to the viewer's `open` handler (see `connect`). PDFs show the page number, OCR'd pages say
so, old versions say which version is current; long texts are paged (上一部分 / 下一部分). A PDF page with a
text layer is also shown rendered, the passage boxed (pipeline.services.page_image), folded under 页面原图.
Data: Engine.document_text (GET /api/kb/documents/{id}/text); the original: /api/kb/documents/{id}/file.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import gradio as gr

from . import guard
from .render import esc

VIEWER_CSS = """
.kbv-head { font-size: .9rem; display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin-bottom: 6px; }
.kbv-name { font-weight: 700; font-size: 1rem; }
.kbv-tag { font-size: .78rem; padding: 0 6px; border-radius: 4px; background: #eef; }
.kbv-tag-old { background: #fdecea; color: #b42318; }
.kbv-tag-ocr { background: #fff4e5; color: #8a5200; }
.kbv-ctx { font-size: .82rem; opacity: .75; margin-bottom: 4px; }
.kbv-text { white-space: pre-wrap; font-size: .9rem; line-height: 1.6; max-height: calc(100vh - 230px); overflow-y: auto;
            border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 10px 12px; }
mark.kbv-hl { background: #fde68a; color: inherit; padding: 1px 0; border-radius: 2px; box-shadow: 0 0 0 2px #f59e0b; }
.kbv-nav { display: flex; gap: 8px; align-items: center; margin-top: 6px; font-size: .85rem; }
.kbv-nav button { cursor: pointer; border: 1px solid var(--border-color-primary); border-radius: 6px; padding: 1px 10px;
                  background: var(--button-secondary-background-fill); }
.kbv-nav button[disabled] { opacity: .4; cursor: default; }
.kbv-note { font-size: .8rem; color: #8a5200; }
.kbv-pageimg { margin-top: 8px; font-size: .85rem; }
.kbv-pageimg img { border: 1px solid var(--border-color-primary); margin-top: 4px; }
"""

# Scroll the highlight into view after every render; page buttons ask the server for another part.
VIEWER_JS = """
const show = () => { const m = element.querySelector('mark.kbv-hl'); if (m) m.scrollIntoView({block: 'center'}); };
watch('value', show);
show();
element.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-part]');
  if (!b || b.disabled) return;
  trigger('click', {doc_id: Number(b.dataset.doc), part: Number(b.dataset.part)});
});
"""

# For HTML components whose items open the viewer: any element with data-view-chunk (or a source card's
# 'kb-view' event, sent by the [n] citation script in ui.theme.HEAD_JS) → trigger('click', {chunk_id}).
OPENER_JS = """
const open = (chunk) => { if (chunk) trigger('click', {chunk_id: Number(chunk)}); };
element.addEventListener('kb-view', (e) => open(e.detail && e.detail.chunk_id));
element.addEventListener('click', (e) => {
  const b = e.target.closest('[data-view-chunk]');
  if (!b) return;
  e.preventDefault();
  e.stopPropagation();
  open(b.dataset.viewChunk);
});
"""
DRAWER_CSS = """
/* over the right-hand column (sources) only: the question box and 发送 on the left stay usable */
.kbv-drawer { position: fixed !important; top: 0; right: 0; width: min(720px, 38vw); min-width: 320px; height: 100vh;
              z-index: 1000;
              overflow-y: auto; padding: 12px 14px !important; background: var(--background-fill-primary) !important;
              box-shadow: -6px 0 24px rgba(0,0,0,.18); border-left: 1px solid var(--border-color-primary); }
"""


def page_image_html(page_jpeg: bytes | None, boxed: bool) -> str:
    if not page_jpeg:
        return ""
    note = "引用段落已框出" if boxed else "此页文字层无法定位引用段落"
    data = base64.b64encode(page_jpeg).decode("ascii")
    return (f'<details class="kbv-pageimg" data-boxed="{int(boxed)}"><summary>页面原图（{note}）</summary>'
            f'<img alt="页面原图" src="data:image/jpeg;base64,{data}" style="width:100%"></details>')


def viewer_html(view: dict, page_jpeg: bytes | None = None, boxed: bool = False) -> str:
    doc_id = int(view["doc_id"])
    tags = [f'<span class="kbv-name">{esc(view.get("file_name"))}</span>']
    if view.get("kb_name"):
        tags.append(f'<span class="kbv-tag">{esc(view["kb_name"])}</span>')
    if view.get("version"):
        tags.append(f'<span class="kbv-tag">v{int(view["version"])}</span>')
    if view.get("active") not in (1, None):
        cur = view.get("current_version")
        tags.append(f'<span class="kbv-tag kbv-tag-old">旧版本{f"（当前为 v{cur}）" if cur else ""}</span>')
    if view.get("page"):
        tags.append(f'<span class="kbv-tag kbv-page" data-page="{int(view["page"])}">第 {int(view["page"])} 页</span>')
    if view.get("source") == "ocr":
        tags.append('<span class="kbv-tag kbv-tag-ocr" title="本页没有可用的文字层">本页文字由 OCR 识别，可能有误</span>')
    tags.append(f'<a class="kbv-tag" href="/api/kb/documents/{doc_id}/file" target="_blank" rel="noopener">下载原文件</a>')
    ctx = f'<div class="kbv-ctx">{esc(view["context"])}</div>' if view.get("context") else ""
    text = view.get("text") or ""
    hl = next((c for c in view.get("chunks") or [] if c["chunk_id"] == view.get("highlight")), None)
    if hl:
        body = (f'{esc(text[:hl["start"]])}<mark class="kbv-hl" data-chunk="{int(hl["chunk_id"])}">'
                f'{esc(text[hl["start"]:hl["end"]])}</mark>{esc(text[hl["end"]:])}')
    else:
        body = esc(text) or '<span class="kbv-note">（没有文字）</span>'
    note = ('<div class="kbv-note">此文档入库较早，原文由它的块拼接而成（空白可能与原文略有不同）。</div>'
            if view.get("rebuilt_from_chunks") else "")
    flags = view.get("instruction_flags") or []
    if flags:  # sentences that try to give the model orders: marked in prompts, never quoted as an answer
        items = "".join(f"<li>{esc(f)}</li>" for f in flags[:10])
        note += (f'<details class="kbv-note kbv-flags" data-flags="{len(flags)}"><summary>⚠ 含 {len(flags)} 句疑似指令的'
                 f'文字（不会作为原文摘录答案，提示大模型时注明）</summary><ul>{items}</ul></details>')
    part, parts = int(view.get("part") or 1), int(view.get("parts") or 1)
    nav = ""
    if parts > 1:
        prev_dis = " disabled" if part <= 1 else ""
        next_dis = " disabled" if part >= parts else ""
        nav = (f'<div class="kbv-nav"><button data-doc="{doc_id}" data-part="{part - 1}"{prev_dis}>上一部分</button>'
               f'<span>第 {part} / {parts} 部分</span>'
               f'<button data-doc="{doc_id}" data-part="{part + 1}"{next_dis}>下一部分</button></div>')
    return (f'<div class="kbv" data-doc="{doc_id}" data-part="{part}" data-highlight="{esc(view.get("highlight"))}">'
            f'<div class="kbv-head">{" ".join(tags)}</div>{ctx}{note}<div class="kbv-text">{body}</div>{nav}'
            f'{page_image_html(page_jpeg, boxed)}</div>')


@dataclass
class Viewer:
    group: gr.Group
    outputs: list
    policy: Any = None  # pipeline.access.AccessPolicy: who may read which knowledge base

    def connect(self, component: gr.HTML, engine) -> None:
        """`component`'s trigger('click', {chunk_id} | {doc_id, part}) opens the viewer."""
        component.click(make_open(engine, self.policy), None, self.outputs, api_name=False, show_progress="hidden")


def make_open(engine, policy=None):
    def open_viewer(evt: gr.EventData, request: gr.Request):
        data = getattr(evt, "_data", None) or {}
        try:
            page_jpeg, boxed = None, False
            reader = guard.reader_of(policy, request)  # a source of a KB the caller may not read: 4003
            if data.get("chunk_id"):
                chunk_id = int(data["chunk_id"])
                view = engine.document_text(engine.chunk_document(chunk_id), chunk_id=chunk_id, reader=reader)
                if view["file_type"] == "pdf" and view.get("page"):
                    page_jpeg, boxed = engine.page_image(view["doc_id"], view["page"], chunk_id, reader)
            elif data.get("doc_id"):
                view = engine.document_text(int(data["doc_id"]), part=int(data.get("part") or 1), reader=reader)
            else:
                return gr.skip(), gr.skip()
        except Exception as exc:  # EngineError: the document was deleted meanwhile, …
            msg = guard.failure_text(exc, "viewer")
            return gr.update(visible=True), f'<div class="kbv-note">⚠️ {esc(msg)}</div>'
        return gr.update(visible=True), viewer_html(view, page_jpeg, boxed)

    return open_viewer


def build_viewer(engine, elem_id: str, policy=None) -> Viewer:
    """The drawer (hidden until a source is clicked). Place it anywhere in the tab; it floats on the right."""
    with gr.Group(visible=False, elem_classes=["kbv-drawer"], elem_id=f"{elem_id}-drawer") as group:
        with gr.Row(equal_height=True):
            gr.HTML("<b>原文</b>")
            close = gr.Button("关闭", size="sm", scale=0, min_width=70, elem_id=f"{elem_id}-close")
        html = gr.HTML("", css_template=VIEWER_CSS, js_on_load=VIEWER_JS, elem_id=elem_id)
    close.click(lambda: gr.update(visible=False), None, group, api_name=False, queue=False)
    viewer = Viewer(group, [group, html], policy)
    viewer.connect(html, engine)  # its own 上一部分 / 下一部分
    return viewer
