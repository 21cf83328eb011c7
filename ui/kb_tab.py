"""知识库 tab: upload, document table, chunk viewer, delete, 全量重建 — plus the 双路检索调试 sub-tab.

Everything goes through engine methods (upload / list_documents / document_chunks / delete_document /
start_rebuild / rebuild_status / health). Every handler re-checks the caller against the AccessPolicy on the
server (a hidden tab is not security): KB actions need a kb admin; the debug search is open to every user.

API names (for gradio_client and tests): kb_list, kb_upload, kb_chunks, kb_delete, kb_rebuild, kb_audit,
kb_repair, debug_search. 审计 needs a kb admin; 修复 (repair of derived state) needs an admin.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import gradio as gr

from pipeline.access.policy import DENIED_TEXT, AccessPolicy, Role
from pipeline.ingestion.progress import UNITS, format_eta, stage_text
from pipeline.retrieval.kb_indexes import DEFAULT_KB_ID

from . import guard
from .audit_view import AUDIT_CSS, audit_html, repair_html
from .chunk_editor import EDITOR_CSS, build_chunk_editor, chunk_marks
from .confirm import confirm_panel
from .debug_view import build_debug_view
from .doc_tags_editor import build_doc_tags_editor
from .guard import reader_of, request_user
from .header import badge_html
from .kb_spaces import build_kb_manager, kb_choices
from .render import esc
from .safe_markdown import safe_markdown
from .sources_section import build_sources_section
from .upload_preview import build_upload_preview
from .versions_view import build_versions_panel, show_versions
from .viewer import OPENER_JS, build_viewer

log = logging.getLogger(__name__)

PAGE_SIZE = 10
REFRESH_SECONDS = 3
FILE_TYPES = [".txt", ".md", ".pdf", ".docx", ".xlsx", ".csv"]
MAX_CHUNKS_SHOWN = 300
DENIED = DENIED_TEXT[Role.KB_ADMIN]

TABLE_CSS = """
.kbt-wrap { overflow-x: auto; }
table.kbt { width: 100%; border-collapse: collapse; font-size: .9rem; }
table.kbt th, table.kbt td { border-bottom: 1px solid var(--border-color-primary); padding: 5px 8px; text-align: left;
                             vertical-align: middle; }
