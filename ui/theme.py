"""Look and page-level script of the UI.

Gradio 6 takes `theme`, `css` and `head` at `launch()` / `gr.mount_gradio_app()`, no longer at `gr.Blocks()`:
use `ui.theme.page_kwargs()` in both places (app.build_app and tests' demo.launch).
"""
from __future__ import annotations

import gradio as gr

from .viewer import DRAWER_CSS

# Offline: only local / system fonts (a GoogleFont would make every browser fetch fonts.googleapis.com).
_FONTS = (gr.themes.LocalFont("Source Sans Pro"), "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei",
          "Noto Sans CJK SC", "WenQuanYi Micro Hei", "ui-sans-serif", "system-ui", "sans-serif")


def make_theme() -> gr.themes.Base:
    return gr.themes.Default(primary_hue="blue", neutral_hue="slate", font=_FONTS)


CSS = """
#kb-header { align-items: center; gap: 12px; }
#kb-header h1 { margin: 0; font-size: 1.45rem; }
.kb-badges { display: flex; flex-wrap: wrap; gap: 6px; justify-content: flex-end; }
.kb-badge { display: inline-block; padding: 2px 10px; border-radius: 999px; font-size: 0.85rem;
            background: var(--block-background-fill); border: 1px solid var(--border-color-primary); }
.kb-badge-main { background: var(--color-accent-soft); font-weight: 600; }
.kb-badge-warn { background: #fff4e5; border-color: #f0b45a; color: #8a5200; }

.kb-stage { font-size: 0.92rem; padding: 4px 2px; min-height: 1.6em; }
.kb-step { padding: 1px 8px; border-radius: 6px; }
.kb-step-done { color: var(--body-text-color-subdued); }
.kb-step-active { background: var(--color-accent-soft); font-weight: 600; animation: kb-pulse 1.2s infinite; }
.kb-step-todo { color: var(--body-text-color-subdued); opacity: .6; }
.kb-arrow { margin: 0 4px; color: var(--body-text-color-subdued); }
.kb-stage-done { color: #1a7f37; }
.kb-stage-error { color: #b42318; }
@keyframes kb-pulse { 50% { opacity: .55; } }

a.kb-cite { text-decoration: none; font-weight: 600; color: var(--color-accent); cursor: pointer;
            padding: 0 1px; border-radius: 3px; }
a.kb-cite:hover { background: var(--color-accent-soft); }

.kb-sources { display: flex; flex-direction: column; gap: 8px; max-height: 640px; overflow-y: auto; }
.kb-src { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 10px;
          background: var(--block-background-fill); transition: box-shadow .3s, border-color .3s; scroll-margin: 12px; }
.kb-src summary { cursor: pointer; list-style: none; }
.kb-src summary::-webkit-details-marker { display: none; }
.kb-src-head { font-size: 0.85rem; color: var(--body-text-color-subdued); }
.kb-src-no { font-weight: 700; color: var(--color-accent); }
.kb-src-doc { font-weight: 600; color: var(--body-text-color); }
.kb-src-snip { margin-top: 4px; font-size: 0.92rem; }
.kb-src-ctx { margin-top: 2px; font-size: 0.8rem; color: var(--body-text-color-subdued); }
.kb-src-full { margin-top: 6px; white-space: pre-wrap; font-size: 0.88rem; border-top: 1px dashed var(--border-color-primary);
               padding-top: 6px; }
.kb-src.kb-cited { border-left: 3px solid var(--color-accent); }
.kb-src.kb-hl { border-color: #f59e0b; box-shadow: 0 0 0 3px rgba(245, 158, 11, .45); background: #fffbeb; }
.dark .kb-src.kb-hl { background: #3a2a05; }
.kb-tag { font-size: .75rem; padding: 0 6px; border-radius: 4px; background: #eef; }
.kb-src-kb { background: #e7f6ec; color: #1a7f37; }
.kb-tag-old { background: #fdecea; color: #b42318; }
.kb-muted { color: var(--body-text-color-subdued); font-size: 0.9rem; }
.kb-noanswer { padding: 10px; border-radius: 8px; background: #fff4e5; color: #8a5200; }

.kb-trace { font-size: 0.85rem; }
.kb-trace h4 { margin: 10px 0 4px; font-size: 0.92rem; }
.kb-ms-line { color: var(--body-text-color-subdued); margin-bottom: 4px; }
.kb-gate { margin: 4px 0; }
.kb-weak-banner { padding: 4px 8px; border-radius: 4px; background: #fff4e5; color: #8a5300; font-weight: 600; }
a.kb-cite.kb-cite-unsupported { color: #b42318; text-decoration: underline wavy #b42318; }
.kb-tag.kb-unsupported { background: #fde8e8; color: #b42318; }
.kb-support { margin: 4px 0; }
.kb-rerank-note { padding: 4px 8px; border-radius: 6px; background: #fff4e5; color: #8a5200; margin-bottom: 4px; }
.kb-trace-table { width: 100%; border-collapse: collapse; }
.kb-trace-table th, .kb-trace-table td { border-bottom: 1px solid var(--border-color-primary); padding: 3px 6px;
                                         text-align: left; vertical-align: top; }
.kb-trace-table td.kb-snip { color: var(--body-text-color-subdued); }
.kb-trace-table td.kb-doc, .kb-trace-table th { white-space: nowrap; }
#kb-history-list { max-height: 420px; overflow-y: auto; }
.kb-cite-off { color: var(--body-text-color-subdued); }
.kb-direct-tag, .kb-tag-verified { display: inline-block; padding: 0 6px; border-radius: 4px; font-size: 0.78rem;
                                   background: #eef4ff; color: #2450a8; }
.kb-tag-verified { background: #e8f7ee; color: #1b6b3a; }
.kb-route, .kb-query { margin: 2px 0; }
.kb-query { font-weight: 600; }
.kb-src-view { font-size: .78rem; margin-left: 6px; padding: 0 6px; border-radius: 4px; cursor: pointer;
               border: 1px solid var(--border-color-primary); color: var(--color-accent); }
.kb-trace-table tr[data-view-chunk], .kbc[data-view-chunk], .kbd-card[data-view-chunk] { cursor: pointer; }
""" + DRAWER_CSS

