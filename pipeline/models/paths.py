"""Where model path settings point, and the ids recorded with the vectors. One rule for both model kinds.

Kept import-light (no torch, no numpy) so the engine can answer "which model will serve?" without loading one.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGED_EMBEDDING_NAME = "multilingual-e5-small"
PACKAGED_MODEL_ID = f"packaged:{PACKAGED_EMBEDDING_NAME}"


def resolve_model_dir(path_setting: str, project_root: Path) -> Path | None:
    """The configured folder if it holds a model (config.json), else None. Relative to the project root."""
    setting = (path_setting or "").strip()
    if not setting:
        return None
    path = Path(os.path.expanduser(setting))
    if not path.is_absolute():
        path = Path(project_root) / path
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    return None


def local_model_id(model_dir: Path) -> str:
    return f"local:{model_dir.name}"


def embedding_model_id(path_setting: str, project_root: Path) -> str:
    """The id of the embedding model these settings select (without loading it)."""
    d = resolve_model_dir(path_setting, project_root)
    return local_model_id(d) if d else PACKAGED_MODEL_ID
