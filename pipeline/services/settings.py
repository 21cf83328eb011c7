"""The current settings of this process: loaded from the database, validated, saved, kept in step with other
processes (they re-read when the config counter moves)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.calibration import profile_for
from pipeline.generation.llm_target import refused_target
from pipeline.models.paths import embedding_model_id, resolve_model_dir
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.settings import (
    LABELS,
    SECRET_FIELDS,
    SRS_BGE_EMBEDDING_DIR,
    SRS_BGE_RERANKER_DIR,
    Settings,
    SettingsError,
    effect_of,
    flatten_grouped,
    is_masked,
    merge_update,
    settings_from_stored,
    validate_settings,
)
from store.config_store import ConfigStore
from store.shared_state import CONFIG_VERSION

log = logging.getLogger(__name__)


class SettingsService:
    """`current` is what every other service reads (no database round trip); `update` validates, saves and
    applies a change. `on_bm25_params` runs when k1/b changed (every knowledge base's BM25 takes them)."""

    def __init__(self, config: ConfigStore, project_root: Path, calibration_dir: Path | None, *,
                 bump: Callable[[str], int],
                 on_bm25_params: Callable[[Settings], None], catch_up: Callable[[], None], audit: AuditLog):
        self.config = config
        self.audit = audit
        self.project_root = project_root
        self.calibration_dir = calibration_dir  # where the profiles live (None: the packaged ones)
        self._bump = bump
        self._catch_up = catch_up  # SharedSync.catch_up: merge a change onto the newest settings
        self._on_bm25_params = on_bm25_params
        self.current = self.load()

    def expected_model_id(self, s: Settings | None = None) -> str:
        s = s or self.current
        return embedding_model_id(s.embedding_model_path, self.project_root)

    def default_settings(self, s: Settings | None = None) -> Settings:
        """SRS defaults, with min_similarity from the calibration profile of the embedding model the settings
        select (the generic profile's when that model has none)."""
        base = Settings()
        probe = s or base
        floor = profile_for(self.expected_model_id(probe), None, self.calibration_dir).profile.floor
        return base.model_copy(update={"min_similarity": floor.min_similarity})

    def load(self) -> Settings:
        stored = self.config.load()
        if not stored:
            defaults = self.default_settings().model_dump()
            self.config.write_defaults(defaults)
            stored = defaults
        else:
            self.config.write_defaults({k: v for k, v in Settings().model_dump().items() if k not in stored})
        settings, dropped = settings_from_stored(stored)  # a hand-edited database must not stop the app
        for key, why in dropped.items():
            log.error("stored setting %s invalid (%s); using its default", key, why)
        return settings

    def reread(self) -> None:
        """Another process saved settings."""
        old, self.current = self.current, self.load()
        if (old.bm25_k1, old.bm25_b) != (self.current.bm25_k1, self.current.bm25_b):
            self._on_bm25_params(self.current)

    def update(self, payload: dict[str, Any], actor: Actor | None = None) -> dict:
        """Validate, persist and apply a partial settings change (grouped or flat); the names changed (never
        their values: a key may be among them) go to the audit log."""
        flat = flatten_grouped(payload)
        self._catch_up()  # merge onto the newest settings, whichever process saved them
        new, changed = merge_update(self.current, flat)
        self._check_model_paths(new, changed)
        self.config.save({k: new.model_dump()[k] for k in changed})
        if changed:
            self._bump(CONFIG_VERSION)
            self.audit.admin(actor, "settings.update", {"changed": sorted(changed)})
        old = self.current
        self.current = new
        if {"bm25_k1", "bm25_b"} & set(changed):
            self._on_bm25_params(new)
        effect = effect_of(changed)
        warnings = []
        if "embedding_model_path" in changed and self.expected_model_id(new) != self.expected_model_id(old):
            warnings.append("更换 Embedding 模型后需要 重载引擎 并 全量重建 知识库")
        if effect["need_rebuild"]:
            warnings.append("切块参数对新上传的文档立即生效；已有文档需要 全量重建 才会按新参数切块")
        if effect["need_reload"]:
            warnings.append("以下参数需要点击 重载引擎 才生效：" + "、".join(LABELS.get(k, k) for k in effect["need_reload"]))
        return {"changed": changed, **effect, "warnings": warnings, "config": new.grouped(mask=True)}

    def _check_model_paths(self, new: Settings, changed: list[str]) -> None:
        errors = {}
        for key, default in (("embedding_model_path", SRS_BGE_EMBEDDING_DIR),
                             ("reranker_model_path", SRS_BGE_RERANKER_DIR)):
            if key not in changed:
                continue
            value = getattr(new, key).strip()
            if not value or value == default:
                continue  # empty → packaged default / skipped; the untouched SRS default may be absent
            if resolve_model_dir(value, self.project_root) is None:
                errors[key] = f"{LABELS[key]} 无效：目录 {value} 不存在或不含 config.json"
        # the answers' LLM may not be a link-local or cloud-metadata address (test-llm refuses them too)
        refused = refused_target(new.llm_api_url) if "llm_api_url" in changed and new.llm_api_url else None
        if refused:
            errors["llm_api_url"] = refused
        if errors:
            raise SettingsError(errors)

    def check(self, payload: dict[str, Any]) -> dict[str, str]:
        """What saving this change would refuse (field → message); {} when it would be accepted. Saves nothing
        (the settings tab asks while the user types, to mark fields red and disable 保存)."""
        try:
            new, changed = merge_update(self.current, flatten_grouped(payload))
            self._check_model_paths(new, changed)
        except SettingsError as exc:
            return dict(exc.errors)
        return {}

    def test_llm(self, payload: dict[str, Any] | None = None) -> dict:
        """Connectivity test with the given (possibly unsaved) LLM values; masked key → the stored key."""
        from pipeline.generation.llm_client import test_llm_connection

        vals = self.current.model_dump()
        flat = flatten_grouped(payload or {})
        for k in ("llm_api_url", "llm_model", "llm_api_key", "llm_timeout"):
            v = flat.get(k)
            if v is None or (k in SECRET_FIELDS and is_masked(v)):
                continue
            vals[k] = v
        try:  # the same rules as saving: a bad URL is named before any connection is tried
            vals = validate_settings(vals).model_dump()
        except SettingsError as exc:
            return {"ok": False, "msg": str(exc)}
        if not vals["llm_api_url"] or not vals["llm_model"]:
            return {"ok": False, "msg": "请先填写 API 地址和模型名称"}
        t = min(float(vals.get("llm_timeout") or 10), 30)
        ok, msg = test_llm_connection(vals["llm_api_url"], vals["llm_model"], vals["llm_api_key"], timeout=t)
        return {"ok": ok, "msg": msg}
