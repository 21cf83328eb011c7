"""Finding, reading and writing calibration profiles (pipeline/calibration/profile.py).

    active = profile_for(model_id, dim)      # the model's own profile, or the generic one (calibrated False)

A model's profile is `<slug>.json`, slug = its id with every character outside [A-Za-z0-9._-] replaced by "-"
(`packaged:multilingual-e5-small` → `packaged-multilingual-e5-small.json`). It is looked for in
$KBQA_CALIBRATION_DIR first (profiles written where the code is read-only, e.g. a volume of the container), then
beside this file. A model without one runs on `generic.json` — and says so (`ActiveProfile.calibrated`).
Loaded once per model load (pipeline.components.load_models); consumers get their section through their
constructors.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.calibration.profile import CalibrationProfile

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
DIR_ENV = "KBQA_CALIBRATION_DIR"
GENERIC = "generic"


def slug(model_id: str) -> str:
    """A file name for a model id."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", model_id).strip(".") or "model"


def search_dirs(extra: Path | str | None = None) -> list[Path]:
    """Where profiles are looked for, first match wins: `extra`, $KBQA_CALIBRATION_DIR, this package."""
    dirs = [Path(d) for d in (extra, os.environ.get(DIR_ENV)) if d]
    return [*dirs, PACKAGE_DIR]


def read(path: Path | str) -> CalibrationProfile:
    """A profile file, validated (pydantic raises naming the field when a number is missing or out of range)."""
    return CalibrationProfile.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))


def write(profile: CalibrationProfile, path: Path | str) -> Path:
    """Write a profile (validated again on the way out: what is written can be read back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(profile.model_dump(mode="json"), ensure_ascii=False, indent=2) + "\n"
    CalibrationProfile.model_validate(json.loads(text))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def generic() -> CalibrationProfile:
    return read(PACKAGE_DIR / f"{GENERIC}.json")


@dataclass(frozen=True)
class ActiveProfile:
    """The profile an engine runs on, and whether it was fitted for the loaded model."""

    profile: CalibrationProfile
    name: str                 # the file's stem: the model's slug, or "generic"
    calibrated: bool          # fitted for this model (False: the generic profile stands in)
    model_id: str | None
    path: Path | None = None
    note: str | None = None   # why the generic profile is used

    def info(self) -> dict:
        """What /api/health and the answer trace show about it."""
        p = self.profile
        return {"profile": self.name, "calibrated": self.calibrated, "embedding_model": self.model_id,
                "fitted_for": p.embedding_model, "date": p.gate.provenance.date,
                "min_similarity": p.floor.min_similarity,
                "gate": "two_stage" if p.gate.full is not None else "one_stage", "note": self.note}


def profile_for(model_id: str, dim: int | None = None, extra_dir: Path | str | None = None) -> ActiveProfile:
    """The profile of this embedding model, or the generic one when it has none (or its file is for a model of
    another vector size: a folder of the same name holding another model)."""
    name = slug(model_id)
    for d in search_dirs(extra_dir):
        path = d / f"{name}.json"
        if not path.is_file():
            continue
        prof = read(path)
        if prof.embedding_model != model_id:
            raise ValueError(f"{path}: profile of {prof.embedding_model!r}, not of {model_id!r}")
        if dim is not None and prof.embedding_dim is not None and prof.embedding_dim != dim:
            note = f"{path.name} 是 {prof.embedding_dim} 维模型的校准，当前模型 {dim} 维"
            log.error("calibration %s: %s; using the generic profile", path, note)
            return ActiveProfile(generic(), GENERIC, False, model_id, PACKAGE_DIR / f"{GENERIC}.json", note)
        return ActiveProfile(prof, name, True, model_id, path)
    return ActiveProfile(generic(), GENERIC, False, model_id, PACKAGE_DIR / f"{GENERIC}.json",
                         f"没有 {model_id} 的校准参数（{name}.json），使用通用默认值")
