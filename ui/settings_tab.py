"""配置 tab: every tunable, no code, no restart — and a banner that says what took effect.

Cards follow pipeline.settings.GROUPS (LLM 生成 / 检索参数 / 切块参数 + OCR / 模型路径), each with its own
「恢复默认」 (fills the form from engine.default_settings(); never touches the API key; still needs 保存).
Footer: 保存 · 测试 LLM 连通 · 重载引擎.

Validation, persistence, model-path checks and key masking live in the engine (update_settings / test_llm /
SettingsError); this module only maps form ↔ flat dict and renders messages. The API key reaches the browser
only as `****abcd`; saving the mask back keeps the stored key. Nothing here logs a form value.

Every handler checks the caller against AccessPolicy.is_admin on the server (a hidden tab is not security).
API names: settings_load, settings_save, settings_check, settings_test_llm, settings_reload,
settings_defaults_<group>. While the user edits, settings_check (engine.check_settings: the save rules, nothing
saved) shows a red line under each refused field and disables 保存 until the form is valid.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

import gradio as gr

from pipeline.access.policy import DENIED_TEXT, AccessPolicy, Role
from pipeline.settings import (
    GROUPS,
    LABELS,
    SECRET_FIELDS,
    Settings,
    SettingsError,
    field_meta,
    is_masked,
    mask_secret,
    range_text,
)

from . import guard
from .api_keys_section import build_api_keys_section
from .guard import request_user
from .render import esc

log = logging.getLogger(__name__)

DENIED = DENIED_TEXT[Role.ADMIN]
FIELDS: list[str] = [f for fields in GROUPS.values() for f in fields]
CARDS: list[tuple[str, list[str]]] = [
    ("llm", ["llm", "api"]), ("retrieval", ["retrieval"]), ("chunking", ["chunking", "ocr", "parsing"]),
    ("models", ["models"]),
]
CARD_TITLES = {"llm": "LLM 生成", "retrieval": "检索参数", "chunking": "切块参数 · OCR · 解析上限", "models": "模型路径"}

EFFECT_TEXT = {"immediate": "保存后立即生效", "reload": "需 重载引擎", "rebuild": "新文档立即生效，已有文档需 全量重建"}
ERROR_STYLE = "color:#b42318;font-size:.85rem;margin-top:-6px"


# ---------------------------------------------------------------------------------------------- field metadata
def field_kind(name: str) -> type:
    ann = Settings.model_fields[name].annotation
    return ann if ann in (str, int, float, bool) else str


def choices_of(name: str) -> list[str]:
    """The allowed values of a Literal[...] field (shown as a dropdown); [] for any other field."""
    ann = Settings.model_fields[name].annotation
    return [str(a) for a in get_args(ann)] if get_origin(ann) is Literal else []


def field_info(name: str) -> str:
    kind = field_kind(name)
    parts = [Settings.model_fields[name].description] if choices_of(name) else []
    if kind in (int, float):
        r = range_text(name)
        parts.append(("整数" if kind is int else "数字") + (f"，{r}" if r else ""))
    if name == "chunk_overlap":
        parts.append("须小于块大小")
    if name in SECRET_FIELDS:
        parts.append("只显示掩码；输入新 Key 替换，保持掩码则不变")
    if name in ("embedding_model_path", "reranker_model_path"):
        parts.append("含 config.json 的本地目录；留空 = 内置默认")
    if name == "embedding_model_path":
        parts.append("更换后需 重载引擎 + 全量重建")
    else:
        parts.append(EFFECT_TEXT[field_meta(name)["effect"]])
    return "；".join(parts)


def form_value(name: str, value: Any) -> Any:
    """A settings value as the form shows it (the secret masked)."""
    if name in SECRET_FIELDS:
        return value if is_masked(value) else mask_secret(value or "")
    return value


def payload_from_form(values: dict[str, Any]) -> dict[str, Any]:
    """Form values → flat settings dict. Types are left for pydantic to check (2.5 for an int → error)."""
    out: dict[str, Any] = {}
    for name, v in values.items():
        kind = field_kind(name)
        if kind is str:
            out[name] = "" if v is None else str(v).strip()
        elif kind is bool:
            out[name] = bool(v)
        elif kind is int and isinstance(v, float) and v.is_integer():
            out[name] = int(v)
        else:
            out[name] = v  # None / non-integral floats reach the validator and get a field message
    return out


def scrub(text: str, secrets: list[str]) -> str:
    """Remove any full secret from a message before it is shown (error texts may echo the key)."""
    for s in secrets:
        if s and len(s) >= 4 and not is_masked(s):
            text = text.replace(s, mask_secret(s))
    return text


def _named(names: list[str], impl: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A handler `name` whose signature is `(<each name>, request: gr.Request)` calling impl(values_dict, request).

    Gradio reads the signature for API parameter names and the annotations to inject gr.Request, so the
    endpoint shows `llm_model, llm_api_url, …` (not param_0…) and still knows the caller.
    """
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request,
                                    default=None))
    sig = inspect.Signature(params)

    def handler(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        request = a.pop("request", None)
        return impl(a, request)

    handler.__signature__ = sig  # type: ignore[attr-defined]
    handler.__annotations__ = {"request": gr.Request}
    handler.__name__ = name
    return handler


# ---------------------------------------------------------------------------------------------- banners
def banner(kind: str, title: str, lines: list[str] | None = None) -> str:
    colours = {"ok": ("#e7f6ec", "#1a7f37"), "warn": ("#fff4e5", "#8a5200"), "err": ("#fdecea", "#b42318"),
               "info": ("#e8f0fe", "#1d4ed8")}
    bg, fg = colours.get(kind, colours["info"])
    items = "".join(f"<li>{x}</li>" for x in (lines or []))
    body = f'<ul style="margin:4px 0 0 1.1em;padding:0">{items}</ul>' if items else ""
    return (f'<div class="kbs-banner" data-kind="{kind}" style="background:{bg};color:{fg};border-radius:8px;'
            f'padding:8px 12px;margin:4px 0"><b>{title}</b>{body}</div>')


def _labels(keys: list[str]) -> str:
    return "、".join(esc(LABELS.get(k, k)) for k in keys)


def save_banner(result: dict) -> str:
    changed = result.get("changed") or []
    if not changed:
        return banner("info", "没有参数改动，无需保存")
    cfg_flat = {k: v for g in (result.get("config") or {}).values() for k, v in g.items()}
    lines = []
    immediate = result.get("immediate") or []
    if immediate:
        shown = "、".join(f"{esc(LABELS.get(k, k))} = {esc(cfg_flat.get(k))}" for k in immediate)
        lines.append(f"✅ 已立即生效（下一次提问即按新值）：{shown}")
    if result.get("need_reload"):
        lines.append(f"🔄 已保存，需点击「重载引擎」才生效：{_labels(result['need_reload'])}")
    if result.get("need_rebuild"):
        lines.append(f"🧱 {_labels(result['need_rebuild'])}：新上传的文档立即按新参数切块；"
                     "已有文档需要到 知识库 点击「全量重建」")
    shown_msgs = {"以下参数需要点击", "切块参数对新上传的文档"}
    for w in result.get("warnings") or []:
        if not any(w.startswith(p) for p in shown_msgs):
            lines.append(f"⚠️ {esc(w)}")
    kind = "warn" if (result.get("need_reload") or result.get("need_rebuild") or result.get("warnings")) else "ok"
    return banner(kind, f"已保存 {len(changed)} 项参数", lines)


# ---------------------------------------------------------------------------------------------- the tab
def build_settings_tab(engine, policy: AccessPolicy | None = None) -> dict[str, Any]:
    policy = policy or AccessPolicy()
    comps: dict[str, gr.components.Component] = {}
    errs: dict[str, gr.Markdown] = {}
    restore_btns: dict[str, gr.Button] = {}
    # Built with the SRS defaults (the page config goes to every visitor); admins get the live values on load.
    current = Settings().model_dump()

    def make_field(name: str) -> None:
        kind = field_kind(name)
        label, info = LABELS.get(name, name), field_info(name)
        value = form_value(name, current.get(name))
        if kind is bool:
            c = gr.Checkbox(value=bool(value), label=label, info=info, elem_id=f"cfg-{name}")
        elif choices_of(name):
            c = gr.Dropdown(choices=choices_of(name), value=value, label=label, info=info, elem_id=f"cfg-{name}")
        elif kind in (int, float):
            c = gr.Number(value=value, label=label, info=info, elem_id=f"cfg-{name}",
                          step=1 if kind is int else 0.05)
        else:
            c = gr.Textbox(value=value, label=label, info=info, max_lines=1, elem_id=f"cfg-{name}",
                           placeholder="未设置" if name in SECRET_FIELDS else None)
        comps[name] = c
        errs[name] = gr.Markdown("", visible=False, elem_id=f"cfg-err-{name}", elem_classes=["kbs-err"])

    def card(key: str) -> None:
        with gr.Column(variant="panel", elem_id=f"cfg-card-{key}"):
            with gr.Row(equal_height=True):
                gr.Markdown(f"### {CARD_TITLES[key]}")
                restore_btns[key] = gr.Button("恢复默认", size="sm", scale=0, min_width=90,
                                              elem_id=f"cfg-restore-{key}")
            for group in dict(CARDS)[key]:
                if group == "ocr":
                    gr.Markdown("**OCR（扫描版 PDF）**")
                elif group == "api":
                    gr.Markdown("**开放接口（API Key 与 /v1）**")
                elif group == "parsing":
                    gr.Markdown("**解析资源上限（每个文档）**")
                for name in GROUPS[group]:
                    make_field(name)

    gr.Markdown("修改后点击「保存」：检索参数下一次提问即生效；LLM 和模型路径需「重载引擎」；"
                "切块参数对已有文档需「全量重建」。", elem_classes=["kbs-hint"])
    with gr.Row(equal_height=False):
        card("llm")
        card("retrieval")
    with gr.Row(equal_height=False):
        card("chunking")
        card("models")
    with gr.Row():
        save_btn = gr.Button("保存", variant="primary", elem_id="cfg-save")
        test_btn = gr.Button("测试 LLM 连通", elem_id="cfg-test-llm")
        reload_btn = gr.Button("重载引擎", variant="stop", elem_id="cfg-reload")
    check_msg = gr.HTML("", elem_id="cfg-check")
    status = gr.HTML("", elem_id="cfg-banner")
    build_api_keys_section(engine, policy)  # 开放接口: its own handlers, admins only

    field_list = [comps[n] for n in FIELDS]
    err_list = [errs[n] for n in FIELDS]

    def admin(request) -> bool:
        return policy.allows(request_user(request), Role.ADMIN)

    def require(request) -> None:
        guard.require(policy, request, Role.ADMIN)

    def no_errors() -> list:
        return [gr.update(value="", visible=False) for _ in FIELDS]

    def error_updates(errors: dict[str, str]) -> list:
        """One red line under each field the engine refused; hidden for the others."""
        return [gr.update(value=f'<span style="{ERROR_STYLE}">⚠️ {esc(errors[n])}</span>', visible=True)
                if n in errors else gr.update(value="", visible=False) for n in FIELDS]

    def values_of(s: Settings | dict) -> list:
        d = s.model_dump() if isinstance(s, Settings) else s
        return [form_value(n, d.get(n)) for n in FIELDS]

    # --- load ---------------------------------------------------------------------------------------------
    def settings_load(request: gr.Request):
        if not admin(request):  # silent on page load: the tab is hidden for them anyway
            return (*[gr.skip() for _ in FIELDS], *no_errors(), banner("err", DENIED))
        return (*values_of(engine.settings), *no_errors(), "")

    # --- save ---------------------------------------------------------------------------------------------
    def save_impl(values: dict, request):
        require(request)
        payload = payload_from_form(values)
        try:
            result = engine.update_settings(payload, actor=guard.page_actor(request))
        except SettingsError as exc:
            known = {k: v for k, v in exc.errors.items() if k in errs}
            other = [f"{esc(LABELS.get(k, k))}：{esc(v)}" for k, v in exc.errors.items() if k not in errs]
            err_updates = error_updates(known)
            lines = [f"{esc(LABELS.get(k, k))}：{esc(v)}" for k, v in known.items()] + other
            log.info("settings not saved: %d invalid field(s): %s", len(exc.errors), ", ".join(exc.errors))
            return (*[gr.skip() for _ in FIELDS], *err_updates,
                    banner("err", f"未保存：{len(exc.errors)} 项参数有误，请按提示修改（所有参数均未改变）", lines))
        log.info("settings saved by %r: %s", request_user(request), ", ".join(result.get("changed") or []) or "no change")
        cfg_flat = {k: v for g in (result.get("config") or {}).values() for k, v in g.items()}
        return (*values_of(cfg_flat), *no_errors(), save_banner(result))

    settings_save = _named(FIELDS, save_impl, "settings_save")

    # --- live validation: red message under the field, 保存 disabled while any field is refused -------------
    def check_impl(values: dict, request):
        if not admin(request):
            return (*[gr.skip() for _ in FIELDS], gr.skip(), gr.skip())
        errors = engine.check_settings(payload_from_form(values))
        note = (f'<span style="{ERROR_STYLE}" data-invalid="{len(errors)}">⚠️ {len(errors)} 项参数有误：'
                f'{_labels(list(errors))}，修正后才能保存</span>' if errors else "")
        return (*error_updates(errors), gr.update(interactive=not errors), note)

    settings_check = _named(FIELDS, check_impl, "settings_check")

    # --- LLM test (unsaved form values) -----------------------------------------------------------------------
    llm_fields = GROUPS["llm"]

    def test_impl(values: dict, request):
        require(request)
        payload = payload_from_form(values)
        try:
            res = engine.test_llm(payload)
        except SettingsError as exc:
            res = {"ok": False, "msg": "；".join(exc.errors.values())}
        except Exception as exc:  # never let a connectivity test crash the tab
            res = {"ok": False, "msg": f"{type(exc).__name__}: {exc}"}
        msg = scrub(str(res.get("msg") or ""), [payload.get("llm_api_key") or "", engine.settings.llm_api_key])
        if res.get("ok"):
            return banner("ok", "✅ LLM 连通测试成功", [esc(msg)] if msg else None)
        return banner("err", "❌ LLM 连通测试失败", [esc(msg)])

    settings_test_llm = _named(llm_fields, test_impl, "settings_test_llm")

    # --- reload ---------------------------------------------------------------------------------------------
    def settings_reload(request: gr.Request):
        require(request)
        yield banner("info", "⏳ 正在重载引擎…", ["期间提问会收到 2002「引擎重载中，请稍后」"])
        try:
            ms = engine.reload(actor=guard.page_actor(request))
        except Exception as exc:
            if not getattr(exc, "code", None):
                log.exception("engine reload failed")
            yield banner("err", "❌ 重载引擎失败", [esc(getattr(exc, "msg", None) or f"{type(exc).__name__}: {exc}")])
            return
        log.info("engine reloaded by %r in %.0f ms", request_user(request), ms)
        took = f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} 秒"
        yield banner("ok", f"✅ 引擎已重载，用时 {took}")

    # --- restore defaults (per card; fills the form only) -----------------------------------------------------
    def defaults_for(key: str) -> Callable:
        names = [n for g in dict(CARDS)[key] for n in GROUPS[g] if n not in SECRET_FIELDS]

        def restore(emb_path, request: gr.Request):
            require(request)
            probe = engine.settings
            if isinstance(emb_path, str):
                probe = probe.model_copy(update={"embedding_model_path": emb_path.strip()})
            d = engine.default_settings(probe).model_dump()
            field_updates = [form_value(n, d[n]) if n in names else gr.skip() for n in FIELDS]
            err_updates = [gr.update(value="", visible=False) if n in names else gr.skip() for n in FIELDS]
            return (*field_updates, *err_updates,
                    banner("info", f"已填入「{CARD_TITLES[key]}」的默认值，点击「保存」后生效"))

        restore.__name__ = f"settings_defaults_{key}"
        return restore

    # --- wiring -------------------------------------------------------------------------------------------
    outputs = [*field_list, *err_list, status]
    check_outputs = [*err_list, save_btn, check_msg]
    check = {"fn": settings_check, "inputs": field_list, "outputs": check_outputs, "api_name": False,
             "show_progress": "hidden"}
    gr.on(None, settings_load, None, outputs, api_name=False, show_progress="hidden").then(**check)  # page load
    # (a visible-free twin of the load event, callable through the API)
    load_btn = gr.Button("重新读取", visible=False)
    load_btn.click(settings_load, None, outputs, api_name="settings_load").then(**check)
    check_btn = gr.Button("检查", visible=False)  # the API route of the live validation
    check_btn.click(settings_check, field_list, check_outputs, api_name="settings_check", show_progress="hidden")
    for c in field_list:  # every edit re-checks the whole form (cross-field rules: overlap < size)
        c.input(**check, trigger_mode="always_last")
    save_btn.click(settings_save, field_list, outputs, api_name="settings_save", concurrency_limit=1).then(**check)
    test_btn.click(settings_test_llm, [comps[n] for n in llm_fields], status, api_name="settings_test_llm")
    reload_btn.click(settings_reload, None, status, api_name="settings_reload", concurrency_limit=1)
    for key, btn in restore_btns.items():
        btn.click(defaults_for(key), [comps["embedding_model_path"]], outputs,
                  api_name=f"settings_defaults_{key}").then(**check)

    return {"fields": comps, "errors": errs, "status": status,
            "handlers": {"settings_load": settings_load, "settings_save": settings_save, "settings_check": settings_check,
                         "settings_test_llm": settings_test_llm, "settings_reload": settings_reload}}
