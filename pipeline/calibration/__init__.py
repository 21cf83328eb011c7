"""Calibration profiles: every number fitted on dev data, one file per embedding model (docs/retrieval-eval.md,
"Where the fitted numbers live"). `profile.py` is the schema, `store.py` finds and reads the profile of a model."""
from pipeline.calibration.profile import CalibrationProfile
from pipeline.calibration.store import ActiveProfile, generic, profile_for, read, slug, write

__all__ = ["ActiveProfile", "CalibrationProfile", "generic", "profile_for", "read", "slug", "write"]
