"""双路检索调试 (F2.3): query + topK → BM25 | 向量 | RRF side by side.

Every chunk gets one colour (by order of first appearance, RRF first), used in all three columns, and every card
names its chunk id and its rank in the other lists, so a reader sees which route found a chunk, at which rank,
and where it landed after fusion. Hovering a card outlines the same chunk in the other columns.

All data comes from `engine.search(query, top_k)`; nothing here retrieves anything itself.
"""
from __future__ import annotations

from typing import Any

import gradio as gr

from . import guard
from .kb_spaces import scope_ids, scope_picker
from .render import esc, fmt_num, fusion_title, snippet
from .tag_filter import build_tag_filter, describe_filter, filter_of, wire_scope
from .viewer import OPENER_JS

DEFAULT_TOP_K = 10
MAX_TOP_K = 50
SNIP = 120

COLUMN_CSS = """
.kbd-col { display: flex; flex-direction: column; gap: 6px; }
.kbd-title { font-weight: 700; font-size: .95rem; margin-bottom: 2px; }
.kbd-card { border: 1px solid var(--border-color-primary); border-left-width: 6px; border-radius: 8px;
            padding: 6px 8px; font-size: .86rem; transition: box-shadow .15s; }
.kbd-card.kbd-hover { box-shadow: 0 0 0 3px rgba(245, 158, 11, .6); }
.kbd-head { display: flex; flex-wrap: wrap; gap: 6px; align-items: baseline; }
.kbd-rank { font-weight: 700; }
.kbd-chip { font-size: .75rem; padding: 0 6px; border-radius: 4px; background: rgba(0,0,0,.06); }
.kbd-doc { font-weight: 600; }
.kbd-score { margin-left: auto; font-family: ui-monospace, monospace; }
.kbd-where { font-size: .78rem; opacity: .8; }
.kbd-snip { margin-top: 3px; opacity: .9; }
.kbd-empty { opacity: .6; font-size: .9rem; }
"""

# Outline the same chunk in all columns while the pointer is over one of its cards (delegated: survives re-renders).
HOVER_JS = """
element.addEventListener('mouseover', (e) => {
  const c = e.target.closest('[data-chunk]'); if (!c) return;
  document.querySelectorAll('.kbd-card.kbd-hover').forEach(x => x.classList.remove('kbd-hover'));
  document.querySelectorAll('.kbd-card[data-chunk="' + c.dataset.chunk + '"]').forEach(x => x.classList.add('kbd-hover'));
});
element.addEventListener('mouseleave', () => {
  document.querySelectorAll('.kbd-card.kbd-hover').forEach(x => x.classList.remove('kbd-hover'));
});
"""


def chunk_colours(result: dict) -> dict[int, str]:
    """chunk_id → hue (0–359), by order of first appearance in RRF, then BM25, then 向量 (golden-angle spacing)."""
    hues: dict[int, str] = {}
    for key in ("fused", "bm25", "vector"):
        for row in result.get(key) or []:
            cid = row.get("chunk_id")
            if cid is not None and cid not in hues:
                hues[cid] = str(round((len(hues) * 137.508 + 210) % 360))
    return hues


def kb_chip(row: dict) -> str:
    return f'<span class="kbd-chip kbd-kb">{esc(row["kb_name"])}</span>' if row.get("kb_name") else ""


def _card(row: dict, rank: int, hue: str | None, score_html: str, where_html: str) -> str:
    cid = row.get("chunk_id")
    style = (f'style="background:hsla({hue},85%,60%,.14);border-left-color:hsl({hue},70%,45%)"'
             if hue is not None else "")
    text = row.get("text") or ""
    return (f'<div class="kbd-card" data-chunk="{esc(cid)}" data-rank="{rank}" data-hue="{esc(hue)}" {style} '
            f'data-view-chunk="{esc(cid)}" '
            f'title="{esc(text[:600])}">'
            f'<div class="kbd-head"><span class="kbd-rank">#{rank}</span>'
            f'<span class="kbd-chip">块 {esc(cid)}</span>'
            f'{kb_chip(row)}<span class="kbd-doc">{esc(row.get("doc_name") or "未知文档")}</span>'
            f'<span class="kbd-score">{score_html}</span></div>'
            f'<div class="kbd-where">{where_html}</div>'
            f'<div class="kbd-snip">{esc(snippet(text, SNIP))}</div></div>')


def _rank_map(rows: list[dict]) -> dict[int, int]:
    return {r.get("chunk_id"): i for i, r in enumerate(rows, start=1)}