table.kbt th { font-weight: 600; white-space: nowrap; }
table.kbt td.kbt-name { max-width: 320px; word-break: break-all; font-weight: 600; }
table.kbt td.kbt-num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.kbt td.kbt-reason { color: #b42318; max-width: 260px; font-size: .85rem; }
.kbt-note { color: #8a5200; }
.kbt-pending { font-size: .8rem; color: #1d4ed8; }
td.kbt-ver { white-space: nowrap; }
table.kbt td.kbt-time { white-space: nowrap; font-size: .85rem; opacity: .8; }
.kbt-status { display: inline-flex; align-items: center; gap: 6px; padding: 1px 8px; border-radius: 999px;
              font-size: .85rem; white-space: nowrap; }
.kbt-ready { background: #e7f6ec; color: #1a7f37; }
.kbt-failed { background: #fdecea; color: #b42318; }
.kbt-processing { background: #e8f0fe; color: #1d4ed8; }
.kbt-bar { height: 6px; border-radius: 3px; background: var(--border-color-primary); margin: 4px 0 2px; min-width: 120px;
           overflow: hidden; }
.kbt-bar-fill { height: 100%; background: #1d4ed8; transition: width .4s; }
.kbt-eta { display: block; font-size: .78rem; opacity: .75; }
.kbt-spin { width: 12px; height: 12px; border: 2px solid currentColor; border-right-color: transparent;
            border-radius: 50%; display: inline-block; animation: kbt-rot .8s linear infinite; }
@keyframes kbt-rot { to { transform: rotate(360deg); } }
.kbt-act { cursor: pointer; border: 1px solid var(--border-color-primary); background: var(--button-secondary-background-fill);
           border-radius: 6px; padding: 2px 10px; margin-right: 4px; font-size: .85rem; }
.kbt-act:hover { background: var(--button-secondary-background-fill-hover); }
.kbt-act.kbt-del { color: #b42318; }
.kbt-act[disabled] { opacity: .45; cursor: not-allowed; }
.kbt-empty { padding: 16px; text-align: center; opacity: .7; }
.kbc-list { display: flex; flex-direction: column; gap: 6px; max-height: 560px; overflow-y: auto; }
.kbc { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 6px 10px; }
.kbc-head { font-size: .8rem; opacity: .75; }
.kbc-text { white-space: pre-wrap; font-size: .88rem; margin-top: 2px; }
.kbu-list { margin: 0; padding-left: 1.1em; font-size: .9rem; }
.kbu-ok { color: #1a7f37; } .kbu-dup { color: #8a5200; } .kbu-bad { color: #b42318; }
"""

# Row buttons → one 'click' event carrying {act, doc_id, name}; delegated so it survives every re-render.
TABLE_JS = """
element.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-act]');
  if (!b || b.disabled) return;
  trigger('click', {act: b.dataset.act, doc_id: Number(b.dataset.id)});
});
"""


# ---------------------------------------------------------------------------------------------- rendering
def fmt_size(n: Any) -> str:
    try:
        n = int(n)
    except (TypeError, ValueError):
        return "—"
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / 1024 / 1024:.1f} MB"


def progress_html(doc: dict) -> str:
    """Stage text, a bar (counted stages: OCR pages, embedded chunks) and the ETA of a processing document."""
    stage = doc.get("stage")
    done, total = doc.get("done") or 0, doc.get("total") or 0
    text = stage_text(stage, done, total, doc.get("position")) if stage else (doc.get("progress") or "")
    pct = 100.0 * done / total if total else 0.0
    bar = (f'<div class="kbt-bar" data-stage="{esc(stage)}" data-done="{int(done)}" data-total="{int(total)}">'
           f'<div class="kbt-bar-fill" style="width:{pct:.1f}%"></div></div>') if stage in UNITS and total else ""
    eta = f'<span class="kbt-eta" data-eta="{esc(doc.get("eta_s"))}">{esc(format_eta(doc.get("eta_s")))}</span>'
    return (f'<span class="kbt-status kbt-processing"><span class="kbt-spin"></span>'
            f'{esc(doc.get("status_label") or "处理中")}{" · " + esc(text) if text else ""}</span>{bar}{eta}')


def status_html(doc: dict) -> str:
    st = doc.get("status")
    label = doc.get("status_label") or st or ""
    if st == "processing":
        return progress_html(doc)
    cls = {"ready": "kbt-ready", "failed": "kbt-failed"}.get(st, "")
    return f'<span class="kbt-status {cls}">{esc(label)}</span>'


def version_cell(doc: dict, disabled: str = "") -> str:
    """v2 (and a 版本 button when the document has several versions); a new version not yet active says so."""
    v = int(doc.get("version") or 1)
    label = f"v{v}"
    if doc.get("active") == 2:
        label += '<span class="kbt-pending" title="就绪后替换当前版本">（新版本）</span>'
    n = int(doc.get("versions") or 1)
    button = (f'<button class="kbt-act" data-act="versions" data-id="{int(doc["doc_id"])}">版本 ({n})</button>'
              if n > 1 else "")
    return f"{label} {button}"


def note_html(doc: dict) -> str:
    """The parser's remarks on a document (empty sheet skipped, OCR off for some pages, …)."""
    note = doc.get("note")
    return f'<div class="kbt-note">{esc(note)}</div>' if note else ""


def table_html(items: list[dict], *, busy: bool = False, keyword: str = "") -> str:
    if not items:
        msg = f"没有文件名包含「{esc(keyword)}」的文档" if keyword else "知识库还没有文档，拖拽文件到上方上传"
        return f'<div class="kbt-empty">{msg}</div>'
    dis = " disabled" if busy else ""
    head = "".join(f"<th>{h}</th>" for h in ("文件名", "版本", "类型", "大小", "块数", "状态", "原因", "上传时间",
                                             "操作"))
    rows = []
    for d in items:
        did = int(d["doc_id"])
        chunks = d.get("chunk_count")
        rows.append(
            f'<tr data-doc="{did}" data-status="{esc(d.get("status"))}">'
            f'<td class="kbt-name">{esc(d.get("file_name"))}</td>'
            f'<td class="kbt-ver">{version_cell(d, dis)}</td>'
            f'<td>{esc((d.get("file_type") or "").upper())}</td>'
            f'<td class="kbt-num">{fmt_size(d.get("file_size"))}</td>'
            f'<td class="kbt-num">{esc(chunks if chunks is not None else "—")}</td>'
            f"<td>{status_html(d)}</td>"
            f'<td class="kbt-reason">{esc(d.get("fail_reason") or "")}'
            f'{note_html(d)}</td>'
            f'<td class="kbt-time">{esc(str(d.get("created_at") or "")[:19])}</td>'
            f'<td style="white-space:nowrap"><button class="kbt-act" data-act="view" data-id="{did}">查看块</button>'
            f'<button class="kbt-act kbt-del" data-act="delete" data-id="{did}"{dis}>删除</button></td></tr>')
    return (f'<div class="kbt-wrap"><table class="kbt"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def rebuild_text(st: dict) -> str:
    """全量重建 3/10 个文档 · 当前 x.pdf（向量化 40/120 块）· 约 2 分钟."""
    text = f"全量重建 {int(st.get('done') or 0)}/{int(st.get('total') or 0)} 个文档"
    if st.get("current"):
        stage = f"（{st['current_stage']}）" if st.get("current_stage") else ""
        text += f" · 当前 {safe_markdown(st['current'])}{safe_markdown(stage)}"  # shown in a gr.Markdown
    if st.get("done"):
        text += f" · 剩余{format_eta(st.get('eta_s'))}"
    return text


def upload_report_html(results: list[dict]) -> str:
    if not results:
        return ""
    lines = []
    n_ok = n_dup = n_bad = 0
    for r in results:
        name = esc(r.get("file_name"))
        if not r.get("ok"):
            n_bad += 1
            lines.append(f'<li class="kbu-bad" data-result="refused">✗ {name}：已拒绝 — {esc(r.get("msg"))}</li>')
        elif r.get("existed"):
            n_dup += 1
            lines.append(f'<li class="kbu-dup" data-result="existed">● {name}：内容相同的文档已存在'
                         f'（{esc(r.get("status"))}），未重复导入</li>')
        else:
            n_ok += 1
            lines.append(f'<li class="kbu-ok" data-result="accepted">✓ {name}：已接收，正在解析与入库</li>')
    head = f"上传结果：接收 {n_ok} 个" + (f"，已存在 {n_dup} 个" if n_dup else "") + (f"，拒绝 {n_bad} 个" if n_bad else "")
    return f'<div class="kbu"><b>{head}</b><ul class="kbu-list">{"".join(lines)}</ul></div>'


def chunks_html(chunks: list[dict]) -> str:
    if not chunks:
        return '<div class="kbt-empty">这个文档还没有块（处理中或失败）</div>'
    cards = []
    for c in chunks[:MAX_CHUNKS_SHOWN]:
        meta = [f"块 {esc(c.get('chunk_id'))}", f"序号 {esc(c.get('chunk_index'))}"]
        if c.get("page"):
            meta.append(f"第 {esc(c['page'])} 页")
        if c.get("char_start") is not None and c.get("char_end") is not None:
            meta.append(f"字符 {esc(c['char_start'])}–{esc(c['char_end'])}")
        if c.get("source") and c.get("source") != "text":
            meta.append(esc(c["source"]))
        if c.get("context"):
            meta.append(f'<span class="kbc-ctx">{esc(c["context"])}</span>')
        meta.extend(chunk_marks(c))  # length, 已停用, 已修改, 手动添加 (ui/chunk_editor.py)
        cards.append(f'<div class="kbc" data-chunk="{esc(c.get("chunk_id"))}" data-view-chunk="{esc(c.get("chunk_id"))}"'
                     f' title="点击查看原文中的位置"><div class="kbc-head">'
                     f'{" · ".join(meta)}</div><div class="kbc-text">{esc(c.get("text"))}</div></div>')
    more = (f'<div class="kbt-empty">仅显示前 {MAX_CHUNKS_SHOWN} 块（共 {len(chunks)} 块）</div>'
            if len(chunks) > MAX_CHUNKS_SHOWN else "")
    return f'<div class="kbc-list">{"".join(cards)}</div>{more}'


# ---------------------------------------------------------------------------------------------- the tab
def build_kb_tab(engine, badge=None, policy: AccessPolicy | None = None) -> dict[str, Any]:
    """知识库 tab body. `badge` is the header component refreshed with ui.header.badge_html(engine)."""
    policy = policy or AccessPolicy()

    def allowed(request) -> bool:
        return policy.allows(request_user(request), Role.KB_ADMIN)

    def require(request) -> None:
        guard.require(policy, request, Role.KB_ADMIN)

    with gr.Tabs():
        with gr.Tab("文档管理", id="kb-docs"):
            spaces = build_kb_manager(engine, policy)
            upload = gr.File(label="拖拽或点击上传（txt / md / pdf / docx / xlsx / csv，单个 ≤ 20 MB，一次 ≤ 10 个）",
                             file_count="multiple", file_types=FILE_TYPES, height=140, elem_id="kb-upload")
            upload_msg = gr.HTML("", elem_id="kb-upload-msg", css_template=TABLE_CSS)
            doc_tags = build_doc_tags_editor(engine, policy)  # upload tags + 标签与元数据 (ui/doc_tags_editor.py)
            preview = build_upload_preview(engine, policy, FILE_TYPES)  # 预览分块, this KB's chunking
            sources = build_sources_section(engine, policy)  # 网页 and the synced folder (ui/sources_section.py)
            with gr.Row(equal_height=True):
                keyword = gr.Textbox(show_label=False, placeholder="按文件名搜索", scale=4, max_lines=1,
                                     elem_id="kb-keyword", container=False)
                search_btn = gr.Button("搜索", scale=1, min_width=70)
                refresh_btn = gr.Button("刷新", scale=1, min_width=70)
                rebuild_btn = gr.Button("全量重建", variant="stop", scale=1, min_width=100, elem_id="kb-rebuild")
            with gr.Group(visible=False) as rebuild_confirm:
                gr.Markdown("**确定要全量重建知识库吗？** 将按当前切块参数和 Embedding 模型重新处理全部文档，"
                            "期间不能上传或删除文档，检索结果可能暂时不完整。")
                with gr.Row():
                    rebuild_yes = gr.Button("确认重建", variant="stop")
                    rebuild_no = gr.Button("取消")
            rebuild_msg = gr.Markdown("", elem_id="kb-rebuild-msg", min_height=24)
            with gr.Row(equal_height=True):
                audit_btn = gr.Button("审计", size="sm", scale=0, min_width=80, elem_id="kb-audit")
                repair_btn = gr.Button("修复", size="sm", scale=0, min_width=80, elem_id="kb-repair")
                gr.Markdown("审计：核对 SQLite、BM25 分词、向量库与原始文件是否一致（只读）；"
                            "修复：只重建派生数据，从不改动原始文件和文本（需管理员）")
            audit_view = gr.HTML("", css_template=AUDIT_CSS, elem_id="kb-audit-report")
            table = gr.HTML(table_html([]), css_template=TABLE_CSS, js_on_load=TABLE_JS, elem_id="kb-table")
            with gr.Row(equal_height=True):
                prev_btn = gr.Button("上一页", size="sm", scale=0, min_width=80)
                page_info = gr.Markdown("", elem_id="kb-page-info")
                next_btn = gr.Button("下一页", size="sm", scale=0, min_width=80)
            page = gr.Number(1, visible=False, precision=0)
            del_id = gr.Number(None, visible=False, precision=0)
            view_id = gr.Number(None, visible=False, precision=0)
            panel = confirm_panel("确认删除", "kb-del-yes")
            del_confirm, del_text, del_yes, del_no = panel.group, panel.text, panel.yes, panel.no
            del_msg = gr.Markdown("", elem_id="kb-del-msg")
            with gr.Group(visible=False) as chunk_panel:
                with gr.Row(equal_height=True):
                    chunk_title = gr.Markdown("")
                    chunk_close = gr.Button("关闭", size="sm", scale=0, min_width=70)
                chunk_view = gr.HTML("", css_template=TABLE_CSS + EDITOR_CSS, elem_id="kb-chunks", js_on_load=OPENER_JS)
                editor = build_chunk_editor(engine, policy, view_id, chunk_view, chunks_html)
            versions = build_versions_panel()
            view_btn = gr.Button("查看块", visible=False)  # the API route of the row action (kb_chunks)
            timer = gr.Timer(REFRESH_SECONDS, active=False)
        with gr.Tab("双路检索调试", id="kb-debug"):
            debug = build_debug_view(engine, policy)
    viewer = build_viewer(engine, "kb-viewer-kb", policy)
    viewer.connect(chunk_view, engine)
    for column in debug["columns"]:
        viewer.connect(column, engine)

    list_outputs = [table, page_info, page, timer, upload, rebuild_btn, rebuild_yes, del_yes]
    if badge is not None:
        list_outputs.append(badge)

    def list_values(pg: Any, kw: Any, request=None, kb: Any = DEFAULT_KB_ID, *, clear_upload: bool = False) -> tuple:
        kw = (kw or "").strip()
        if not allowed(request):
            vals = [f'<div class="kbt-empty">{DENIED}</div>', "", 1, gr.Timer(active=False),
                    gr.update(interactive=False), gr.update(interactive=False), gr.update(interactive=False),
                    gr.update(interactive=False)]
            if badge is not None:
                vals.append(gr.skip())
            return tuple(vals)
        pg = max(1, guard.to_int(pg, 1))
        kb = guard.to_int(kb, DEFAULT_KB_ID)
        try:
            res = engine.list_documents(pg, PAGE_SIZE, kw, kb)
        except Exception:  # the knowledge base was deleted meanwhile (another tab): show the default one
            kb = DEFAULT_KB_ID
            res = engine.list_documents(pg, PAGE_SIZE, kw, kb)
        pages = max(1, math.ceil(res["total"] / PAGE_SIZE))
        if pg > pages:
            pg = pages
            res = engine.list_documents(pg, PAGE_SIZE, kw, kb)
        rb = engine.rebuild_status()
        busy = bool(rb.get("running"))
        processing = int(engine.health().get("processing") or 0)
        info = f"共 {res['total']} 个文档 · 第 {pg} / {pages} 页"
        if processing:
            info += f" · 处理中 {processing} 个（每 {REFRESH_SECONDS} 秒自动刷新）"
        if busy:
            info += f" · {rebuild_text(rb)}"
        up = gr.update(interactive=not busy, value=None) if clear_upload else gr.update(interactive=not busy)
        vals = [table_html(res["items"], busy=busy, keyword=kw), info, pg,
                gr.Timer(active=bool(processing or busy)), up,
                gr.update(interactive=not busy), gr.update(interactive=not busy), gr.update(interactive=not busy)]
        if badge is not None:
            vals.append(badge_html(engine))
        return tuple(vals)

    # --- handlers (each re-checks the caller) -----------------------------------------------------------
    # Handlers take `request` before `kb` (Gradio injects the request by its annotation wherever it stands), so
    # direct calls made before knowledge bases existed — (pg, kw, request) — still mean the default KB.
    def kb_list(pg, kw, request: gr.Request, kb=DEFAULT_KB_ID):
        return list_values(pg, kw, request, kb)

    def kb_prev(pg, kw, request: gr.Request, kb=DEFAULT_KB_ID):
        return list_values(max(1, guard.to_int(pg, 1) - 1), kw, request, kb)

    def kb_next(pg, kw, request: gr.Request, kb=DEFAULT_KB_ID):
        return list_values(guard.to_int(pg, 1) + 1, kw, request, kb)

    def kb_search(kw, request: gr.Request, kb=DEFAULT_KB_ID):
        return list_values(1, kw, request, kb)

    def kb_upload(files, pg, kw, request: gr.Request, kb=DEFAULT_KB_ID, tags=None):
        require(request)
        items = guard.file_items(files)
        if not items:
            return ("", *list_values(pg, kw, request, kb, clear_upload=True))
        try:
            results = [r.to_dict() for r in engine.upload(items, guard.to_int(kb, DEFAULT_KB_ID), tags=tags or None,
                                                          actor=guard.page_actor(request))]
        except Exception as exc:  # EngineError: rebuild running / engine not ready / vectors of another model
            return (f'<div class="kbu-bad">上传未处理：{esc(guard.failure_text(exc, "upload"))}</div>',
                    *list_values(pg, kw, request, kb, clear_upload=True))
        # new documents are listed first: jump to page 1 unless a search hides them
        return (upload_report_html(results), *list_values(1 if not (kw or "").strip() else pg, kw, request, kb,
                                                          clear_upload=True))

    def kb_chunks(doc_id, request: gr.Request):
        require(request)
        if doc_id is None:
            return gr.update(visible=False), "", ""
        did = guard.to_int(doc_id, -1)
        try:
            doc = engine.get_document(did)
            chunks = engine.document_chunks(did)
        except Exception as exc:
            return gr.update(visible=True), f"⚠️ {esc(guard.error_text(exc))}", ""
        title = f"**{safe_markdown(doc.get('file_name'))}** 的块（共 {len(chunks)} 块）"
        return gr.update(visible=True), title, chunks_html(chunks)

    def kb_action(evt: gr.EventData, request: gr.Request):
        """A row button in the table: 查看块 → chunk panel; 版本 → versions panel; 删除 → confirmation panel."""
        data = getattr(evt, "_data", None) or {}
        act, did = data.get("act"), data.get("doc_id")
        if did is None or act not in ("view", "delete", "versions"):
            return {}
        require(request)
        did = guard.to_int(did, -1)
        if act == "view":
            panel, title, body = kb_chunks(did, request)
            return {view_id: did, chunk_panel: panel, chunk_title: title, chunk_view: body,
                    del_confirm: gr.update(visible=False), del_msg: ""}
        try:
            doc = engine.get_document(did)
        except Exception as exc:
            return {del_confirm: gr.update(visible=False), del_msg: f"⚠️ {esc(guard.error_text(exc))}"}
        if act == "versions":
            title, body = show_versions(engine, did)
            return {versions.group: gr.update(visible=True), versions.title: title, versions.view: body,
                    versions.msg: ""}
        n = doc.get("chunk_count") or 0
        whole = doc.get("active") == 1 and int(doc.get("versions") or 1) > 1
        what = f"它的全部 {doc['versions']} 个版本、" if whole else "它的 "
        text = (f"**确定删除「{safe_markdown(doc.get('file_name'))}」吗？** 将同时删除{what}{n} 个块、向量和原文件，"
                f"删除后无法恢复。")
        return {del_id: did, del_confirm: gr.update(visible=True), del_text: text, del_msg: ""}

    def kb_restore(evt: gr.EventData, pg, kw, kb, request: gr.Request):
        data = getattr(evt, "_data", None) or {}
        if data.get("act") != "restore" or data.get("doc_id") is None:
            return (gr.skip(),) * (3 + len(list_outputs))
        require(request)
        did = guard.to_int(data["doc_id"], -1)
        try:
            res = engine.restore_version(did)
            msg = f"已恢复为 v{res['version']}：之后的回答只引用这个版本"
        except Exception as exc:
            msg = f"⚠️ 恢复失败：{esc(guard.error_text(exc))}"
        title, body = show_versions(engine, did)
        return (title, body, msg, *list_values(pg, kw, request, kb))

    def kb_delete(doc_id, pg, kw, request: gr.Request, kb=DEFAULT_KB_ID):
        require(request)
        if doc_id is None:
            return (gr.update(visible=False), "", None, *list_values(pg, kw, request, kb))
        did = guard.to_int(doc_id, -1)
        try:
            res = engine.delete_document(did, actor=guard.page_actor(request))
            msg = f"已删除「{safe_markdown(res.get('file_name'))}」（{res.get('chunks_removed', 0)} 个块）"
        except Exception as exc:
            msg = f"⚠️ 删除失败：{esc(guard.failure_text(exc, 'delete'))}"
        return (gr.update(visible=False), msg, None, *list_values(pg, kw, request, kb))

    def kb_rebuild(pg, kw, request: gr.Request, kb=DEFAULT_KB_ID, progress=gr.Progress()):
        """全量重建 of every knowledge base (the table keeps showing the picked one)."""
        require(request)
        hide = gr.update(visible=False)
        try:
            engine.start_rebuild()
        except Exception as exc:
            yield (hide, f"⚠️ 无法开始全量重建：{esc(guard.error_text(exc))}", *list_values(pg, kw, request, kb))
            return
        log.info("full rebuild started by %r", request_user(request))
        yield (hide, "全量重建中…", *list_values(pg, kw, request, kb))
        last_yield = time.monotonic()
        while True:
            st = engine.rebuild_status()
            if not st.get("running"):
                break
            done, total = int(st.get("done") or 0), int(st.get("total") or 0)
            desc = rebuild_text(st)
            progress((done, total) if total else 0, desc=desc)
            if time.monotonic() - last_yield > REFRESH_SECONDS:
                last_yield = time.monotonic()
                yield (gr.skip(), desc, *list_values(pg, kw, request, kb))
            time.sleep(0.3)
        st = engine.rebuild_status()
        secs = (st.get("elapsed_ms") or 0) / 1000
        if st.get("error"):
            msg = f"⚠️ 全量重建出错：{esc(st['error'])}（用时 {secs:.1f} 秒）"
        else:
            msg = f"✅ 全量重建完成：{st.get('total', 0)} 个文档，用时 {secs:.1f} 秒"
        yield (hide, msg, *list_values(pg, kw, request, kb))

    def kb_audit(request: gr.Request):
        require(request)
        try:
            return audit_html(engine.audit())
        except Exception as exc:  # EngineError: engine loading
            return f'<div class="kbu-bad">审计未执行：{esc(guard.error_text(exc))}</div>'

    def kb_repair(request: gr.Request):
        guard.require(policy, request, Role.ADMIN)
        try:
            res = engine.repair()
        except Exception as exc:
            return f'<div class="kbu-bad">修复未执行：{esc(guard.failure_text(exc, "repair"))}</div>'
        log.info("repair by %r: %s → %s problems", request_user(request), res["before"], res["after"])
        return repair_html(res)

    # --- wiring -------------------------------------------------------------------------------------------
    def kb_load(request: gr.Request):
        return list_values(1, "", request)

    gr.on(None, kb_load, None, list_outputs, api_name=False, show_progress="hidden")  # page load
    kb = spaces.pick
    def load_kbs(request: gr.Request):  # page load: every user gets it, so only what the caller may read
        return gr.Dropdown(choices=kb_choices(engine, reader_of(policy, request)), value=DEFAULT_KB_ID)

    gr.on(None, load_kbs, None, [kb], api_name=False,
          show_progress="hidden")
    spaces.wire(lambda kb_id, request: list_values(1, "", request, kb_id), list_outputs)
    preview.wire(kb, lambda kb_id, request: list_values(1, "", request, kb_id), list_outputs, upload_msg,
                 upload_report_html)
    sources.wire(kb)
    refresh_btn.click(kb_list, [page, keyword, kb], list_outputs, api_name="kb_list")
    timer.tick(kb_list, [page, keyword, kb], list_outputs, api_name=False, show_progress="hidden",
               trigger_mode="always_last")
    search_btn.click(kb_search, [keyword, kb], list_outputs, api_name=False)
    keyword.submit(kb_search, [keyword, kb], list_outputs, api_name=False)
    prev_btn.click(kb_prev, [page, keyword, kb], list_outputs, api_name=False)
    next_btn.click(kb_next, [page, keyword, kb], list_outputs, api_name=False)

    upload.upload(kb_upload, [upload, page, keyword, kb, doc_tags.upload_tags], [upload_msg, *list_outputs],
                  api_name="kb_upload",
                  preprocess=False, concurrency_limit=1, show_progress_on=[upload_msg])

    table.click(kb_action, None, [view_id, chunk_panel, chunk_title, chunk_view, del_id, del_confirm, del_text,
                                  del_msg, versions.group, versions.title, versions.view, versions.msg],
                api_name=False).then(editor.load, [view_id], editor.outputs, api_name=False)
    versions.view.click(kb_restore, [page, keyword, kb], [versions.title, versions.view, versions.msg,
                                                          *list_outputs], api_name="kb_restore")
    view_btn.click(kb_chunks, [view_id], [chunk_panel, chunk_title, chunk_view], api_name="kb_chunks").then(
        editor.load, [view_id], editor.outputs, api_name=False)
    view_id.change(doc_tags.load, [view_id], [doc_tags.doc_id, doc_tags.tags, doc_tags.meta, doc_tags.info],
                   api_name=False, show_progress="hidden")  # 查看块 also opens the document's tags
    chunk_close.click(lambda: gr.update(visible=False), None, chunk_panel, api_name=False)
    del_yes.click(kb_delete, [del_id, page, keyword, kb], [del_confirm, del_msg, del_id, *list_outputs],
                  api_name="kb_delete", concurrency_limit=1, show_progress_on=[del_msg])
    del_no.click(lambda: (gr.update(visible=False), None), None, [del_confirm, del_id], api_name=False)

    audit_btn.click(kb_audit, None, audit_view, api_name="kb_audit", concurrency_limit=1,
                    show_progress_on=[audit_view])
    repair_btn.click(kb_repair, None, audit_view, api_name="kb_repair", concurrency_limit=1,
                     show_progress_on=[audit_view])
    rebuild_btn.click(lambda: gr.update(visible=True), None, rebuild_confirm, api_name=False)
    rebuild_no.click(lambda: gr.update(visible=False), None, rebuild_confirm, api_name=False)
    rebuild_yes.click(kb_rebuild, [page, keyword, kb], [rebuild_confirm, rebuild_msg, *list_outputs],
                      api_name="kb_rebuild", concurrency_limit=1, show_progress_on=[rebuild_msg])

    return {"upload": upload, "table": table, "timer": timer, "page": page, "keyword": keyword, "debug": debug,
            "kb": kb, "preview": preview, "handlers": {"kb_list": kb_list, "kb_upload": kb_upload, "kb_chunks": kb_chunks,
                                   "kb_delete": kb_delete, "kb_rebuild": kb_rebuild, "kb_restore": kb_restore,
                                   "kb_audit": kb_audit, "kb_repair": kb_repair}}