# Document-level script (goes into <head>): clicking a citation [n] highlights source card n and scrolls to it.
# Event delegation on the document, capture phase, so it works for content Gradio re-renders while streaming
# and before the markdown renderer's own link handling.
HEAD_JS = """
<script>
(function () {
  if (window.__kbCiteInstalled) return;
  window.__kbCiteInstalled = true;
  function citeNumber(a) {
    var n = a.getAttribute('data-cite');
    if (!n) { var h = a.getAttribute('href') || ''; var m = h.match(/kb-src-(\\d+)$/); if (m) n = m[1]; }
    if (!n) { var t = (a.textContent || '').match(/^\\s*\\[(\\d+)\\]\\s*$/); if (t) n = t[1]; }
    return n;
  }
  window.kbHighlightSource = function (n) {
    var card = document.getElementById('kb-src-' + n);
    document.querySelectorAll('.kb-src.kb-hl').forEach(function (e) { e.classList.remove('kb-hl'); });
    if (!card) return false;
    card.classList.add('kb-hl');
    if (card.tagName === 'DETAILS') card.open = true;
    card.scrollIntoView({behavior: 'smooth', block: 'center'});
    // … and open the document viewer on that passage (the sources panel's js_on_load listens for kb-view)
    if (card.dataset.chunk) card.dispatchEvent(new CustomEvent('kb-view', {bubbles: true,
                                                                detail: {chunk_id: Number(card.dataset.chunk)}}));
    clearTimeout(window.__kbHlTimer);
    window.__kbHlTimer = setTimeout(function () { card.classList.remove('kb-hl'); }, 6000);
    return true;
  };
  document.addEventListener('click', function (ev) {
    var a = ev.target && ev.target.closest && ev.target.closest('a.kb-cite, a[href^="#kb-src-"]');
    if (!a) return;
    var n = citeNumber(a);
    if (!n) return;
    ev.preventDefault();
    ev.stopPropagation();
    window.kbHighlightSource(n);
  }, true);
})();
</script>
"""


def page_kwargs() -> dict:
    """theme/css/head for `Blocks.launch()` or `gr.mount_gradio_app()` (Gradio 6 placement).

    Also turns off Gradio 6's own "run history" (it would keep every call's inputs and outputs in the browser
    next to ours, unscoped by user) and its footer link to it.
    """
    return {"theme": make_theme(), "css": CSS, "head": HEAD_JS, "run_history": False,
            "footer_links": ["api", "settings"]}