def render_columns(result: dict, top_k: int) -> tuple[str, str, str]:
    """Three HTML columns (BM25, 向量, RRF) for one engine.search() result."""
    bm25, vec, fused = result.get("bm25") or [], result.get("vector") or [], result.get("fused") or []
    hues = chunk_colours(result)
    bm25_pos, vec_pos, fused_pos = _rank_map(bm25), _rank_map(vec), _rank_map(fused)

    def after_fusion(cid) -> str:
        k = fused_pos.get(cid)
        return f"→ 融合第 {k} 名" if k else f"→ 未进融合前 {top_k}"

    def col(title: str, key: str, cards: list[str]) -> str:
        body = "".join(cards) if cards else '<div class="kbd-empty">（无结果）</div>'
        return f'<div class="kbd-col" data-col="{key}"><div class="kbd-title">{esc(title)}</div>{body}</div>'

    bm25_cards = []
    for i, r in enumerate(bm25, start=1):
        cid = r.get("chunk_id")
        also = f"向量 第 {vec_pos[cid]} 名" if cid in vec_pos else "向量未召回"
        bm25_cards.append(_card(r, i, hues.get(cid), f"得分 {fmt_num(r.get('score'), 4)}",
                                f"{esc(after_fusion(cid))} · {esc(also)}"))
    vec_cards = []
    for i, r in enumerate(vec, start=1):
        cid = r.get("chunk_id")
        also = f"BM25 第 {bm25_pos[cid]} 名" if cid in bm25_pos else "BM25 未召回"
        vec_cards.append(_card(r, i, hues.get(cid), f"相似度 {fmt_num(r.get('similarity'), 4)}",
                               f"{esc(after_fusion(cid))} · {esc(also)}"))
    fused_cards = []
    for i, r in enumerate(fused, start=1):
        cid = r.get("chunk_id")
        br, vr = r.get("bm25_rank"), r.get("vector_rank")
        where = ((f"BM25 第 {br} 名" if br else "BM25 未召回") + f"（得分 {fmt_num(r.get('bm25_score'), 3)}） · "
                 + (f"向量 第 {vr} 名" if vr else "向量未召回") + f"（相似度 {fmt_num(r.get('similarity'), 3)}）"
                 + ("" if r.get("length_prior") is None else f" · 长度项 +{fmt_num(r.get('length_prior'), 3)}"))
        fused_cards.append(_card(r, i, hues.get(cid), f"融合 {fmt_num(r.get('fused_score'), 4)}", esc(where)))

    return (col(f"BM25 关键词 Top-{top_k}（得分）", "bm25", bm25_cards),
            col(f"向量 Top-{top_k}（相似度）", "vector", vec_cards),
            col(f"融合 Top-{top_k}：{fusion_title(result.get('fusion'))}", "fused", fused_cards))


def _ms_text(ms: dict | None) -> str:
    labels = {"embed": "向量化", "bm25": "BM25", "vector": "向量检索", "rrf": "RRF 融合", "fusion": "融合",
              "filter": "文档筛选", "within_cited_docs": "追问文档内检索", "total": "合计"}
    parts = [f"{labels.get(k, k)} {fmt_num(v, 1)} ms" for k, v in (ms or {}).items()]
    return " · ".join(parts)


def make_search_handler(engine, policy=None):
    def debug_search(query: str, top_k: float | int | None, kbs=None, request: gr.Request = None, tags=None,
                     mode=None):
        """Returns (status markdown, bm25 html, vector html, fused html). `kbs`: the picked knowledge bases;
        `tags` / `mode`: the tag filter (ui/tag_filter.py)."""
        empty = ("", "", "")
        try:
            k = int(top_k) if top_k is not None else DEFAULT_TOP_K
        except (TypeError, ValueError):
            return ("⚠️ topK 必须是 1–50 的整数", *empty)
        try:
            reader = guard.reader_of(policy, request)
            result = engine.search(query or "", k, scope_ids(engine, kbs, reader), reader,
                                   doc_filter=filter_of(tags, mode))
        except Exception as exc:  # EngineError (validation / 2002) or a retrieval failure
            return (f"⚠️ {esc(guard.failure_text(exc, 'debug search'))}", *empty)
        cols = render_columns(result, k)
        both = len({r["chunk_id"] for r in result.get("bm25") or []} &
                   {r["chunk_id"] for r in result.get("vector") or []})
        status = (f"BM25 {len(result.get('bm25') or [])} 条 · 向量 {len(result.get('vector') or [])} 条 · "
                  f"两路都召回 {both} 条（同色 = 同一块）")
        ms = _ms_text(result.get("ms"))
        flt = describe_filter(result.get("filter"))
        return (status + (f"　｜　{ms}" if ms else "") + (f"　｜　文档筛选：{esc(flt)}" if flt else ""), *cols)

    return debug_search


def build_debug_view(engine, policy=None) -> dict[str, Any]:
    """Query + topK → three columns. Open to every logged-in user (see pipeline.access.policy)."""
    with gr.Row(equal_height=True):
        query = gr.Textbox(label="查询", placeholder="输入问题或关键词，对比两路检索结果", scale=5,
                           max_lines=3)
        top_k = gr.Slider(1, MAX_TOP_K, value=DEFAULT_TOP_K, step=1, label="topK", scale=2)
        kbs = scope_picker(engine, "kbd-kbs")
        go = gr.Button("检索", variant="primary", scale=1, min_width=80)
    with gr.Row(equal_height=True):
        tag_filter = build_tag_filter(engine, "kbd-tag-filter")
    status = gr.Markdown("")
    with gr.Row(equal_height=False, elem_classes=["kbd-root"]):
        cols = [gr.HTML("", css_template=COLUMN_CSS, js_on_load=HOVER_JS + OPENER_JS, elem_classes=["kbd-column"],
                        elem_id=f"kbd-{key}") for key in ("bm25", "vector", "fused")]
    handler = make_search_handler(engine, policy)
    go.click(handler, [query, top_k, kbs, *tag_filter.inputs], [status, *cols], api_name="debug_search")
    query.submit(handler, [query, top_k, kbs, *tag_filter.inputs], [status, *cols], api_name=False)
    wire_scope(engine, policy, kbs, tag_filter)
    return {"query": query, "top_k": top_k, "status": status, "columns": cols}
