"""No network at run time, set once by every entry point (app.py, tools/ via tools/__init__.py, tests/conftest.py).

The libraries read these when they are imported, so call `enable_offline()` before importing gradio,
transformers, onnxruntime or chromadb. Values already set by the caller win (setdefault).
"""
from __future__ import annotations

import os

OFFLINE_ENV = {
    "GRADIO_ANALYTICS_ENABLED": "False",  # Gradio usage analytics
    "HF_HUB_OFFLINE": "1",                # never look a model name up on the hub (fails after ~70 s offline)
    "TRANSFORMERS_OFFLINE": "1",
    "ORT_DISABLE_TELEMETRY": "1",         # onnxruntime ≥ 1.29 phones home ~9 s after start
    "ANONYMIZED_TELEMETRY": "False",      # Chroma's posthog telemetry
}


def enable_offline() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
