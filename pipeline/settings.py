"""Typed application settings (SRS F1.1) — the contract for field names, defaults and ranges.

The settings object is plain pydantic; persistence lives in store.config_store (key/value rows in
`sys_config`). Groups mirror the REST API's grouped shape (`llm`, `retrieval`, `chunking`, `models`, `ocr`).
"""
from __future__ import annotations

import unicodedata
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# Which group each field belongs to. Order is the display order of the settings tab.
GROUPS: dict[str, list[str]] = {
    "llm": ["llm_model", "llm_api_url", "llm_api_key", "llm_temperature", "llm_timeout"],
    "retrieval": [
        "recall_size", "final_top_k", "rrf_k", "bm25_weight", "vector_weight", "bm25_adaptive",
        "bm25_k1", "bm25_b", "min_similarity", "rerank_candidates",
    ],
    "chunking": ["chunk_size", "chunk_overlap"],
    "models": ["embedding_model_path", "reranker_model_path"],
    "ocr": ["ocr_enabled", "ocr_max_pages"],
}
SECRET_FIELDS = {"llm_api_key"}

# Fields whose change takes effect on the next question; the rest need 重载引擎 (or a rebuild).
IMMEDIATE_FIELDS = {
    "recall_size", "final_top_k", "rrf_k", "bm25_weight", "vector_weight", "bm25_adaptive", "bm25_k1", "bm25_b",
    "min_similarity", "rerank_candidates", "llm_temperature", "ocr_enabled", "ocr_max_pages",
}
RELOAD_FIELDS = {"llm_model", "llm_api_url", "llm_api_key", "llm_timeout",
                 "embedding_model_path", "reranker_model_path"}
REBUILD_FIELDS = {"chunk_size", "chunk_overlap"}  # new uploads at once; existing docs need 全量重建

DEFAULT_EMBEDDING_PATH = "models/bge-small-zh-v1.5"
DEFAULT_RERANKER_PATH = "models/bge-reranker-base"

# Human labels used in error messages and the settings tab.
LABELS: dict[str, str] = {
    "llm_model": "模型名称", "llm_api_url": "API 地址", "llm_api_key": "API Key",
    "llm_temperature": "温度", "llm_timeout": "超时(秒)",
    "recall_size": "每路召回数", "final_top_k": "最终 Top-K", "rrf_k": "RRF K",
    "bm25_weight": "BM25 权重", "vector_weight": "向量权重", "bm25_adaptive": "BM25 自适应权重",
    "bm25_k1": "BM25 k1", "bm25_b": "BM25 b", "min_similarity": "最低相似度",
    "rerank_candidates": "精排候选数", "chunk_size": "块大小(字符)", "chunk_overlap": "块重叠(字符)",
    "embedding_model_path": "Embedding 模型路径", "reranker_model_path": "Reranker 模型路径",
    "ocr_enabled": "启用 OCR", "ocr_max_pages": "OCR 页数上限",
}


class Settings(BaseModel):
    """All tunables. Ranges are enforced by pydantic; cross-field rules by the validator below."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # llm
    llm_model: str = ""
    llm_api_url: str = ""
    llm_api_key: str = ""
    llm_temperature: float = Field(0.3, ge=0, le=1)
    llm_timeout: float = Field(60.0, ge=1, le=600)
    # retrieval
    recall_size: int = Field(50, ge=1, le=200)
    final_top_k: int = Field(6, ge=1, le=20)
    rrf_k: int = Field(60, ge=1)
    # Weighted RRF; with bm25_adaptive the BM25 weight per query is scaled down when BM25's ranking is not
    # decisive (pipeline.retrieval.fusion). Defaults chosen by measurement (docs/retrieval-eval.md).
    bm25_weight: float = Field(1.0, ge=0, le=5)
    vector_weight: float = Field(1.0, ge=0, le=5)
    bm25_adaptive: bool = True
    bm25_k1: float = Field(1.5, ge=0, le=3)
    bm25_b: float = Field(0.75, ge=0, le=1)
    # SRS says 0.3; calibrated per embedding model (see pipeline.models.calibrated_min_similarity).
    min_similarity: float = Field(0.3, ge=0, le=1)
    rerank_candidates: int = Field(20, ge=1, le=200)
    # chunking
    chunk_size: int = Field(300, ge=50, le=2000)
    chunk_overlap: int = Field(50, ge=0)
    # models
    embedding_model_path: str = DEFAULT_EMBEDDING_PATH
    reranker_model_path: str = DEFAULT_RERANKER_PATH
    # ocr
    ocr_enabled: bool = True
    ocr_max_pages: int = Field(50, ge=1, le=2000)

    # --- meaning, not only type (issue 18): a bad value is refused on save, naming the field ---------------
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

    def masked_dict(self) -> dict[str, Any]:
        d = self.model_dump()
        for f in SECRET_FIELDS:
            d[f] = mask_secret(d[f])
        return d


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


def _range_text(name: str) -> str:
    info = Settings.model_fields[name]
    lo = hi = None
    for m in info.metadata:
        lo = getattr(m, "ge", lo) if getattr(m, "ge", None) is not None else lo
        hi = getattr(m, "le", hi) if getattr(m, "le", None) is not None else hi
    if lo is not None and hi is not None:
        return f"取值范围 {lo}–{hi}"
    if lo is not None:
        return f"必须 ≥ {lo}"
    return ""


def _friendly(err: dict) -> tuple[str, str]:
    loc = err.get("loc") or ()
    field = str(loc[0]) if loc else "chunk_overlap"
    etype = err.get("type", "")
    label = LABELS.get(field, field)
    if etype == "extra_forbidden":
        return field, f"未知配置项 {field}"
    if etype in {"int_parsing", "int_type", "int_from_float"}:
        return field, f"{label} 必须是整数，{_range_text(field)}".rstrip("，")
    if etype in {"float_parsing", "float_type"}:
        return field, f"{label} 必须是数字，{_range_text(field)}".rstrip("，")
    if etype in {"bool_parsing", "bool_type"}:
        return field, f"{label} 必须是 true/false"
    if etype in {"string_type"}:
        return field, f"{label} 必须是字符串"
    if etype.startswith(("greater", "less")):
        return field, f"{label} 超出范围，{_range_text(field)}"
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
