"""Shared pytest fixtures."""
from __future__ import annotations

import pytest

from pipeline.models.offline import enable_offline

enable_offline()  # before any test module imports gradio / transformers / onnxruntime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """`needs_shared(path, ...)` (tests/shared_data.py): skip — or fail with CI=true — naming a missing path,
    before any fixture starts work that needs it."""
    from tests.shared_data import require

    for mark in item.iter_markers("needs_shared"):
        require(*mark.args)


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


# --- team mode: real PostgreSQL and Chroma servers (tests/servers.py) -----------------------------------------
def _start_or_skip(factory):
    """Start a server; where its binaries are missing skip — except in CI (CI=true), where that is a failure."""
    import os

    from tests.servers import ServerUnavailable

    try:
        server = factory()
    except ServerUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the team-mode tests: {exc}")
        pytest.skip(str(exc))
    return server.start()


def _session_server(factory_name: str):
    from tests import servers

    server = _start_or_skip(getattr(servers, factory_name))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server():
    """A throw-away PostgreSQL cluster on a loopback port for the whole session."""
    yield from _session_server("PostgresServer")


@pytest.fixture(scope="session")
def chroma_server():
    """A Chroma server (`chroma run`) on a loopback port for the whole session."""
    yield from _session_server("ChromaServer")


@pytest.fixture
def team_deployment(pg_server, chroma_server, tmp_path):
    """A fresh PostgreSQL database + Chroma database + shared files dir: what several app processes share."""
    from tests.servers import fresh_deployment

    return fresh_deployment(pg_server, chroma_server, tmp_path / "shared-files")


@pytest.fixture(scope="module", params=["embedded", pytest.param("server", marks=pytest.mark.slow)])
def make_deployment(request, tmp_path_factory):
    """A module asking for this runs twice: embedded (returns None, the default) and in team mode (a fresh
    PostgreSQL + Chroma-server database and files dir per call)."""
    if request.param == "embedded":
        return lambda: None
    from tests.servers import fresh_deployment

    pg, chroma = request.getfixturevalue("pg_server"), request.getfixturevalue("chroma_server")
    return lambda: fresh_deployment(pg, chroma, tmp_path_factory.mktemp("files"))
