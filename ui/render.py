"""HTML rendering helpers for the answer, the sources panel, the retrieval trace and the stage indicator.

Pure functions of the engine's event payloads (the TypedDicts of pipeline.events: trace, sources); no
Gradio import, so the knowledge-base / debug views and tests can use them freely. Everything that comes from
documents or the model is HTML-escaped here.

Click-to-source (F3-3): citations in the answer become `<a class="kb-cite" data-cite="n" href="#kb-src-n">[n]</a>`;
source cards carry `id="kb-src-n"` (class `kb-src`). The small script in ui.theme.HEAD_JS highlights and scrolls
to the card. Pass another `id_prefix` when rendering a second sources list on the same page.
"""
from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any

from .safe_markdown import defuse_markdown

SNIPPET_CHARS = 80
STAGES = (("recall", "检索中"), ("rerank", "重排中"), ("generate", "生成中"))
_CITE = re.compile(r"\[(\d{1,3})\]")


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def fmt_num(x: Any, nd: int = 4) -> str:
    if x is None:
        return "—"
    try:
        return f"{float(x):.{nd}f}"
    except (TypeError, ValueError):
        return esc(x)


def snippet(text: str | None, n: int = SNIPPET_CHARS) -> str:
    t = " ".join((text or "").split())
    return t[:n] + ("…" if len(t) > n else "")


def doc_label(item: dict) -> str:
    name = item.get("doc_name") or item.get("file_name") or "未知文档"
    if (item.get("version") or 1) > 1:
        name = f"{name} v{item['version']}"
    page = item.get("page")
    return f"{name} · 第{page}页" if page else str(name)


def mark_replaced(engine, sources: list[dict]) -> list[dict]:
    """Sources of a replayed answer: each keeps the version it cited; mark 「旧版本」 where that version is no
    longer the active one (「已删除」 where the document is gone)."""
    states = engine.source_states([s["doc_id"] for s in sources if isinstance(s.get("doc_id"), int)])
    out = []
    for s in sources:
        st = states.get(s.get("doc_id")) if isinstance(s.get("doc_id"), int) else None
        flag = None
        if isinstance(s.get("doc_id"), int):
            flag = "已删除" if st is None else (None if st["active"] == 1 else "旧版本")
        out.append({**s, "replaced": flag})
    return out


# ---------------------------------------------------------------------------------------------- answer
WEAK_BANNER = "资料相关度较低，请核对原文"
UNSUPPORTED_TITLE = "引用核验：该句与这份来源的内容不符"


def _cite_links(safe: str, id_prefix: str, unsupported: Iterable[int] = ()) -> str:
    bad = set(unsupported)

    def link(m):
        n = m.group(1)
        if int(n) in bad:  # the support check found source n does not back this sentence
            return (f'<a class="kb-cite kb-cite-unsupported" data-cite="{n}" data-supported="false" '
                    f'title="{UNSUPPORTED_TITLE}" href="#{id_prefix}{n}">[{n}]⚠</a>')
        return f'<a class="kb-cite" data-cite="{n}" href="#{id_prefix}{n}">[{n}]</a>'

    return _CITE.sub(link, safe)


def answer_markdown(text: str, id_prefix: str = "kb-src-", *, support: list[dict] | None = None,
                    weak: bool = False) -> str:
    """Answer text for gr.Chatbot (markdown): HTML-escaped, every [n] made a clickable citation link, images
    shown as text and links with their host (ui.safe_markdown).

    `support` (done.support of an LLM answer): citations a sentence carries without backing are marked ⚠.
    `weak` (done.weak / trace.gate.weak): the answer opens with the 「资料相关度较低，请核对原文」 banner."""
    bad_by_text = {_claim_key(s.get("text", "")): s.get("unsupported") or [] for s in (support or [])}
    pieces = _SENTENCE.findall(text or "")
    if "".join(pieces) != (text or ""):  # never drop characters: fall back to the text as one piece
        pieces = [text or ""]
    out = []
    bad: list[int] = []
    for sent in pieces:
        key = _claim_key(_CITE.sub("", sent))
        if key or not _CITE.search(sent):  # a piece of only citations keeps the sentence before's marks
            bad = bad_by_text.get(key, []) if bad_by_text else []
        # Keep markdown from turning "[1](…)" or "[1][2]" into links: citations become explicit anchors.
        out.append(_cite_links(html.escape(sent, quote=False), id_prefix, bad))
    body = defuse_markdown("".join(out))  # no image loads, no hidden link target (ui.safe_markdown)
    if weak:
        body = f'<div class="kb-weak-banner" data-weak="true">⚠️ {WEAK_BANNER}</div>\n\n' + body
    return body


