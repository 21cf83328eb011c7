"""反馈 tab (knowledge-base admins): the feedback users gave, a JSONL export, and verified Q&A entries.

Pick a feedback item → its question and answer fill the form; edit the answer and 创建已核实问答: the entry is
indexed like a small document (both routes) and cited as 「已核实问答」. Entries can be deleted (they leave
retrieval). Every handler checks the role on the server side as well (the tab is only shown to KB admins).
API names: /feedback_list, /feedback_export, /feedback_pick, /verified_create, /verified_list, /verified_delete.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role
from pipeline.errors import EngineError

from .guard import request_user, require
from .render import doc_label, esc, snippet

FILTERS = {"全部": None, "仅 👎": "down", "仅 👍": "up"}
PAGE = 100


def render_feedback(items: list[dict], total: int) -> str:
    if not items:
        return '<div class="kb-muted" id="kb-fba-empty">还没有反馈。</div>'
    rows = []
    for f in items:
        rating = "👍" if f["rating"] == "up" else "👎"
        srcs = "；".join(f"[{s.get('no')}] {doc_label(s)}" for s in f.get("sources") or [] if s.get("cited")) or "—"
        rows.append(
            f'<tr data-fb="{f["fb_id"]}" data-rating="{esc(f["rating"])}"><td>{f["fb_id"]}</td>'
            f'<td>{esc(f["created_at"])}</td><td>{esc(f["user"] or "—")}</td><td>{rating}</td>'
            f'<td>{esc(f.get("reason") or "")}</td><td>{esc(f.get("comment") or "")}</td>'
            f'<td>{esc(f["question"])}</td><td class="kb-snip">{esc(snippet(f["answer"], 120))}</td>'
            f'<td class="kb-snip">{esc(srcs)}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("#", "时间", "用户", "评价", "原因", "说明", "问题", "回答", "引用"))
    return (f'<div class="kb-muted">共 {total} 条（最新在前）</div><table class="kb-trace-table" id="kb-fba-table">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')


def render_verified(entries: list[dict]) -> str:
    if not entries:
        return '<div class="kb-muted">还没有已核实问答。</div>'
    rows = []
    for e in entries:
        status = {"ready": "已入库", "processing": "入库中", "failed": "失败"}.get(e.get("status"), e.get("status"))
        cited = "；".join(doc_label(c) for c in e.get("cited") or []) or "—"
        rows.append(f'<tr data-qa="{e["qa_id"]}"><td>{e["qa_id"]}</td><td>{esc(e["question"])}</td>'
                    f'<td class="kb-snip">{esc(snippet(e["answer"], 120))}</td><td>{esc(cited)}</td>'
                    f'<td>{esc(status)}</td><td>{esc(e["created_by"] or "—")}</td><td>{esc(e["created_at"])}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("#", "问题", "答案", "依据", "状态", "创建人", "时间"))
    return (f'<table class="kb-trace-table" id="kb-qa-table"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


SOURCES_KB = "来源所在的知识库（默认）"


def build_feedback_tab(engine, policy: AccessPolicy | None = None):
    policy = policy or AccessPolicy()
    export_dir = Path(tempfile.mkdtemp(prefix="kbqa-feedback-"))

    gr.Markdown("用户对回答的 👍 / 👎 反馈。可以把好的回答（修改后）保存为 **已核实问答**：它会像一篇小文档一样进入"
                "检索（BM25 与向量两路），之后同样的问题会引用它（标注「已核实问答」）；删除后即从检索中移除。")
    with gr.Row(equal_height=True):
        flt = gr.Radio(list(FILTERS), value="全部", label="筛选", elem_id="kb-fba-filter", scale=3)
        refresh = gr.Button("刷新", size="sm", elem_id="kb-fba-refresh", scale=1)
        export_btn = gr.Button("导出 JSONL", size="sm", elem_id="kb-fba-export", scale=1)
    export_file = gr.File(label="导出的反馈", visible=False, interactive=False, elem_id="kb-fba-file")
    listing = gr.HTML(render_feedback([], 0), elem_id="kb-fba-list")

    gr.Markdown("### 由反馈创建已核实问答")
    with gr.Row(equal_height=True):
        pick = gr.Number(label="反馈编号 #", precision=0, elem_id="kb-qa-pick", scale=1)
        load = gr.Button("载入该回答", size="sm", elem_id="kb-qa-load", scale=1)
    qa_question = gr.Textbox(label="问题", elem_id="kb-qa-question")
    qa_answer = gr.Textbox(label="核实后的答案（可修改）", lines=4, elem_id="kb-qa-answer")
    cited_view = gr.HTML("", elem_id="kb-qa-cited")
    # filled in when an item is loaded (KB admins only: the page built before login names no restricted KB)
    target = gr.Dropdown(choices=[(SOURCES_KB, 0)], value=0, label="保存到知识库", elem_id="kb-qa-kb",
                         interactive=True, filterable=False)
    with gr.Row():
        create = gr.Button("创建已核实问答", variant="primary", size="sm", elem_id="kb-qa-create")
        qa_status = gr.HTML("", elem_id="kb-qa-status")
    gr.Markdown("### 已核实问答")
    verified = gr.HTML(render_verified([]), elem_id="kb-qa-list")
    with gr.Row(equal_height=True):
        del_id = gr.Number(label="已核实问答编号 #", precision=0, elem_id="kb-qa-del-id", scale=1)
        delete = gr.Button("删除", size="sm", variant="stop", elem_id="kb-qa-delete", scale=1)

    def check(request) -> None:
        require(policy, request, Role.KB_ADMIN)  # raises gr.Error with the refusal text

    def show_list(filter_label: str, request: gr.Request):
        check(request)
        data = engine.list_feedback(FILTERS.get(filter_label), 1, PAGE)
        return render_feedback(data["items"], data["total"])

    def do_export(filter_label: str, request: gr.Request):
        check(request)
        path = export_dir / f"feedback-{FILTERS.get(filter_label) or 'all'}.jsonl"
        path.write_text(engine.export_feedback(FILTERS.get(filter_label)), encoding="utf-8")
        return gr.File(value=str(path), visible=True)

    def do_pick(fb_id, request: gr.Request):
        check(request)
        try:
            fb = engine.get_feedback(int(fb_id)) if fb_id is not None else None
        except EngineError as exc:
            gr.Warning(exc.msg)
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if fb is None:
            gr.Warning("请填写反馈编号")
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        cited = [s for s in fb["sources"] if s.get("cited")] or fb["sources"]
        cards = "".join(f'<li>[{esc(s.get("no"))}] {esc(doc_label(s))}：{esc(snippet(s.get("text"), 80))}</li>'
                        for s in cited)
        cited_html = f'<div class="kb-muted">依据的片段：</div><ul>{cards or "<li>无</li>"}</ul>'
        kbs = gr.Dropdown(choices=[(SOURCES_KB, 0), *((k["name"], k["kb_id"]) for k in engine.list_kbs())], value=0)
        return fb["question"], fb["answer"], cited_html, kbs

    def do_create(fb_id, question, answer, request: gr.Request, kb=0):
        check(request)
        try:
            # kb 0: where its sources are (refused where that would widen who reads them: KBAccess.place_copy)
            e = engine.create_verified(question, answer, request_user(request), int(fb_id) if fb_id else None,
                                       int(kb) if kb else None)
        except EngineError as exc:
            gr.Warning(exc.msg)
            return f'<span class="kb-qa-error">⚠️ {esc(exc.msg)}</span>', gr.skip()
        return (f'<span class="kb-qa-done" data-qa="{e["qa_id"]}">✓ 已创建已核实问答 #{e["qa_id"]}，正在入库</span>',
                render_verified(engine.list_verified()))

    def show_verified(request: gr.Request):
        check(request)
        return render_verified(engine.list_verified())

    def do_delete(qa_id, request: gr.Request):
        check(request)
        try:
            engine.delete_verified(int(qa_id) if qa_id is not None else None)
        except EngineError as exc:
            gr.Warning(exc.msg)
            return gr.skip()
        return render_verified(engine.list_verified())

    gr.on([flt.change, refresh.click], show_list, [flt], [listing], api_name="feedback_list", queue=False)
    export_btn.click(do_export, [flt], [export_file], api_name="feedback_export", queue=False)
    load.click(do_pick, [pick], [qa_question, qa_answer, cited_view, target], api_name="feedback_pick", queue=False)
    create.click(do_create, [pick, qa_question, qa_answer, target], [qa_status, verified], api_name="verified_create",
                 queue=False)
    refresh.click(show_verified, None, [verified], api_name="verified_list", queue=False)
    delete.click(do_delete, [del_id], [verified], api_name="verified_delete", queue=False)
    return listing, verified, show_list, show_verified, flt
