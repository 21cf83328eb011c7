"""审计 tab (admins): the audit log — questions through every door and admin actions — with filters and export."""
from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role

from .guard import require
from .render import esc

PAGE = 100
DOORS = {"全部": None, "页面": "page", "REST": "rest", "OpenAI 兼容": "openai", "MCP": "mcp", "脚本": "internal"}
KINDS = {"全部": None, "提问": "question", "管理操作": "admin"}
OUTCOMES = {"全部": None, "回答": "answer", "低相关": "weak", "拒答": "refuse", "出错": "error", "中断": "aborted",
            "完成（管理操作）": "ok"}
OUTCOME_TEXT = {v: k for k, v in OUTCOMES.items() if v}
DOOR_TEXT = {v: k for k, v in DOORS.items() if v}


def render_audit_log(items: list[dict], total: int) -> str:
    if not items:
        return "<p class='kb-audit-empty'>没有符合条件的记录</p>"
    rows = []
    for r in items:
        what = r["question"] if r["kind"] == "question" else r["action"]
        cited = "、".join(c.get("doc_name") or str(c.get("doc_id")) for c in r["cited"])
        rows.append(
            f"<tr><td>{esc(r['time'])}</td><td>{esc(r['actor'] or '本机')}</td>"
            f"<td>{esc(DOOR_TEXT.get(r['door'], r['door']))}</td><td>{esc(what or '')}</td>"
            f"<td>{esc(OUTCOME_TEXT.get(r['outcome'], r['outcome']))}</td>"
            f"<td>{esc(','.join(map(str, r['kb_ids'])))}</td>"
            f"<td>{'' if r['latency_ms'] is None else esc(r['latency_ms'])}</td><td>{esc(cited)}</td></tr>")
    return (f"<p>共 {total} 条，显示最新 {len(items)} 条</p><table class='kb-audit-log'><thead><tr><th>时间</th>"
            "<th>用户 / Key</th><th>入口</th><th>问题 / 操作</th><th>结果</th><th>知识库</th><th>耗时(ms)</th>"
            f"<th>引用文档</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def build_audit_log_tab(engine, policy: AccessPolicy | None = None):
    policy = policy or AccessPolicy()
    export_dir = Path(tempfile.mkdtemp(prefix="kbqa-audit-log-"))
    gr.Markdown("谁在什么时候通过哪个入口问了什么、结果如何、引用了哪些文档，以及管理操作（修改配置、重载、删除文档、"
                "知识库权限变更、API Key）。保留天数见 配置 → 开放接口。")
    with gr.Row(equal_height=True):
        actor = gr.Textbox(label="用户 / Key", placeholder="alice 或 key:名称", elem_id="audit-actor", scale=2)
        door = gr.Dropdown(list(DOORS), value="全部", label="入口", elem_id="audit-door", scale=1)
        kind = gr.Dropdown(list(KINDS), value="全部", label="类型", elem_id="audit-kind", scale=1)
        outcome = gr.Dropdown(list(OUTCOMES), value="全部", label="结果", elem_id="audit-outcome", scale=1)
        kb_id = gr.Number(label="知识库 id", precision=0, elem_id="audit-kb", scale=1)
        since = gr.Textbox(label="起始日期", placeholder="2026-12-01", elem_id="audit-since", scale=1)
        until = gr.Textbox(label="截止日期（含）", placeholder="2026-12-31", elem_id="audit-until", scale=1)
    with gr.Row():
        query = gr.Button("查询", variant="primary", size="sm", elem_id="audit-query")
        export_csv = gr.Button("导出 CSV", size="sm", elem_id="audit-export-csv")
        export_jsonl = gr.Button("导出 JSONL", size="sm", elem_id="audit-export-jsonl")
    export_file = gr.File(label="导出的审计日志", visible=False, interactive=False, elem_id="audit-file")
    listing = gr.HTML(render_audit_log([], 0), elem_id="audit-list")
    inputs = [actor, door, kind, outcome, kb_id, since, until]

    def filters(actor_v, door_v, kind_v, outcome_v, kb_v, since_v, until_v) -> dict:
        return {"actor": (actor_v or "").strip() or None, "door": DOORS.get(door_v), "kind": KINDS.get(kind_v),
                "outcome": OUTCOMES.get(outcome_v), "kb_id": int(kb_v) if kb_v not in (None, "") else None,
                "since": (since_v or "").strip() or None, "until": (until_v or "").strip() or None}

    def show(actor_v, door_v, kind_v, outcome_v, kb_v, since_v, until_v, request: gr.Request):
        require(policy, request, Role.ADMIN)
        try:
            data = engine.audit_log(1, PAGE, **filters(actor_v, door_v, kind_v, outcome_v, kb_v, since_v, until_v))
        except Exception as exc:  # EngineError: a bad date …
            return f"<p class='kb-audit-error'>⚠️ {esc(getattr(exc, 'msg', str(exc)))}</p>"
        return render_audit_log(data["items"], data["total"])

    def export(fmt: str):
        def do_export(actor_v, door_v, kind_v, outcome_v, kb_v, since_v, until_v, request: gr.Request):
            require(policy, request, Role.ADMIN)
            path = export_dir / f"audit-log.{fmt}"
            try:
                text = engine.export_audit_log(fmt, **filters(actor_v, door_v, kind_v, outcome_v, kb_v, since_v,
                                                              until_v))
            except Exception as exc:  # EngineError: a bad date …
                raise gr.Error(getattr(exc, "msg", str(exc))) from None
            path.write_text(text, encoding="utf-8")
            return gr.File(value=str(path), visible=True)
        do_export.__name__ = f"audit_export_{fmt}"
        return do_export

    query.click(show, inputs, listing, api_visibility="private")
    export_csv.click(export("csv"), inputs, export_file, api_visibility="private")
    export_jsonl.click(export("jsonl"), inputs, export_file, api_visibility="private")
    return listing, show, inputs