def trace_marks(trace: dict | None) -> dict:
    """answer_markdown's marks from a (stored) trace: the weak banner, the per-sentence support list."""
    trace = trace if isinstance(trace, dict) else {}
    gate = trace.get("gate") if isinstance(trace.get("gate"), dict) else {}
    support = trace.get("support_sentences")
    return {"weak": bool(gate.get("weak")), "support": support if isinstance(support, list) else None}


_SENTENCE = re.compile(r"[^。！？!?\n]*[。！？!?]+|[^。！？!?\n]*\n|[^。！？!?\n]+$")


def _claim_key(text: str) -> str:
    return re.sub(r"[\W_]+", "", text or "")


# ---------------------------------------------------------------------------------------------- stage
def render_stage(phase: str | None = None, *, done_ms: Any = None, error: str | None = None,
                 note: str | None = None) -> str:
    """检索中 → 重排中 → 生成中, the current one highlighted; or a final state."""
    if error:
        return f'<div class="kb-stage kb-stage-error" data-phase="error">⚠️ {esc(error)}</div>'
    if done_ms is not None:
        extra = f" · {esc(note)}" if note else ""
        return (f'<div class="kb-stage kb-stage-done" data-phase="done">✓ 完成 · 用时 '
                f'{esc(done_ms)} ms{extra}</div>')
    if not phase:
        return '<div class="kb-stage kb-stage-idle" data-phase="idle">输入问题后按 发送（Enter）</div>'
    keys = [k for k, _ in STAGES]
    cur = keys.index(phase) if phase in keys else -1
    parts = []
    for i, (k, label) in enumerate(STAGES):
        cls = "kb-step-done" if i < cur else ("kb-step-active" if i == cur else "kb-step-todo")
        parts.append(f'<span class="kb-step {cls}" data-step="{k}">{label}</span>')
    return f'<div class="kb-stage" data-phase="{esc(phase)}">' + '<span class="kb-arrow">→</span>'.join(parts) + "</div>"


# ---------------------------------------------------------------------------------------------- sources
def render_sources(sources: Iterable[dict] | None, *, no_answer: bool = False, id_prefix: str = "kb-src-",
                   empty_text: str | None = None, kb_hint: str | None = None, direct: bool = False) -> str:
    """The 引用来源 panel: [n] · 文件名 · 前 80 字 · 相似度, full text folded below each card."""
    sources = list(sources or [])
    if not sources:
        if direct:
            return ('<div class="kb-sources kb-sources-empty" data-count="0"><div class="kb-muted">'
                    '本次回答没有检索知识库，没有引用来源。</div></div>')
        if no_answer:
            hint = kb_hint or "请到「知识库」标签页上传相关资料后再提问。"
            return ('<div class="kb-sources kb-sources-empty" data-count="0"><div class="kb-noanswer">'
                    f'未在知识库中找到相关资料。{esc(hint)}</div></div>')
        return ('<div class="kb-sources kb-sources-empty" data-count="0"><div class="kb-muted">'
                f'{esc(empty_text or "回答后在这里显示引用的资料片段。")}</div></div>')
    cards = []
    for s in sources:
        no = s.get("no")
        sim = s.get("similarity")
        meta = [f'<span class="kb-src-no">[{esc(no)}]</span>',
                f'<span class="kb-src-doc">{esc(doc_label(s))}</span>']
        if sim is not None:
            meta.append(f'<span class="kb-src-sim" title="相似度（余弦）">相似度 {fmt_num(sim, 3)}</span>')
        if s.get("rerank_score") is not None:
            meta.append(f'<span class="kb-src-rr" title="精排分">精排 {fmt_num(s.get("rerank_score"), 3)}</span>')
        if s.get("kb_name"):
            meta.insert(1, f'<span class="kb-tag kb-src-kb" title="知识库">{esc(s["kb_name"])}</span>')
        if s.get("source") == "ocr":
            meta.append('<span class="kb-tag">OCR</span>')
        if s.get("replaced"):
            meta.append(f'<span class="kb-tag kb-tag-old" title="引用的版本已不是当前版本">{esc(s["replaced"])}</span>')
        if s.get("verified"):
            meta.insert(1, '<span class="kb-tag kb-tag-verified">已核实问答</span>')
        sup = s.get("support")
        if isinstance(sup, dict) and sup.get("supported") is False:
            meta.append(f'<span class="kb-tag kb-unsupported" title="{esc(UNSUPPORTED_TITLE)}（支持度 '
                        f'{fmt_num(sup.get("score"), 2)}）">⚠ 引用与内容不符</span>')
        ctx = (f'<div class="kb-src-ctx" title="所在章节 / 工作表">{esc(s.get("context"))}</div>'
               if s.get("context") else "")
        cited = " kb-cited" if s.get("cited") else ""
        full = s.get("text") or ""
        view = (f' <span class="kb-src-view" data-view-chunk="{esc(s.get("chunk_id"))}" title="打开原文并定位到这段">'
                f'查看原文</span>') if s.get("chunk_id") is not None else ""
        cards.append(
            f'<details class="kb-src{cited}" id="{esc(id_prefix)}{esc(no)}" data-no="{esc(no)}" '
            f'data-chunk="{esc(s.get("chunk_id"))}" data-doc="{esc(s.get("doc_id"))}">'
            f'<summary><div class="kb-src-head">{" · ".join(meta)}{view}</div>{ctx}'
            f'<div class="kb-src-snip">{esc(snippet(full))}</div></summary>'
            f'<div class="kb-src-full">{esc(full)}</div></details>')
    return f'<div class="kb-sources" data-count="{len(cards)}">' + "".join(cards) + "</div>"


