"""Typed application settings (SRS F1.1) — the contract for field names, defaults and ranges.

One source per rule: every field declares, on its pydantic `Field`, its range (ge/le), a description, and in
`json_schema_extra` its group (the REST API's grouped shape and the settings tab's cards), its effect
(`immediate` = next question, `reload` = needs 重载引擎, `rebuild` = new uploads at once, existing documents need
全量重建) and its Chinese label. GROUPS, LABELS, the effect sets, range texts, the settings tab and the README
table (`python -m tools.docs.settings_table`) are all derived from these declarations.
Persistence lives in store.config_store (key/value rows in `sys_config`).
"""
from __future__ import annotations

import unicodedata
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Effect = Literal["immediate", "reload", "rebuild"]
GROUP_ORDER = ("llm", "retrieval", "chunking", "models", "ocr", "parsing", "api")
SRS_BGE_EMBEDDING_DIR = "models/bge-small-zh-v1.5"
SRS_BGE_RERANKER_DIR = "models/bge-reranker-base"


def setting(default: Any, *, group: str, effect: Effect, label: str, description: str, secret: bool = False,
            **constraints: Any) -> Any:
    """A settings Field with its metadata (group, effect, label) next to its range."""
    extra = {"group": group, "effect": effect, "label": label}
    if secret:
        extra["secret"] = True
    return Field(default, description=description, json_schema_extra=extra, **constraints)


