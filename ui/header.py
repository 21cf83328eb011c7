"""Page header: title + badges 「知识库: N 块」, embedding model (「未校准」 when it runs on the generic calibration
profile), LLM mode (from engine.health()).

`build_header(engine)` returns the badge component (a gr.HTML). Other tabs refresh it by returning
`badge_html(engine)` as that component's new value (e.g. after an upload); a gr.Timer refreshes it too.
"""
from __future__ import annotations

import gradio as gr

from pipeline.access.policy import Reader
from pipeline.ingestion.progress import format_eta

from .guard import reader_of
from .render import esc

REFRESH_SECONDS = 5


def badge_html(engine, reader=None) -> str:
    """`reader` (pipeline.access.Reader): counts and the rebuild's file only of what they may read."""
    try:
        h = engine.health(None, reader)
    except Exception as exc:  # the header must never break the page
        return f'<div class="kb-badges" id="kb-badges"><span class="kb-badge kb-badge-warn">引擎状态未知：{esc(exc)}</span></div>'
    state = h.get("state")
    chunks = h.get("chunks") or 0
    items = [f'<span class="kb-badge kb-badge-main" data-chunks="{int(chunks)}">知识库: {int(chunks)} 块</span>']
    if h.get("processing"):
        queued = int(h.get("queued") or 0)
        wait = f" · 排队 {queued}" if queued else ""
        items.append(f'<span class="kb-badge" data-queued="{queued}">处理中 {int(h["processing"])} 个文档{wait}</span>')
    if state in ("loading", "reloading"):
        items.append('<span class="kb-badge kb-badge-warn">引擎加载中…</span>')
    elif state == "error":
        items.append('<span class="kb-badge kb-badge-warn">引擎加载失败</span>')
    emb = h.get("embedding_model")
    if emb:
        # a model without its own calibration profile runs on the generic fitted numbers: say so beside its name
        uncal = ('<span class="kb-uncalibrated" title="此 Embedding 模型没有自己的校准参数，融合、拒答判定与摘录'
                 '使用通用默认值；运行 python -m tools.eval.calibrate --embedding-model 目录 生成"> · 未校准</span>'
                 if h.get("calibrated") is False else "")
        items.append(f'<span class="kb-badge" title="Embedding 模型" data-calibrated="{str(h.get("calibrated")).lower()}">'
                     f'{esc(emb)}{uncal}</span>')
    llm = h.get("llm")
    if llm:
        items.append(f'<span class="kb-badge" title="大模型">大模型: {esc(llm)}</span>')
    if h.get("warning"):
        items.append(f'<span class="kb-badge kb-badge-warn" title="{esc(h["warning"])}">⚠ 需要重建知识库</span>')
    rb = h.get("rebuild") or {}
    if rb.get("running"):
        eta = f" · 剩余{format_eta(rb.get('eta_s'))}" if rb.get("done") else ""
        items.append(f'<span class="kb-badge kb-badge-warn">全量重建中 {int(rb.get("done") or 0)}/{int(rb.get("total") or 0)}{eta}</span>')
    return f'<div class="kb-badges" id="kb-badges" data-state="{esc(state)}">' + "".join(items) + "</div>"


def build_header(engine, policy=None) -> gr.HTML:
    with gr.Row(elem_id="kb-header", equal_height=True):
        gr.HTML("<h1>中文知识库问答</h1>", elem_id="kb-title")
        # built before anyone logs in: with logins on, only the open knowledge bases are counted
        first = Reader(None, privileged=False) if policy is not None and policy.enabled else None
        badge = gr.HTML(badge_html(engine, first), elem_id="kb-badge")
    timer = gr.Timer(REFRESH_SECONDS)

    def header_badge(request: gr.Request):
        return badge_html(engine, reader_of(policy, request))

    timer.tick(header_badge, None, badge, api_name="header_badge", show_progress="hidden",
               queue=False)
    return badge
