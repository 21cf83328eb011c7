"""Shared pytest fixtures."""
from __future__ import annotations

import pytest

from pipeline.offline import enable_offline

enable_offline()  # before any test module imports gradio / transformers / onnxruntime


@pytest.fixture
def http(live):
    """An HTTP client on the module's `live` app (tests/live.py); modules may define their own."""
    with live.http() as c:
        yield c


@pytest.fixture
def fake_llm():
    """A scripted OpenAI-compatible server on 127.0.0.1 (see tests/fake_llm.py); fresh per test."""
    from tests.fake_llm import FakeLLMServer

    server = FakeLLMServer().start()
    try:
        yield server
    finally:
        server.stop()
