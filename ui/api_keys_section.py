"""配置 → 开放接口: create an API key (its secret shown this once), list the keys, revoke one — admins only.

Everything goes through the engine's ApiKeyService (pipeline/services/api_keys.py), the same as /api/keys; the
list never holds a secret (the service has none to give). Every handler checks the caller on the server.
API names: keys_list, keys_create, keys_revoke.
"""
from __future__ import annotations

from typing import Any

import gradio as gr

from pipeline.access.policy import AccessPolicy, Role
from pipeline.errors import EngineError

from . import guard
from .guard import request_user
from .render import esc

ROLE_CHOICES = [("只读（reader）", "reader"), ("知识库管理员（kb-admin）", "kb-admin"), ("管理员（admin）", "admin")]
ROLE_LABEL = {v: k for k, v in ROLE_CHOICES}


def render_keys(keys: list[dict], kb_names: dict[int, str]) -> str:
    if not keys:
        return '<div class="kbs-hint" id="keys-empty">还没有 API Key。</div>'
    rows = []
    for k in keys:
        kbs = "全部" if k["kb_ids"] is None else "、".join(kb_names.get(i, str(i)) for i in k["kb_ids"])
        state = "已吊销" if k["revoked"] else "已过期" if k["expired"] else "有效"
        rows.append(
            f'<tr data-key-id="{k["key_id"]}" data-state="{state}"><td>{k["key_id"]}</td><td>{esc(k["name"])}</td>'
            f'<td>{esc(ROLE_LABEL.get(k["role"], k["role"]))}</td><td>{esc(kbs)}</td>'
            f'<td><code>{esc(k["prefix"])}…</code></td><td>{esc(k["rate_limit"] if k["rate_limit"] is not None else "默认")}</td>'
            f'<td>{esc(k["expires_at"] or "永不")}</td><td>{esc(k["last_used_at"] or "从未")}</td>'
            f'<td>{esc(k["created_by"] or "本机")}</td><td>{state}</td></tr>')
    head = ("<tr><th>ID</th><th>名称</th><th>角色</th><th>知识库</th><th>前缀</th><th>每分钟上限</th><th>到期</th>"
            "<th>最近使用</th><th>创建者</th><th>状态</th></tr>")
    return f'<table id="keys-table">{head}{"".join(rows)}</table>'


def build_api_keys_section(engine, policy: AccessPolicy | None = None) -> dict[str, Any]:
    policy = policy or AccessPolicy()

    def require(request) -> None:
        guard.require(policy, request, Role.ADMIN)

    def kb_names() -> dict[int, str]:
        return {kb["kb_id"]: kb["name"] for kb in engine.list_kbs()}

    def listing() -> str:
        return render_keys(engine.list_api_keys(), kb_names())

    with gr.Column(variant="panel", elem_id="cfg-card-keys"):
        gr.Markdown("### 开放接口（API Key）")
        gr.Markdown("给其他工具（OpenAI 兼容的 `/v1`、脚本调用 `/api`）用的 API Key：密钥只在创建时显示一次，"
                    "数据库只保存其哈希。README「Connect other tools」有接入示例。", elem_classes=["kbs-hint"])
        with gr.Row():
            name = gr.Textbox(label="名称", max_lines=1, elem_id="keys-name", placeholder="例如：客服机器人")
            role = gr.Dropdown(choices=ROLE_CHOICES, value="reader", label="角色", elem_id="keys-role")
            # custom values allowed: knowledge bases made after the page was built (the engine checks each id)
            kbs = gr.Dropdown(choices=[(n, i) for i, n in kb_names().items()], value=[], multiselect=True,
                              allow_custom_value=True, label="可访问的知识库（不选 = 全部）", elem_id="keys-kbs")
        with gr.Row():
            days = gr.Number(value=0, label="有效天数（0 = 永不过期）", minimum=0, maximum=3650, elem_id="keys-days")
            limit = gr.Number(value=None, label="每分钟请求上限（空 = 使用设置中的默认值，0 = 不限）", minimum=0,
                              maximum=100000, precision=0, elem_id="keys-limit")
            create_btn = gr.Button("创建 API Key", variant="primary", elem_id="keys-create")
        secret = gr.Textbox(label="新密钥（只显示这一次，请立即复制保存）", visible=False, interactive=False,
                            elem_id="keys-secret", buttons=["copy"])
        table = gr.HTML("", elem_id="keys-list")
        with gr.Row():
            revoke_id = gr.Number(value=None, label="要吊销的 Key ID", precision=0, elem_id="keys-revoke-id")
            revoke_btn = gr.Button("吊销", variant="stop", elem_id="keys-revoke")
        status = gr.HTML("", elem_id="keys-status")

    def keys_list(request: gr.Request):
        if not policy.allows(request_user(request), Role.ADMIN):  # silent on page load
            return gr.skip(), gr.skip()
        return listing(), gr.update(choices=[(n, i) for i, n in kb_names().items()])

    def keys_create(name_v, role_v, kbs_v, days_v, limit_v, request: gr.Request):
        require(request)
        try:
            made = engine.create_api_key(name_v, role_v or "reader", [int(k) for k in kbs_v] if kbs_v else None,
                                         expires_in_days=float(days_v) if days_v else None,
                                         rate_limit=int(limit_v) if limit_v is not None else None,
                                         created_by=request_user(request), actor=guard.page_actor(request))
        except EngineError as exc:
            return gr.update(value="", visible=False), gr.skip(), f'<div class="kbs-err">⚠️ {esc(exc.msg)}</div>'
        return (gr.update(value=made["secret"], visible=True), listing(),
                f'<div class="kbs-hint">已创建「{esc(made["name"])}」（ID {made["key_id"]}）：密钥只显示这一次。</div>')

    def keys_revoke(key_id, request: gr.Request):
        require(request)
        try:
            gone = engine.revoke_api_key(int(key_id) if key_id is not None else None, actor=guard.page_actor(request))
        except EngineError as exc:
            return gr.skip(), f'<div class="kbs-err">⚠️ {esc(exc.msg)}</div>', gr.skip()
        return listing(), f'<div class="kbs-hint">已吊销「{esc(gone["name"])}」，立即失效。</div>', \
            gr.update(value="", visible=False)

    gr.on(None, keys_list, None, [table, kbs], api_name=False, show_progress="hidden")  # page load
    refresh = gr.Button("刷新", visible=False)
    refresh.click(keys_list, None, [table, kbs], api_name="keys_list")
    create_btn.click(keys_create, [name, role, kbs, days, limit], [secret, table, status], api_name="keys_create")
    revoke_btn.click(keys_revoke, [revoke_id], [table, status, secret], api_name="keys_revoke")
    return {"table": table, "secret": secret, "status": status,
            "handlers": {"keys_list": keys_list, "keys_create": keys_create, "keys_revoke": keys_revoke}}