class Settings(BaseModel):
    """All tunables. Ranges are enforced by pydantic; cross-field rules by the validator below."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # llm
    llm_model: str = setting("", group="llm", effect="reload", label="模型名称",
                             description="OpenAI 兼容服务的模型名；留空 = 原文摘录模式")
    llm_api_url: str = setting("", group="llm", effect="reload", label="API 地址",
                               description="OpenAI 兼容的 base URL，例如 https://api.deepseek.com/v1")
    llm_api_key: str = setting("", group="llm", effect="reload", label="API Key", secret=True,
                               description="只显示掩码 ****abcd")
    llm_temperature: float = setting(0.3, group="llm", effect="immediate", label="温度",
                                     description="生成温度", ge=0, le=1)
    llm_timeout: float = setting(60.0, group="llm", effect="reload", label="超时(秒)",
                                 description="单次大模型请求超时", ge=1, le=600)
    # One LLM call per question the no-answer gate lets through, then a second retrieval with its phrasings
    # (pipeline/conversation/multi_query.py; a refused question reaches no LLM); its own short timeout, after which
    # the first retrieval's result stands (the offline path).
    llm_multi_query: bool = setting(True, group="llm", effect="immediate", label="多查询改写",
                                    description="配置了大模型时，无答案判定放行的问题（拒答的问题不发给大模型）"
                                                "再改写成 2–3 个正式用语的检索问题和关键词，与原问题一起重新检索并融合；"
                                                "这类问题多一次大模型调用")
    llm_multi_query_timeout: float = setting(5.0, group="llm", effect="immediate", label="多查询改写超时(秒)",
                                             description="多查询改写的大模型调用超过它即放弃，沿用原问题的检索结果",
                                             ge=0.5, le=60)
    # retrieval
    recall_size: int = setting(50, group="retrieval", effect="immediate", label="每路召回数",
                               description="BM25 与向量各召回的块数", ge=1, le=200)
    final_top_k: int = setting(6, group="retrieval", effect="immediate", label="最终 Top-K",
                               description="送入生成的资料数", ge=1, le=20)
    # A follow-up (the rewrite found it leans on the last turn) that the gate refuses or finds weak over the whole
    # scope is searched again within the documents the last answer cited; a question naming no subject of its own,
    # only when refused (docs/conversations.md).
    follow_up_in_cited_docs: bool = setting(
        True, group="retrieval", effect="immediate", label="追问查上一轮文档",
        description="追问（依赖上一轮的问题）在全部资料中被拒答或证据弱时（未说明主语的问题：仅在被拒答时），"
                    "再到上一轮回答引用的文档内检索；那里证据充分才采用")
    # Fusion of the two routes (pipeline.retrieval.fusion); chosen leave-one-set-out, docs/retrieval-eval.md.
    fusion_mode: Literal["convex", "rrf"] = setting(
        "convex", group="retrieval", effect="immediate", label="融合方式",
        description="convex：每个候选两路分数都算，各自归一化后按 BM25 占比加权求和；rrf：SRS 的倒数名次融合")
    convex_auto_weight: bool = setting(
        True, group="retrieval", effect="immediate", label="按问题自动定权",
        description="convex 模式下按问题特征（两路一致度、最高相似度、问题长度等）自动决定 BM25 占比，"
                    "再乘以问题用词在本知识库中出现的比例（知识库里没有的词关键词检索看不到）")
    convex_norm: Literal["minmax", "zscore"] = setting(
        "minmax", group="retrieval", effect="immediate", label="分数归一化",
        description="convex 模式下每路分数在本次候选内的归一化方式：minmax（0–1）或 zscore（标准分）")
    convex_length_prior: bool = setting(
        True, group="retrieval", effect="immediate", label="短片段降权",
        description="convex 模式下给过短的块（标题、导航行等只复述问题的片段）降权；强度在开发集上留一法选定，不影响无答案判定")
    convex_bm25_weight: float = setting(
        0.25, group="retrieval", effect="immediate", label="BM25 占比（固定）",
        description="convex 模式、关闭自动定权时 BM25 的固定占比（向量占 1 − 该值）", ge=0, le=1)
    rrf_k: int = setting(60, group="retrieval", effect="immediate", label="RRF K",
                         description="RRF 常数（SRS 取 60）", ge=1)
    # Weighted RRF; with bm25_adaptive the BM25 weight per query is scaled down when BM25's ranking is not
    # decisive (pipeline.retrieval.fusion). Defaults chosen by measurement (docs/retrieval-eval.md).
    bm25_weight: float = setting(1.0, group="retrieval", effect="immediate", label="BM25 权重",
                                 description="RRF 中 BM25 路的权重（自适应时为上限）", ge=0, le=5)
    vector_weight: float = setting(1.0, group="retrieval", effect="immediate", label="向量权重",
                                   description="RRF 中向量路的权重", ge=0, le=5)
    bm25_adaptive: bool = setting(True, group="retrieval", effect="immediate", label="BM25 自适应权重",
                                  description="按 BM25 前两名得分比逐问调整 BM25 权重")
    bm25_k1: float = setting(1.5, group="retrieval", effect="immediate", label="BM25 k1",
                             description="BM25 词频饱和参数", ge=0, le=3)
    bm25_b: float = setting(0.75, group="retrieval", effect="immediate", label="BM25 b",
                            description="BM25 长度归一参数", ge=0, le=1)
    # SRS says 0.3; the default is the embedding model's calibrated floor (pipeline/calibration, Engine.default_settings).
    min_similarity: float = setting(0.3, group="retrieval", effect="immediate", label="最低相似度",
                                    description="无答案硬门槛：最高余弦相似度低于它一定拒答", ge=0, le=1)
    # The adaptive gate (pipeline/retrieval/gate.py) decides above that floor; off = the floor alone decides.
    adaptive_gate: bool = setting(True, group="retrieval", effect="immediate", label="自适应无答案判定",
                                  description="对照本知识库的背景分布与关键词覆盖：回答 / 资料相关度较低 / 拒答")
    rerank_candidates: int = setting(20, group="retrieval", effect="immediate", label="精排候选数",
                                     description="送入精排模型的融合候选数", ge=1, le=200)
    # chunking
    chunk_size: int = setting(300, group="chunking", effect="rebuild", label="块大小(字符)",
                              description="切块目标长度（字符）", ge=50, le=2000)
    chunk_overlap: int = setting(50, group="chunking", effect="rebuild", label="块重叠(字符)",
                                 description="相邻块重叠字符数，须小于块大小", ge=0)
    # pipeline/ingestion/structured_chunking.py: off = every page cut by sentences alone (headings and tables
    # read as prose); each knowledge base may override all three (pipeline/ingestion/kb_chunking.py).
    chunk_structure: bool = setting(True, group="chunking", effect="rebuild", label="按结构切块",
                                    description="按标题分节（块带标题路径）、表格按整行成块并重复表头、条文（「第…条」）按整条成块；"
                                                "关闭 = 每页只按句子切分")
    # models
    embedding_model_path: str = setting(SRS_BGE_EMBEDDING_DIR, group="models", effect="reload",
                                        label="Embedding 模型路径",
                                        description="含 config.json 的本地目录；不存在时用内置 multilingual-e5-small")
    reranker_model_path: str = setting(SRS_BGE_RERANKER_DIR, group="models", effect="reload",
                                       label="Reranker 模型路径",
                                       description="交叉编码器目录；不存在时跳过精排")
    # ocr
    ocr_enabled: bool = setting(True, group="ocr", effect="immediate", label="启用 OCR",
                                description="扫描页/乱码页走离线 OCR")
    ocr_max_pages: int = setting(50, group="ocr", effect="immediate", label="OCR 页数上限",
                                 description="每个文档最多 OCR 的页数", ge=1, le=2000)
    # parsing budget (pipeline/ingestion/parse_worker.py): each document parses in a child process that is
    # killed past these; the documents queued behind it go on.
    parse_timeout_s: float = setting(120.0, group="parsing", effect="immediate", label="单文档解析时限(秒)",
                                     description="单个文档解析（含 OCR）的最长时间，超时判为失败「解析超时」",
                                     ge=1, le=3600)
    parse_memory_mb: int = setting(1536, group="parsing", effect="immediate", label="单文档解析内存上限(MB)",
                                   description="解析进程的常驻内存上限，超过判为失败「超出资源限制」",
                                   ge=256, le=16384)
    # web pages and folders a knowledge base follows (pipeline/ingestion/web_fetch.py, pipeline/services/
    # web_sources.py, folder_sync.py)
    web_fetch_timeout_s: float = setting(15.0, group="parsing", effect="immediate", label="网页抓取超时(秒)",
                                         description="抓取网页时连接与每次读取的最长等待；整次抓取（含重定向）另有总时限",
                                         ge=1, le=120)
    web_max_page_bytes: int = setting(5_000_000, group="parsing", effect="immediate", label="网页大小上限(字节)",
                                      description="网页超过此大小即判为失败，不再继续下载", ge=10_000, le=100_000_000)
    web_max_redirects: int = setting(5, group="parsing", effect="immediate", label="最多重定向次数",
                                     description="抓取网页时最多跟随的重定向次数（每一跳的地址都重新检查）", ge=0, le=20)
    web_allow_private: bool = setting(False, group="parsing", effect="immediate", label="允许抓取内网地址",
                                      description="允许抓取内网、本机（127.x、10.x、192.168.x 等）地址；"
                                                  "链路本地与云主机元数据地址始终拒绝")
    folder_sync_delete_mode: Literal["delete", "flag"] = setting(
        "delete", group="parsing", effect="immediate", label="文件夹同步：文件删除时",
        description="delete：同步时删除文件夹中已不存在的文件对应的文档；flag：只在同步报告中标记，文档保留")
    # api (the OpenAI-compatible endpoint and the REST API: pipeline/access/callers.py)
    api_rate_limit_per_min: int = setting(
        60, group="api", effect="immediate", label="Key 每分钟请求上限",
        description="每个 API Key 每分钟最多请求 /api 与 /v1 的次数（创建 Key 时可单独设置）；0 = 不限",
        ge=0, le=100000)
    login_rate_limit_per_min: int = setting(
        0, group="api", effect="immediate", label="登录用户每分钟请求上限",
        description="每个登录用户（HTTP Basic）每分钟最多请求 /api 与 /v1 的次数；0 = 不限（页面本身不计）",
        ge=0, le=100000)
    # the audit log (pipeline/services/audit_log.py)
    audit_retention_days: int = setting(
        180, group="api", effect="immediate", label="审计日志保留(天)",
        description="审计日志（提问与管理操作）保留的天数，过期记录由应用自动删除；0 = 永久保留", ge=0, le=36500)

    # --- meaning, not only type: a bad value is refused on save, naming the field ---------------
    @field_validator("llm_api_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        """Empty (no LLM: extractive answers) or an http(s) URL with a host, e.g. https://api.deepseek.com/v1."""
        v = v.strip()
        if not v:
            return v
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 — raises ValueError on a port out of range or not a number
        except ValueError:
            parts = None
        if (parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname
                or any(ch.isspace() for ch in v)):
            raise ValueError(f"{LABELS['llm_api_url']} 无效：需要 http:// 或 https:// 开头且带主机名的地址，"
                             f"例如 https://api.deepseek.com/v1（当前 {v[:80]!r}）")
        return v

    @field_validator("llm_model", "llm_api_key", "embedding_model_path", "reranker_model_path")
    @classmethod
    def _printable(cls, v: str, info) -> str:
        """No control characters (a pasted newline breaks HTTP headers and paths) and a sane length. Whether a
        model path holds a model is checked on save by the engine (it needs the project root)."""
        v = v.strip()
        label = LABELS.get(info.field_name, info.field_name)
        if len(v) > 500:
            raise ValueError(f"{label} 过长（最多 500 个字符）")
        if any(unicodedata.category(ch) == "Cc" for ch in v):
            raise ValueError(f"{label} 不能包含换行、制表符等控制字符")
        return v

    @model_validator(mode="after")
    def _overlap_below_size(self) -> "Settings":
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(f"chunk_overlap 必须小于 chunk_size（当前 {self.chunk_overlap} ≥ {self.chunk_size}）")
        return self

    # --- views -------------------------------------------------------------------------------
    def grouped(self, mask: bool = True) -> dict[str, dict[str, Any]]:
        data = self.model_dump()
        out: dict[str, dict[str, Any]] = {}
        for group, fields in GROUPS.items():
            out[group] = {f: (mask_secret(data[f]) if mask and f in SECRET_FIELDS else data[f]) for f in fields}
        return out