# ---------------------------------------------------------------------------------------------- trace
_MS_LABELS = {"embed": "向量化", "bm25": "BM25", "vector": "向量检索", "rrf": "RRF 融合", "fusion": "融合",
              "rerank": "精排", "total": "检索合计", "generate": "生成", "elapsed": "总用时",
              "multi_query": "多查询改写", "expanded_recall": "改写后检索"}


def _ms_line(ms: dict | None, elapsed_ms: Any = None) -> str:
    items = []
    for k, v in (ms or {}).items():
        items.append(f'<span class="kb-ms" data-ms="{esc(k)}">{esc(_MS_LABELS.get(k, k))} {fmt_num(v, 1)} ms</span>')
    if elapsed_ms is not None:
        items.append(f'<span class="kb-ms" data-ms="elapsed">总用时 {esc(elapsed_ms)} ms</span>')
    return '<div class="kb-ms-line">' + " · ".join(items) + "</div>" if items else ""


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    if not rows:
        return '<div class="kb-muted">（无结果）</div>'
    head = "".join(f"<th>{esc(label)}</th>" for _, label in cols)
    body = []
    for r in rows:
        tds = []
        for key, _ in cols:
            v = r.get(key)
            if key == "doc":
                tds.append(f'<td class="kb-doc">{esc(doc_label(r))}</td>')
            elif key == "text":
                tds.append(f'<td class="kb-snip">{esc(snippet(v, 120))}</td>')
            elif key in ("score", "similarity", "rerank_score", "bm25_score", "length_prior"):
                tds.append(f"<td>{fmt_num(v)}</td>")
            elif key in ("rrf_score", "fused_score"):
                tds.append(f"<td>{fmt_num(v, 6)}</td>")
            elif key == "no":
                tds.append(f'<td><a class="kb-cite" data-cite="{esc(v)}" href="#kb-src-{esc(v)}">[{esc(v)}]</a></td>')
            else:
                tds.append(f"<td>{esc('—' if v is None else v)}</td>")
        opener = f' data-view-chunk="{esc(r["chunk_id"])}"' if r.get("chunk_id") is not None else ""
        body.append(f"<tr{opener}>" + "".join(tds) + "</tr>")
    return f'<table class="kb-trace-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


FUSION_NAMES = {"convex": "归一化加权融合", "rrf": "RRF 融合"}


def fusion_title(fusion: dict | None) -> str:
    """「归一化加权融合排序（BM25 占比 0.23，按问题自动）」 — the mode and the BM25 weight used for this query; when part
    of the question's words are in no chunk, how much of it the keyword route could see (the weight shrinks with it)."""
    f = fusion or {}
    mode = f.get("mode") or "rrf"
    w = fmt_num(f.get("bm25_weight"), 2)
    how = "BM25 占比" if mode == "convex" else "BM25 权重"
    visible = (f.get("features") or {}).get("visible")
    seen = (f"，问题用词在库中出现 {round(100 * visible)}%（库中没有的词关键词检索看不到，占比随之降低）"
            if mode == "convex" and visible is not None and visible < 1 else "")
    return f"{FUSION_NAMES.get(mode, mode)}排序（{how} {w}{seen}；名次/得分为两路各自的真实值）"


def rerank_note(status: dict | None) -> str:
    """Plain-language line about the rerank step ('' when it ran normally)."""
    st = (status or {}).get("status")
    msg = (status or {}).get("msg") or ""
    if not st or st == "ok":
        return ""
    label = {"skipped": "精排已跳过（④ 按 RRF 顺序）", "fallback": "精排已回退（④ 按 RRF 顺序）"}.get(st, f"精排状态：{st}")
    return f"{label}：{msg}" if msg else label


