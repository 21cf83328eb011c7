"""The chat's tag picker, beside the knowledge base picker: ask only within documents carrying some tags.

「任一」 = documents with at least one picked tag (filter tags_any), 「全部」 = documents with every picked tag
(tags_all). The filter is applied inside both retrieval routes (pipeline/retrieval/doc_filter.py); the trace
(检索过程) shows it. The choices are the tags in use in the picked knowledge bases, refreshed on page load and
whenever the knowledge base pick changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipeline.access.policy import Reader

from . import guard
from .kb_spaces import refresh_scope, scope_ids
from .render import esc

ANY, ALL = "任一标签", "全部标签"


def tag_choices(engine, kb_ids: list[int] | None, reader: Reader | None = None) -> list[tuple[str, str]]:
    """(「标签（n 篇）」, tag) of the tags in use in these knowledge bases."""
    try:
        return [(f"{t['tag']}（{t['docs']} 篇）", t["tag"]) for t in engine.list_tags(kb_ids or None, reader)]
    except Exception:  # a knowledge base just deleted / not readable: no choices rather than a broken page
        return []


def filter_of(tags: Any, mode: Any) -> dict | None:
    """The picked tags as a document filter (None: no tag picked)."""
    picked = [str(t) for t in (tags or []) if str(t).strip()]
    if not picked:
        return None
    return {"tags_all" if mode == ALL else "tags_any": picked}


@dataclass
class TagFilter:
    tags: gr.Dropdown
    mode: gr.Radio

    @property
    def inputs(self) -> list:
        return [self.tags, self.mode]


def build_tag_filter(engine, elem_id: str = "kb-tag-filter") -> TagFilter:
    """Laid out where it is called (the row of the knowledge base picker). Custom values are allowed: a page
    opened before a tag was removed still submits (the tag then matches nothing), and a tag can be typed."""
    tags = gr.Dropdown(choices=tag_choices(engine, None), value=[], multiselect=True, label="按标签筛选（可选）",
                       elem_id=elem_id, interactive=True, allow_custom_value=True, scale=2,
                       info="只在带这些标签的文档中检索")
    mode = gr.Radio([ANY, ALL], value=ANY, show_label=False, elem_id=f"{elem_id}-mode", scale=1, min_width=160)
    return TagFilter(tags, mode)


def refresh_tags(engine, kb_ids: list[int] | None, reader: Reader | None, picked: Any = None) -> gr.Dropdown:
    """The tags in use in the picked knowledge bases; picked tags still in use stay picked."""
    choices = tag_choices(engine, kb_ids, reader)
    have = {v for _, v in choices}
    return gr.Dropdown(choices=choices, value=[t for t in (picked or []) if t in have])


def wire_scope(engine, policy, kbs: gr.Dropdown, tag_filter: TagFilter, tags_api_name: str | bool = False) -> None:
    """On page load: the knowledge bases the user may read, all picked, then the tags in use in them; a new pick of
    knowledge bases: their tags."""
    def load_scope(request: gr.Request):
        return refresh_scope(engine, guard.reader_of(policy, request))

    def load_tags(kb_value, picked, request: gr.Request):
        reader = guard.reader_of(policy, request)
        return refresh_tags(engine, scope_ids(engine, kb_value, reader), reader, picked)

    gr.on(None, load_scope, None, [kbs], api_name=False, show_progress="hidden").then(
        load_tags, [kbs, tag_filter.tags], [tag_filter.tags], api_name=False, show_progress="hidden")
    kbs.change(load_tags, [kbs, tag_filter.tags], [tag_filter.tags], api_name=tags_api_name, show_progress="hidden")


def describe_filter(flt: dict | None) -> str:
    """The filter in words, as the trace and the debug view show it ('' when there is none)."""
    if not flt:
        return ""
    parts = []
    if flt.get("doc_ids"):  # a follow-up searched within the documents the last answer cited
        names = flt.get("doc_names") or [f"#{d}" for d in flt["doc_ids"]]
        parts.append("追问：上一轮回答引用的文档 " + "、".join(f"《{n}》" for n in names))
    if flt.get("tags_any"):
        parts.append("任一标签：" + "、".join(flt["tags_any"]))
    if flt.get("tags_all"):
        parts.append("全部标签：" + "、".join(flt["tags_all"]))
    for k, v in (flt.get("metadata") or {}).items():
        parts.append(f"{k} = {v}")
    if flt.get("date_from") or flt.get("date_to"):
        parts.append(f"上传日期 {flt.get('date_from') or '…'} 至 {flt.get('date_to') or '…'}")
    return "；".join(parts)


def filter_html(flt: dict | None) -> str:
    """The trace's 「文档筛选」 line: both routes searched only the documents matching it."""
    text = describe_filter(flt)
    if not text:
        return ""
    return (f'<div class="kb-filter" data-filter="1">文档筛选（两路检索都只在符合条件的文档中进行）：'
            f'{esc(text)}</div>')
