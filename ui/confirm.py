"""A hidden 「确认 / 取消」 panel: a question, a confirm button and a cancel button that hides the panel again."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


@dataclass
class ConfirmPanel:
    group: gr.Group
    text: gr.Markdown
    yes: gr.Button
    no: gr.Button


def confirm_panel(yes_label: str, yes_elem_id: str | None = None) -> ConfirmPanel:
    with gr.Group(visible=False) as group:
        text = gr.Markdown("")
        with gr.Row():
            yes = gr.Button(yes_label, variant="stop", elem_id=yes_elem_id)
            no = gr.Button("取消")
    return ConfirmPanel(group, text, yes, no)