_GATE_LABELS = {"answer": "回答", "weak": "资料相关度较低（仍回答，请核对原文）", "refuse": "拒答（不调用大模型）"}


def render_gate(gate: dict) -> str:
    """The no-answer gate's line in 检索过程: outcome and the evidence it was decided on."""
    ok = bool(gate.get("hit"))
    outcome = gate.get("outcome") or ("answer" if ok else "refuse")
    line = (f'相关性判定：{_GATE_LABELS.get(outcome, outcome)} · 最高相似度 {fmt_num(gate.get("max_similarity"), 3)}'
            f'（硬门槛 {fmt_num(gate.get("min_similarity"), 2)}）')
    if gate.get("similarity_above") is not None:
        line += (f' · 高出本库背景 {fmt_num(gate.get("similarity_above"), 1)}（背景中位 '
                 f'{fmt_num(gate.get("background_median"), 3)}，单位 0.01）')
        if gate.get("background_state") == "previous":  # gate_background.py: a refresh was running
            line += "（本库背景正在重新测量，本次使用上一次的测量结果）"
        elif gate.get("background_state") == "quick":  # never measured: a few probes, the full set is scheduled
            line += "（本库背景尚未完整测量，本次使用少量探测问题的快速估计）"
    if gate.get("best_sentence") is not None:
        line += (f' · 最佳句子相似度 {fmt_num(gate.get("best_sentence"), 3)}'
                 f'（高出背景 {fmt_num(gate.get("sentence_above"), 1)}）')
    if gate.get("coverage") is not None:
        line += f' · 关键词覆盖 {fmt_num(gate.get("coverage"), 2)} · 短语覆盖 {fmt_num(gate.get("phrase_coverage"), 2)}'
    if gate.get("routes_agree") is not None:
        line += " · 两路首选一致" if gate["routes_agree"] else " · 两路首选不一致"
    if gate.get("reason") and outcome == "refuse":
        line += f' · {gate["reason"]}'
    return (f'<div class="kb-gate" data-hit="{str(ok).lower()}" data-outcome="{esc(outcome)}">'
            f'{esc(line)}</div>')


def render_calibration(cal: dict | None) -> str:
    """Which fitted numbers the fusion and the gate ran on: the embedding model's own calibration profile, or the
    generic one (「未校准」)."""
    if not cal:
        return ""
    if cal.get("calibrated"):
        text = f'校准参数：{cal.get("profile")}（{cal.get("date") or "日期未记录"} 拟合）'
    else:
        text = (f'校准参数：通用默认值 {cal.get("profile")}（未校准：当前 Embedding 模型没有自己的校准，'
                f'运行 python -m tools.eval.calibrate 生成）')
    return (f'<div class="kb-calibration" data-profile="{esc(cal.get("profile"))}" '
            f'data-calibrated="{str(bool(cal.get("calibrated"))).lower()}">{esc(text)}</div>')


def _query_line(trace: dict, route: dict) -> str:
    """Route, and 「检索问题：…」 — the query retrieval really saw — when a follow-up was rewritten."""
    q = trace.get("query") or {}
    out = []
    if route:
        out.append(f'<div class="kb-route">路由：{esc(route.get("label"))} · {esc(route.get("reason"))}</div>')
    if q.get("changed"):
        how = {"llm": "大模型改写", "llm_fallback": "规则改写（大模型改写未采用）"}.get(q.get("method"), "规则改写")
        note = f" · {esc(q.get('note'))}" if q.get("note") else ""
        out.append(f'<div class="kb-query" data-method="{esc(q.get("method"))}">检索问题：{esc(q.get("query"))}'
                   f'<span class="kb-muted">（{how}{note}）</span></div>')
    if q.get("expansion"):
        out.append(_expansion_line(q["expansion"]))
    return "".join(out)


def _expansion_line(x: dict) -> str:
    """The LLM's multi-query: the phrasings searched besides the question, or why the question went alone."""
    ms = f'，{fmt_num(x.get("ms"), 0)} ms'
    if x.get("fallback"):
        return (f'<div class="kb-expansion" data-fallback="true" data-sources="original">多查询检索：仅原问题'
                f'<span class="kb-muted">（{esc(x.get("note"))}{ms}）</span></div>')
    items = "".join(f"<li>{esc(t)}</li>" for t in x.get("queries") or [])
    if x.get("keywords"):
        items += f'<li>关键词：{esc("、".join(x["keywords"]))}</li>'
    # the gate line judged the question's own retrieval; ①–④ below are the second one's, with these phrasings
    return (f'<div class="kb-expansion" data-fallback="false" data-sources="expanded">多查询检索：门控按原问题判定后，'
            f'原问题及以下改写一起再次检索、融合，下方 ①–④ 与来源取自这次检索'
            f'<span class="kb-muted">（大模型改写{ms}）</span><ul>{items}</ul></div>')