# --- metadata derived from the Field declarations ------------------------------------------------
def field_meta(name: str) -> dict[str, Any]:
    """{group, effect, label[, secret]} of one field."""
    return dict(Settings.model_fields[name].json_schema_extra or {})


def _fields_where(pred) -> list[str]:
    return [n for n in Settings.model_fields if pred(field_meta(n))]


GROUPS: dict[str, list[str]] = {g: _fields_where(lambda m, g=g: m["group"] == g) for g in GROUP_ORDER}
LABELS: dict[str, str] = {n: field_meta(n)["label"] for n in Settings.model_fields}
SECRET_FIELDS = set(_fields_where(lambda m: m.get("secret", False)))
IMMEDIATE_FIELDS = set(_fields_where(lambda m: m["effect"] == "immediate"))
RELOAD_FIELDS = set(_fields_where(lambda m: m["effect"] == "reload"))
REBUILD_FIELDS = set(_fields_where(lambda m: m["effect"] == "rebuild"))


def bounds(name: str) -> tuple[Any, Any]:
    """(ge, le) of a numeric field; None where unbounded."""
    lo = hi = None
    for m in Settings.model_fields[name].metadata:
        if getattr(m, "ge", None) is not None:
            lo = m.ge
        if getattr(m, "le", None) is not None:
            hi = m.le
    return lo, hi


