"""HTML of a consistency audit (Engine.audit) and of a repair (Engine.repair) for the 知识库 tab's 审计 panel."""
from __future__ import annotations

from .render import esc

AUDIT_CSS = """
.kba { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 12px; font-size: .9rem; }
.kba-ok { color: #1a7f37; font-weight: 600; }
.kba-bad { color: #b42318; font-weight: 600; }
.kba-find { margin: 6px 0 0; }
.kba-fix { font-size: .85rem; opacity: .85; }
.kba-manual { color: #8a5200; }
.kba-items { margin: 2px 0 0 1.2em; padding: 0; font-size: .8rem; opacity: .8; }
.kba-counts { font-size: .8rem; opacity: .75; }
"""
SHOWN = 8


def _counts(report: dict) -> str:
    c = report.get("counts") or {}
    return (f'<div class="kba-counts">文档 {esc(c.get("docs"))}（就绪 {esc(c.get("ready_docs"))}）· 块 '
            f'{esc(c.get("chunks"))} · 向量 {esc(c.get("vectors"))} · 文件 {esc(c.get("files"))} · 用时 '
            f'{esc(report.get("elapsed_ms"))} ms</div>')


def audit_html(report: dict) -> str:
    if report.get("ok"):
        head = '<div class="kba-ok" data-audit="ok">✅ 一致：SQLite、BM25 分词、向量库与原始文件没有发现问题</div>'
    else:
        head = f'<div class="kba-bad" data-audit="problems">发现 {esc(report.get("problems"))} 项问题</div>'
    parts = [head]
    for f in report.get("findings") or []:
        cls = "kba-fix" if f.get("fixable") else "kba-fix kba-manual"
        how = ("修复方式：" if f.get("fixable") else "需人工处理：") + esc(f.get("fix"))
        items = "".join(f"<li>{esc(', '.join(f'{k}={v}' for k, v in it.items()))}</li>"
                        for it in (f.get("items") or [])[:SHOWN])
        more = f"<li>…另 {int(f['count']) - SHOWN} 项</li>" if int(f.get("count") or 0) > SHOWN else ""
        parts.append(f'<div class="kba-find" data-check="{esc(f.get("check"))}"><b>✗ {esc(f.get("label"))}</b>'
                     f'：{esc(f.get("count"))} 项<div class="{cls}">{how}</div>'
                     f'<ul class="kba-items">{items}{more}</ul></div>')
    flags = report.get("instruction_flags") or []
    if flags:  # information, not a consistency problem
        items = "".join(f"<li>{esc(f.get('file_name'))}（doc_id={esc(f.get('doc_id'))}）：{esc(f.get('count'))} 句，"
                        f"如「{esc((f.get('sentences') or [''])[0][:60])}」</li>" for f in flags[:SHOWN])
        parts.append(f'<div class="kba-find kba-flags" data-check="instruction_flags"><b>⚠ 含疑似指令文字的文档</b>'
                     f'：{len(flags)} 个（已在提示中标记，不会被原文摘录引用）<ul class="kba-items">{items}</ul></div>')
    return f'<div class="kba">{"".join(parts)}{_counts(report)}</div>'


def repair_html(res: dict) -> str:
    done = "".join(f"<li>{esc(a.get('what'))}：{esc(a.get('count'))}</li>" for a in res.get("actions") or [])
    head = (f'<div class="kba-counts">修复前 {esc(res.get("before"))} 项 → 修复后 {esc(res.get("after"))} 项'
            f'（用时 {esc(res.get("elapsed_ms"))} ms）</div>')
    body = f'<ul class="kba-items">{done}</ul>' if done else ""
    return head + body + audit_html(res.get("report") or {})
