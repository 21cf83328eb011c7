"""预览分块 and the picked knowledge base's chunking, under the upload area of 知识库 → 文档管理.

A file picked here is parsed and cut with the knowledge base's chunking (or the values in the three fields, tried
unsaved) and shown chunk by chunk — nothing is stored. 按此设置导入 saves the fields as this knowledge base's
chunking (a value equal to the global setting means 沿用全局) and ingests the file; 取消 drops it. When the
knowledge base already holds documents cut the old way, saving asks whether to rebuild that knowledge base only.
Everything goes through engine.kb_chunking / update_kb_chunking / preview_upload / upload / start_rebuild(kb_id);
every handler re-checks the caller (KB admin). API names: kb_preview, kb_preview_ingest, kb_chunking_save,
kb_chunking_rebuild.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role
from pipeline.ingestion.kb_chunking import FIELDS
from pipeline.retrieval.kb_indexes import DEFAULT_KB_ID
from pipeline.settings import LABELS, Settings, bounds, range_text

from . import guard
from .confirm import confirm_panel
from .render import esc

log = logging.getLogger(__name__)

PREVIEW_CSS = """
.kbp-head { font-size: .9rem; margin-bottom: 6px; }
.kbp-list { display: flex; flex-direction: column; gap: 6px; max-height: 520px; overflow-y: auto; }
.kbp { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 6px 10px; }
.kbp-meta { font-size: .8rem; opacity: .75; }
.kbp-text { white-space: pre-wrap; font-size: .88rem; margin-top: 2px; }
.kbp-bad { color: #b42318; }
"""


def _label(name: str) -> str:
    r = range_text(name)
    return f"{LABELS[name]}（{r}）" if r else LABELS[name]


def chunking_text(info: dict) -> str:
    """本知识库：块大小 200（本库设置）· 块重叠 50（沿用全局）· 按结构切块 是（沿用全局）."""
    parts = []
    for f in FIELDS:
        v = info["chunking"][f]
        shown = ("是" if v else "否") if isinstance(v, bool) else str(v)
        parts.append(f"{LABELS[f]} {shown}（{'本库设置' if f in info['overrides'] else '沿用全局'}）")
    return "本知识库的切块参数：" + " · ".join(parts)


def preview_html(res: dict) -> str:
    ck = res["chunking"]
    mode = "按结构" if ck["chunk_structure"] else "只按句子"
    head = (f'<div class="kbp-head" data-count="{int(res["count"])}"><b>{esc(res["file_name"])}</b> 将切成 '
            f'<b>{int(res["count"])}</b> 块（块大小 {int(ck["chunk_size"])} · 重叠 {int(ck["chunk_overlap"])} · '
            f'{mode}）· 尚未保存任何内容')
    if res.get("existing"):
        head += ' · <span class="kbp-bad">内容相同的文档已在本知识库中，导入不会重复入库</span>'
    elif res.get("replaces"):
        head += f' · 导入后成为同名文档的新版本（当前 v{int(res["replaces"]["version"])}）'
    for w in res.get("warnings") or []:
        head += f"<br>⚠️ {esc(w)}"
    cards = []
    for c in res["chunks"]:
        meta = [f"块 {int(c['index']) + 1}", f"{int(c['length'])} 字"]
        if c.get("page"):
            meta.append(f"第 {int(c['page'])} 页")
        if c.get("context"):
            meta.append(esc(c["context"]))
        cards.append(f'<div class="kbp" data-len="{int(c["length"])}"><div class="kbp-meta">{" · ".join(meta)}</div>'
                     f'<div class="kbp-text">{esc(c["text"])}</div></div>')
    more = (f'<div class="kbp-meta">仅显示前 {len(res["chunks"])} 块（共 {int(res["count"])} 块）</div>'
            if res["count"] > len(res["chunks"]) else "")
    return f'{head}</div><div class="kbp-list">{"".join(cards)}</div>{more}'


@dataclass
class UploadPreview:
    wire: Callable[..., None]  # (kb picker, refresh(kb_id, request) → table values, their outputs, report)
    handlers: dict[str, Callable] = field(default_factory=dict)


def build_upload_preview(engine, policy: AccessPolicy, file_types: list[str]) -> UploadPreview:
    """Laid out where it is called; `.wire(...)` connects it once the document table exists."""
    with gr.Accordion("预览分块 · 本知识库的切块参数", open=False, elem_id="kb-preview"):
        gr.Markdown("选一个文件先看它会被切成哪些块（不保存任何内容）；可调整本知识库的切块参数再预览，"
                    "满意后「按此设置导入」，或「取消」。")
        with gr.Row(equal_height=True):
            size_lo, size_hi = bounds("chunk_size")
            size = gr.Number(label=_label("chunk_size"), precision=0, minimum=size_lo, maximum=size_hi,
                             elem_id="kb-ck-size")
            overlap = gr.Number(label=_label("chunk_overlap"), precision=0, minimum=bounds("chunk_overlap")[0],
                                elem_id="kb-ck-overlap")
            structure = gr.Checkbox(label=LABELS["chunk_structure"], value=True, elem_id="kb-ck-structure",
                                    info=Settings.model_fields["chunk_structure"].description)
        info = gr.Markdown("", elem_id="kb-ck-info")
        pick = gr.File(label="要预览的文件（单个）", file_count="single", file_types=file_types, height=110,
                       elem_id="kb-preview-file")
        with gr.Row():
            run = gr.Button("预览分块", elem_id="kb-preview-run")
            ingest = gr.Button("按此设置导入", variant="primary", elem_id="kb-preview-ingest")
            save = gr.Button("只保存切块参数", elem_id="kb-ck-save")
            reset = gr.Button("恢复全局默认", elem_id="kb-ck-reset")
            cancel = gr.Button("取消", elem_id="kb-preview-cancel")
        result = gr.HTML("", css_template=PREVIEW_CSS, elem_id="kb-preview-result")
        panel = confirm_panel("仅重建本知识库", "kb-ck-rebuild-yes")
        msg = gr.Markdown("", elem_id="kb-ck-msg")

    def require(request) -> None:
        guard.require(policy, request, Role.KB_ADMIN)

    def fields_of(kb_id) -> tuple:
        info_ = engine.kb_chunking(int(kb_id))
        ck = info_["chunking"]
        return ck["chunk_size"], ck["chunk_overlap"], ck["chunk_structure"], chunking_text(info_)

    def changes_of(kb_id, size_v, overlap_v, structure_v) -> dict:
        """The three fields as this KB's values; one equal to the global setting follows the global one."""
        defaults = engine.kb_chunking(int(kb_id))["defaults"]
        values = {"chunk_size": size_v, "chunk_overlap": overlap_v, "chunk_structure": structure_v}
        out = {}
        for f, v in values.items():
            if v is not None and not isinstance(v, bool) and isinstance(v, float) and v.is_integer():
                v = int(v)
            out[f] = None if v is None or v == defaults[f] else v
        return out

    def kb_chunking_load(kb_id, request: gr.Request):
        if policy.denial(guard.request_user(request), Role.KB_ADMIN):
            return gr.skip(), gr.skip(), gr.skip(), ""
        try:
            return fields_of(kb_id)
        except Exception as exc:
            return gr.skip(), gr.skip(), gr.skip(), f"⚠️ {esc(guard.error_text(exc))}"

    def kb_preview(file, kb_id, size_v, overlap_v, structure_v, request: gr.Request):
        require(request)
        item = next(iter(guard.file_items(file)), None)
        if item is None:
            return '<div class="kbp-bad">请先选择要预览的文件</div>'
        try:
            res = engine.preview_upload(int(kb_id), item[0], item[1],
                                        changes_of(kb_id, size_v, overlap_v, structure_v))
        except Exception as exc:  # EngineError / SettingsError: a refused file, a value out of range
            if not getattr(exc, "code", None) and not getattr(exc, "errors", None):
                log.exception("preview failed")
            return f'<div class="kbp-bad">无法预览：{esc(guard.error_text(exc))}</div>'
        return preview_html(res)

    def saved(kb_id, size_v, overlap_v, structure_v, request) -> tuple[dict | None, str]:
        """Save the fields as this KB's chunking: (the answer or None, a message)."""
        try:
            res = engine.update_kb_chunking(int(kb_id), changes_of(kb_id, size_v, overlap_v, structure_v),
                                            actor=guard.page_actor(request))
        except Exception as exc:
            return None, f"⚠️ 切块参数未保存：{esc(guard.error_text(exc))}"
        return res, ("已保存本知识库的切块参数" if res["changed"] else "切块参数未变")

    def ask_rebuild(res: dict | None) -> tuple:
        if not res or not res["need_rebuild"]:
            return gr.update(visible=False), ""
        return (gr.update(visible=True), "**本知识库已有文档按旧参数切块。** 是否仅重建本知识库？"
                "（重新解析其原始文件并按新参数切块；其他知识库不受影响，期间不能上传或删除文档）")

    def kb_chunking_save(kb_id, size_v, overlap_v, structure_v, request: gr.Request):
        require(request)
        res, text = saved(kb_id, size_v, overlap_v, structure_v, request)
        vals = fields_of(kb_id) if res else (gr.skip(),) * 4
        return (*vals, text, *ask_rebuild(res))

    def kb_chunking_reset(kb_id, request: gr.Request):
        require(request)
        d = engine.kb_chunking(int(kb_id))["defaults"]
        return kb_chunking_save(kb_id, d["chunk_size"], d["chunk_overlap"], d["chunk_structure"], request)

    def kb_chunking_rebuild(kb_id, request: gr.Request):
        require(request)
        try:
            engine.start_rebuild(int(kb_id))
        except Exception as exc:
            return gr.update(visible=False), f"⚠️ 无法开始重建：{esc(guard.error_text(exc))}"
        return gr.update(visible=False), "本知识库重建中（进度见下方文档列表）"

    def wire(kb: gr.Dropdown, refresh: Callable[..., tuple], refresh_outputs: list, report: gr.HTML,
             report_html: Callable[[list[dict]], str]) -> None:
        def kb_preview_ingest(file, kb_id, size_v, overlap_v, structure_v, request: gr.Request):
            """Save the fields as this KB's chunking, then ingest the file (cut with them)."""
            require(request)
            item = next(iter(guard.file_items(file)), None)
            skip = (gr.skip(),) * len(refresh_outputs)
            if item is None:
                return (gr.skip(), '<div class="kbp-bad">请先选择要导入的文件</div>', gr.skip(), gr.skip(),
                        gr.skip(), gr.skip(), gr.skip(), *skip)
            res, text = saved(kb_id, size_v, overlap_v, structure_v, request)
            if res is None:
                return gr.skip(), gr.skip(), text, gr.skip(), gr.skip(), gr.skip(), gr.skip(), *skip
            try:
                results = [r.to_dict() for r in engine.upload([item], int(kb_id))]
            except Exception as exc:  # rebuild running / engine not ready
                return (gr.skip(), gr.skip(), f"⚠️ 未导入：{esc(guard.error_text(exc))}", gr.skip(), gr.skip(), gr.skip(),
                        chunking_text(res), *skip)
            return (None, "", text, *ask_rebuild(res), report_html(results), chunking_text(res),
                    *refresh(int(kb_id or DEFAULT_KB_ID), request))

        def after_rebuild(kb_id, request: gr.Request):
            return refresh(int(kb_id or DEFAULT_KB_ID), request)

        kb.change(kb_chunking_load, [kb], [size, overlap, structure, info], api_name=False, show_progress="hidden")
        gr.on(None, kb_chunking_load, [kb], [size, overlap, structure, info], api_name=False,
              show_progress="hidden")  # page load
        run.click(kb_preview, [pick, kb, size, overlap, structure], result, api_name="kb_preview",
                  concurrency_limit=1, show_progress_on=[result], preprocess=False)
        ingest.click(kb_preview_ingest, [pick, kb, size, overlap, structure],
                     [pick, result, msg, panel.group, panel.text, report, info, *refresh_outputs],
                     api_name="kb_preview_ingest", concurrency_limit=1, preprocess=False)
        save.click(kb_chunking_save, [kb, size, overlap, structure],
                   [size, overlap, structure, info, msg, panel.group, panel.text], api_name="kb_chunking_save")
        reset.click(kb_chunking_reset, [kb], [size, overlap, structure, info, msg, panel.group, panel.text],
                    api_name=False)
        panel.yes.click(kb_chunking_rebuild, [kb], [panel.group, msg], api_name="kb_chunking_rebuild",
                        concurrency_limit=1).then(after_rebuild, [kb], refresh_outputs, api_name=False)
        cancel.click(lambda: (None, "", "", gr.update(visible=False)), None, [pick, result, msg, panel.group],
                     api_name=False)
        handlers.update(kb_preview_ingest=kb_preview_ingest)

    handlers = {"kb_preview": kb_preview, "kb_chunking_save": kb_chunking_save,
                "kb_chunking_reset": kb_chunking_reset, "kb_chunking_rebuild": kb_chunking_rebuild,
                "kb_chunking_load": kb_chunking_load}
    return UploadPreview(wire, handlers)
