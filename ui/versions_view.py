"""版本 panel of the document table: every version of a document with its date and state, 恢复 for old ones.

Restoring makes that version the active one (the current one becomes inactive, kept for answers that cited it).
API name: kb_restore.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .render import esc
from .safe_markdown import safe_markdown

VERSIONS_CSS = """
table.kbv { border-collapse: collapse; font-size: .88rem; width: 100%; }
table.kbv td, table.kbv th { border-bottom: 1px solid var(--border-color-primary); padding: 4px 8px; text-align: left; }
.kbv-active { color: #1a7f37; font-weight: 600; }
.kbv-old { opacity: .75; }
.kbv-restore { cursor: pointer; border: 1px solid var(--border-color-primary); border-radius: 6px; padding: 1px 10px;
               background: var(--button-secondary-background-fill); }
"""
VERSIONS_JS = """
element.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-act="restore"]');
  if (!b || b.disabled) return;
  trigger('click', {act: 'restore', doc_id: Number(b.dataset.id)});
});
"""
STATE_LABELS = {1: "当前版本", 0: "旧版本", 2: "新版本（就绪后生效）"}


def versions_html(versions: list[dict], can_restore: bool = True) -> str:
    if not versions:
        return '<div class="kbt-empty">没有版本记录</div>'
    rows = []
    for v in versions:
        active = int(v.get("active") or 0)
        state = STATE_LABELS.get(active, "")
        if v.get("status") != "ready":
            state = f"{v.get('status_label') or v.get('status')}" + (f"：{v['fail_reason']}" if v.get("fail_reason")
                                                                     else "")
        action = ""
        if can_restore and active == 0 and v.get("status") == "ready":
            action = f'<button class="kbv-restore" data-act="restore" data-id="{int(v["doc_id"])}">恢复此版本</button>'
        cls = "kbv-active" if active == 1 else "kbv-old"
        rows.append(f'<tr data-doc="{int(v["doc_id"])}" data-active="{active}" class="{cls}">'
                    f'<td>v{int(v.get("version") or 1)}</td><td>{esc(state)}</td>'
                    f'<td>{esc(str(v.get("created_at") or "")[:19])}</td>'
                    f'<td class="kbt-num">{esc(v.get("chunk_count"))} 块</td><td>{action}</td></tr>')
    return ('<table class="kbv"><thead><tr><th>版本</th><th>状态</th><th>上传时间</th><th>块数</th><th></th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


@dataclass
class VersionsPanel:
    group: gr.Group
    title: gr.Markdown
    view: gr.HTML
    msg: gr.Markdown


def build_versions_panel() -> VersionsPanel:
    with gr.Group(visible=False, elem_id="kb-versions-panel") as group:
        with gr.Row(equal_height=True):
            title = gr.Markdown("")
            close = gr.Button("关闭", size="sm", scale=0, min_width=70)
        view = gr.HTML("", css_template=VERSIONS_CSS, js_on_load=VERSIONS_JS, elem_id="kb-versions")
        msg = gr.Markdown("", elem_id="kb-versions-msg")
    close.click(lambda: gr.update(visible=False), None, group, api_name=False)
    return VersionsPanel(group, title, view, msg)


def show_versions(engine, doc_id: int) -> tuple[str, str]:
    """(title, table) of the versions of the document `doc_id` belongs to."""
    versions = engine.document_versions(doc_id)
    name = versions[0]["file_name"] if versions else ""
    return f"**{safe_markdown(name)}** 的版本（共 {len(versions)} 个）", versions_html(versions)