def range_text(name: str) -> str:
    """`0–1`, `≥ 1` or "" — the one wording used by error messages, the settings tab and the README."""
    lo, hi = bounds(name)
    if lo is not None and hi is not None:
        return f"{lo}–{hi}"
    if lo is not None:
        return f"≥ {lo}"
    return ""


class SettingsError(ValueError):
    """Invalid settings: `errors` maps field name → Chinese message naming the allowed range."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("；".join(f"{k}: {v}" for k, v in errors.items()))


def mask_secret(value: str) -> str:
    """`****abcd` (last 4) — never the full key. Empty stays empty so the UI can say 未设置."""
    if not value:
        return ""
    return "****" + value[-4:]


def is_masked(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("****")


def _range_phrase(name: str) -> str:
    r = range_text(name)
    if not r:
        return ""
    return f"取值范围 {r}" if "–" in r else f"必须 {r}"


def _friendly(err: dict) -> tuple[str, str]:
    loc = err.get("loc") or ()
    field = str(loc[0]) if loc else "chunk_overlap"
    etype = err.get("type", "")
    label = LABELS.get(field, field)
    if etype == "extra_forbidden":
        return field, f"未知配置项 {field}"
    if etype in {"int_parsing", "int_type", "int_from_float"}:
        return field, f"{label} 必须是整数，{_range_phrase(field)}".rstrip("，")
    if etype in {"float_parsing", "float_type"}:
        return field, f"{label} 必须是数字，{_range_phrase(field)}".rstrip("，")
    if etype in {"bool_parsing", "bool_type"}:
        return field, f"{label} 必须是 true/false"
    if etype == "literal_error":
        allowed = " / ".join(str(a) for a in getattr(Settings.model_fields[field].annotation, "__args__", ()))
        return field, f"{label} 必须是 {allowed} 之一"
    if etype in {"string_type"}:
        return field, f"{label} 必须是字符串"
    if etype.startswith(("greater", "less")):
        return field, f"{label} 超出范围，{_range_phrase(field)}"
    msg = err.get("msg", "")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return field, msg


def validate_settings(values: dict[str, Any]) -> Settings:
    """Build a Settings from a flat dict, raising SettingsError with per-field Chinese messages."""
    try:
        return Settings(**values)
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for e in exc.errors():
            f, m = _friendly(e)
            errors.setdefault(f, m)
        raise SettingsError(errors) from None


def merge_update(current: Settings, changes: dict[str, Any]) -> tuple[Settings, list[str]]:
    """Apply a partial, flat change set. Masked secrets (``****abcd``) keep the stored value.

    Returns the new settings and the list of keys whose value really changed.
    """
    unknown = [k for k in changes if k not in Settings.model_fields]
    if unknown:
        raise SettingsError({k: (f"未知分组 {k}（可用分组：{'、'.join(GROUPS)}）" if isinstance(changes[k], dict)
                                 else f"未知配置项 {k}") for k in unknown})
    data = current.model_dump()
    for key, value in changes.items():
        if key in SECRET_FIELDS and (value is None or is_masked(value)):
            continue  # the browser only ever sees the mask; saving it back must not wipe the key
        data[key] = value
    new = validate_settings(data)
    old_d, new_d = current.model_dump(), new.model_dump()
    changed = [k for k in new_d if new_d[k] != old_d[k]]
    return new, changed


def flatten_grouped(payload: dict[str, Any]) -> dict[str, Any]:
    """Accept the grouped API shape ({"llm": {...}, ...}) or a flat dict; return a flat dict."""
    flat: dict[str, Any] = {}
    errors: dict[str, str] = {}  # every unknown group / misplaced field at once, each named
    for key, value in payload.items():
        if key in GROUPS and isinstance(value, dict):
            for f, v in value.items():
                if f not in GROUPS[key]:
                    home = next((g for g, fs in GROUPS.items() if f in fs), None)
                    errors[f] = (f"配置项 {f} 不属于分组 {key}（应在 {home}）" if home
                                 else f"未知配置项 {f}（分组 {key} 中没有这一项）")
                flat[f] = v
        elif key in GROUPS:
            errors[key] = f"分组 {key} 必须是对象"
        else:
            flat[key] = value
    if errors:
        raise SettingsError(errors)
    return flat


def settings_from_stored(stored: dict[str, Any]) -> tuple[Settings, dict[str, str]]:
    """Settings from the stored rows, dropping (to their defaults) only the values that no longer validate —
    e.g. an LLM URL saved before URLs were checked — instead of discarding every setting. Returns the
    settings and the dropped fields with the reason."""
    values = {k: v for k, v in stored.items() if k in Settings.model_fields}
    dropped: dict[str, str] = {}
    for _ in range(len(values) + 1):
        try:
            return validate_settings(values), dropped
        except SettingsError as exc:
            bad = [f for f in exc.errors if f in values] or list(values)
            for f in bad:
                dropped[f] = exc.errors.get(f, "")
                values.pop(f)
    return Settings(), dropped


def effect_of(changed: list[str]) -> dict[str, list[str]]:
    """Which changed keys took effect now, which need 重载引擎, which need 全量重建 for old docs."""
    return {
        "immediate": [k for k in changed if k in IMMEDIATE_FIELDS],
        "need_reload": [k for k in changed if k in RELOAD_FIELDS],
        "need_rebuild": [k for k in changed if k in REBUILD_FIELDS],
    }
