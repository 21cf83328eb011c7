"""网页与文件夹 section of 知识库 → 文档管理: the URLs the picked knowledge base follows (add, status, last fetch,
interval, 重新抓取) and its server-side folder (path — admins only —, interval, 同步, the last report).

Everything goes through engine methods (add_web_source / list_web_sources / refetch_web_source /
set_folder_source / folder_source / sync_folder); every handler re-checks the caller on the server.
API names: src_list, src_add_url, src_refetch, src_set_folder, src_sync.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role
from pipeline.retrieval.kb_indexes import DEFAULT_KB_ID

from . import guard
from .render import esc

STATUS = {"pending": ("等待抓取", "kbt-processing"), "fetching": ("抓取中", "kbt-processing"),
          "ok": ("已导入", "kbt-ready"), "unchanged": ("未变化", "kbt-ready"), "failed": ("失败", "kbt-failed")}
ROW_JS = """
element.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-act="refetch"]');
  if (!b || b.disabled) return;
  trigger('click', {act: 'refetch', source_id: Number(b.dataset.id)});
});
"""


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(ts))) if ts else "—"


def sources_html(rows: list[dict]) -> str:
    if not rows:
        return '<div class="kbt-empty">还没有网页来源</div>'
    out = []
    for s in rows:
        label, cls = STATUS.get(s.get("status"), (s.get("status"), ""))
        every = f"每 {int(s['interval_min'])} 分钟" if s.get("interval_min") else "仅手动"
        out.append(f'<tr data-source="{int(s["source_id"])}"><td class="kbt-name">{esc(s["url"])}</td>'
                   f'<td><span class="kbt-status {cls}">{esc(label)}</span></td>'
                   f'<td class="kbt-reason">{esc(s.get("message") or "")}</td>'
                   f'<td class="kbt-time">{esc(_when(s.get("last_fetch_at")))}</td><td>{esc(every)}</td>'
                   f'<td><button class="kbt-act" data-act="refetch" data-id="{int(s["source_id"])}">重新抓取</button>'
                   f'</td></tr>')
    return ('<div class="kbt-wrap"><table class="kbt"><thead><tr><th>网址</th><th>状态</th><th>说明</th>'
            f'<th>上次抓取</th><th>间隔</th><th></th></tr></thead><tbody>{"".join(out)}</tbody></table></div>')


def report_html(src: dict | None) -> str:
    if not src:
        return '<div class="kbt-empty">未设置同步文件夹</div>'
    every = f"每 {int(src['interval_min'])} 分钟自动同步" if src.get("interval_min") else "仅手动同步"
    head = f"<div><b>{esc(src['path'])}</b> · {esc(every)} · 上次同步 {esc(_when(src.get('last_sync_at')))}</div>"
    r = src.get("last_report")
    if not r:
        return head + '<div class="kbt-empty">尚未同步</div>'
    detail = r.get("detail") or {}

    def names(key: str) -> str:
        items = detail.get(key) or []
        text = "、".join(i["name"] + (f"（{i['reason']}）" if i.get("reason") else "")
                        + ("（仅标记）" if i.get("action") == "flagged" else "") if isinstance(i, dict) else i
                        for i in items[:20])
        return esc(text + (" …" if len(items) > 20 else ""))

    return (head + f'<div class="kbs-report" data-report="{int(r["report_id"])}">最近一次：新增 {r["added"]} · '
            f'更新 {r["updated"]} · 移除 {r["removed"]} · 失败 {r["failed"]} · 未变 {r["unchanged"]}</div>'
            '<ul class="kbu-list">'
            + "".join(f"<li>{label}：{names(key)}</li>" for key, label in
                      (("added", "新增"), ("updated", "更新"), ("removed", "移除"), ("failed", "失败"))
                      if detail.get(key))
            + "</ul>")


@dataclass
class SourcesSection:
    wire: Callable[[gr.Dropdown], None]  # hooks the section to the knowledge-base picker


def build_sources_section(engine, policy: AccessPolicy) -> SourcesSection:
    with gr.Accordion("网页与文件夹同步", open=False, elem_id="kb-follow"):
        with gr.Row(equal_height=True):
            url = gr.Textbox(show_label=False, placeholder="https://… 要导入的网页地址", scale=4, max_lines=1,
                             elem_id="src-url", container=False)
            every = gr.Number(None, label="抓取间隔(分钟，空=仅手动)", precision=0, scale=1, minimum=1,
                              elem_id="src-interval")
            add_btn = gr.Button("添加网址", scale=1, min_width=90, elem_id="src-add")
        url_msg = gr.Markdown("", elem_id="src-msg")
        table = gr.HTML(sources_html([]), js_on_load=ROW_JS, elem_id="src-table")
        refetch_id = gr.Number(None, visible=False, precision=0)
        refetch_btn = gr.Button("重新抓取", visible=False)  # the API route of the row button (src_refetch)
        gr.Markdown("**同步文件夹**（服务器上的文件夹；路径只有管理员能设置，文件只读不改）")
        with gr.Row(equal_height=True):
            path = gr.Textbox(show_label=False, placeholder="/srv/shared/制度文件", scale=4, max_lines=1,
                              elem_id="src-folder", container=False)
            folder_every = gr.Number(None, label="同步间隔(分钟，空=仅手动)", precision=0, scale=1, minimum=1,
                                     elem_id="src-folder-interval")
            save_btn = gr.Button("保存文件夹", scale=1, min_width=90, elem_id="src-folder-save")
            sync_btn = gr.Button("同步", variant="primary", scale=1, min_width=70, elem_id="src-sync")
        folder_msg = gr.Markdown("", elem_id="src-folder-msg")
        report = gr.HTML(report_html(None), elem_id="src-report")

    def require(request) -> None:
        guard.require(policy, request, Role.KB_ADMIN)

    def shown(kb_id) -> tuple[str, str]:
        kb_id = guard.to_int(kb_id, DEFAULT_KB_ID)
        return sources_html(engine.list_web_sources(kb_id)), report_html(engine.folder_source(kb_id))

    def src_list(kb, request: gr.Request):
        if not policy.allows(guard.request_user(request), Role.KB_ADMIN):
            return "", ""
        try:
            return shown(kb)
        except Exception as exc:  # the knowledge base was deleted meanwhile
            return f'<div class="kbt-empty">{esc(guard.error_text(exc))}</div>', ""

    def src_add_url(link, minutes, kb, request: gr.Request):
        require(request)
        try:
            s = engine.add_web_source(guard.to_int(kb, DEFAULT_KB_ID), link or "", guard.to_int(minutes),
                                      actor=guard.page_actor(request))
            label = STATUS.get(s["status"], (s["status"],))[0]
            msg = f"{label}：{s.get('message') or ''}" if s["status"] == "failed" else f"✅ 已添加并抓取：{label}"
        except Exception as exc:
            msg = f"⚠️ {guard.error_text(exc)}"
        return (msg, *shown(kb))

    def src_refetch(source_id, kb, request: gr.Request):
        require(request)
        try:
            s = engine.refetch_web_source(guard.to_int(source_id, -1), actor=guard.page_actor(request))
            msg = f"重新抓取：{STATUS.get(s['status'], (s['status'],))[0]} {s.get('message') or ''}"
        except Exception as exc:
            msg = f"⚠️ {guard.error_text(exc)}"
        return (msg, *shown(kb))

    def src_row(evt: gr.EventData, kb, request: gr.Request):
        data = getattr(evt, "_data", None) or {}
        if data.get("act") != "refetch" or data.get("source_id") is None:
            return gr.skip(), gr.skip(), gr.skip()
        return src_refetch(data["source_id"], kb, request)

    def src_set_folder(folder, minutes, kb, request: gr.Request):
        guard.require(policy, request, Role.ADMIN)  # the path reads the server's disk: admins only
        try:
            engine.set_folder_source(guard.to_int(kb, DEFAULT_KB_ID), folder or "", guard.to_int(minutes),
                                     actor=guard.page_actor(request))
            msg = "✅ 已保存同步文件夹，点击「同步」开始"
        except Exception as exc:
            msg = f"⚠️ {guard.error_text(exc)}"
        return (msg, *shown(kb))

    def src_sync(kb, request: gr.Request):
        require(request)
        try:
            r = engine.sync_folder(guard.to_int(kb, DEFAULT_KB_ID), actor=guard.page_actor(request))
            msg = (f"✅ 同步完成：新增 {len(r['added'])} · 更新 {len(r['updated'])} · 移除 {len(r['removed'])} · "
                   f"失败 {len(r['failed'])}")
        except Exception as exc:
            msg = f"⚠️ {guard.error_text(exc)}"
        return (msg, *shown(kb))

    def wire(kb: gr.Dropdown) -> None:
        outs = [table, report]
        kb.change(src_list, [kb], outs, api_name="src_list", show_progress="hidden")
        add_btn.click(src_add_url, [url, every, kb], [url_msg, *outs], api_name="src_add_url", concurrency_limit=2,
                      show_progress_on=[url_msg])
        table.click(src_row, [kb], [url_msg, *outs], api_name=False, show_progress_on=[url_msg])
        refetch_btn.click(src_refetch, [refetch_id, kb], [url_msg, *outs], api_name="src_refetch")
        save_btn.click(src_set_folder, [path, folder_every, kb], [folder_msg, *outs], api_name="src_set_folder")
        sync_btn.click(src_sync, [kb], [folder_msg, *outs], api_name="src_sync", concurrency_limit=1,
                       show_progress_on=[folder_msg])
        gr.on(None, src_list, [kb], outs, api_name=False, show_progress="hidden")  # page load

    return SourcesSection(wire)