def render_trace(trace: dict | None, elapsed_ms: Any = None) -> str:
    """「检索过程」: ① BM25 ② 向量 ③ RRF ④ 精排 (④'s numbers are the citation numbers) + stage timings."""
    if not trace:
        return '<div class="kb-trace kb-muted">提问后在这里查看检索过程。</div>'
    route = trace.get("route") or {}
    if route.get("route") == "DIRECT":
        return (f'<div class="kb-trace" data-route="DIRECT"><div class="kb-route">路由：{esc(route.get("label"))}'
                f' · {esc(route.get("reason"))}</div>{_ms_line(None, elapsed_ms)}</div>')
    parts = [f'<div class="kb-trace" data-route="{esc(route.get("route") or "")}">', _query_line(trace, route),
             _ms_line(trace.get("ms"), elapsed_ms)]
    gate = trace.get("gate") or {}
    if gate:
        parts.append(render_gate(gate))
    parts.append(render_calibration(trace.get("calibration")))
    if trace.get("filter"):  # the document filter both routes applied
        from .tag_filter import filter_html  # (that module imports gradio; this one does not)

        parts.append(filter_html(trace["filter"]))
    refusal = trace.get("refusal")
    if refusal:  # the LLM or the extractive reader refused after the gate let the question through
        parts.append(f'<div class="kb-refusal" data-by="{esc(refusal.get("by"))}">拒答：{esc(refusal.get("reason"))}'
                     '</div>')
    support = trace.get("support")
    if support:
        bad = support.get("unsupported", 0)
        parts.append(f'<div class="kb-support" data-unsupported="{esc(bad)}">引用核验：检查 '
                     f'{esc(support.get("checked", 0))} 处引用，'
                     f'{"全部有来源支持" if not bad else f"{esc(bad)} 处与所引来源不符（已在回答中标 ⚠）"}</div>')
    x = (trace.get("query") or {}).get("expansion") or {}
    n = 0 if x.get("fallback") else len(x.get("queries") or []) + bool(x.get("keywords"))
    also = f"；原问题与 {n} 个改写一起检索" if n else ""  # which ones: the 多查询检索 line above
    parts.append(f'<div class="kb-trace-sec" data-sec="bm25"><h4>① BM25 关键词检索 Top-10（得分{also}）</h4>')
    parts.append(_table(trace.get("bm25") or [], [("rank", "#"), ("doc", "文档"), ("score", "BM25 得分"),
                                                  ("text", "片段")]) + "</div>")
    parts.append(f'<div class="kb-trace-sec" data-sec="vector"><h4>② 向量检索 Top-10（相似度{also}，取最高）</h4>'
                 if also else '<div class="kb-trace-sec" data-sec="vector"><h4>② 向量检索 Top-10（相似度）</h4>')
    parts.append(_table(trace.get("vector") or [], [("rank", "#"), ("doc", "文档"), ("similarity", "相似度"),
                                                    ("text", "片段")]) + "</div>")
    parts.append(f'<div class="kb-trace-sec" data-sec="fused"><h4>③ {esc(fusion_title(trace.get("fusion")))}</h4>')
    fused = trace.get("fused", trace.get("rrf"))  # turns stored by older releases call it "rrf"
    parts.append(_table(fused or [], [("rank", "#"), ("doc", "文档"), ("fused_score", "融合分"),
                                                 ("bm25_rank", "BM25 名次"), ("bm25_score", "BM25 得分"),
                                                 ("vector_rank", "向量名次"), ("similarity", "相似度"),
                                                 ("length_prior", "短片段项"), ("text", "片段")]) + "</div>")
    note = rerank_note(trace.get("rerank_status"))
    parts.append('<div class="kb-trace-sec" data-sec="rerank"><h4>④ 精排 Top-6（编号即引用编号）</h4>')
    if note:
        parts.append(f'<div class="kb-rerank-note">{esc(note)}</div>')
    parts.append(_table(trace.get("rerank") or [], [("no", "引用"), ("doc", "文档"), ("rerank_score", "精排分"),
                                                    ("similarity", "相似度"), ("text", "片段")]) + "</div>")
    parts.append("</div>")
    return "".join(parts)
