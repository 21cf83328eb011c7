"""LLM client: building the OpenAI-compatible LLM, mapping its failures to Chinese messages, a connection test.

What propagates out of `OpenAILike.stream_chat` (llama-index-llms-openai 0.8.x, openai 2.x), measured against
tests/fake_llm.py:

* Nothing is sent when `stream_chat()` is called: llama-index returns a lazy generator, so the request and any
  HTTP-status error happen on the first `next()`. LlamaIndex's own tenacity retry wraps only the creation of
  that generator, i.e. it never retries a streaming call; the only retries are the openai client's
  (`max_retries`, passed through). We use `max_retries=0`: a timeout fails after ~`timeout` seconds, one request.
* Request phase: `openai.AuthenticationError` (401), `PermissionDeniedError` (403), `NotFoundError` (404),
  `RateLimitError` (429), `InternalServerError` (5xx), `BadRequestError` (400), `APITimeoutError`,
  `APIConnectionError` (refused / DNS / reset; `APITimeoutError` is a subclass — test it first).
* Stream phase (after the 200 headers): openai does *not* wrap transport errors. A connection cut inside a
  chunked body surfaces as raw `httpx.RemoteProtocolError` ("peer closed connection without sending complete
  message body"), a stall longer than the timeout as raw `httpx.ReadTimeout`; an SSE `{"error": ...}` payload
  as `openai.APIError`. A close-delimited body that simply stops raises nothing — the stream just ends
  (generation.py detects that by the missing `finish_reason`).
* llama-index's callback wrapper re-raises the original exception unchanged.

The API key is never logged and is scrubbed from every message built here.
"""
from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from typing import Any

import httpx
import openai

from pipeline.generation.llm_target import refused_target

logger = logging.getLogger(__name__)

PLACEHOLDER_API_KEY = "sk-no-key-required"  # OpenAI clients refuse an empty key; local servers ignore it.
MAX_RETRIES = 0

# kinds of LLMError (stable identifiers for callers/tests; the Chinese text is for people)
KIND_AUTH = "auth"
KIND_FORBIDDEN = "forbidden"
KIND_TIMEOUT = "timeout"
KIND_RATELIMIT = "ratelimit"
KIND_CONNECT = "connect"
KIND_INTERRUPTED = "interrupted"
KIND_MODEL = "model_not_found"
KIND_NOT_FOUND = "not_found"
KIND_SERVER = "server"
KIND_OTHER = "other"


class LLMError(Exception):
    """Any failure of the LLM call. `msg` is a specific Chinese message fit for the user; `kind` a stable id."""

    def __init__(self, msg: str, kind: str = KIND_OTHER):
        super().__init__(msg)
        self.msg = msg
        self.kind = kind

    def __str__(self) -> str:
        return self.msg


def normalize_api_base(api_url: str) -> str:
    """Trim whitespace and trailing slashes; accept a pasted `…/chat/completions` endpoint too."""
    url = (api_url or "").strip().rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)].rstrip("/")
    return url


# --- hang-up support ----------------------------------------------------------------------------------------
# openai's Stream and its generator form a reference cycle, so an abandoned stream keeps its HTTP response (and
# the model generating, and billing) open until the garbage collector runs. build_llm's client remembers every
# response under the request's tag header; stream_answer closes its own response as soon as it stops reading.
# The tag travels as a header from stream_chat(extra_headers=…) to our client's request hook, which removes it
# before sending (servers may validate unknown headers: llama-cpp's server answers 400 to a non-UUID
# X-Request-Id) and keeps it in the request's extensions for the response hook.
STREAM_TAG_HEADER = "X-Rag-Stream-Tag"
_open_responses: dict[str, Any] = {}
_open_lock = threading.Lock()


def _take_tag(request: httpx.Request) -> None:
    tag = request.headers.pop(STREAM_TAG_HEADER, None)
    if tag:
        request.extensions = {**request.extensions, "rag_stream_tag": tag}


def _remember_response(response: httpx.Response) -> None:
    tag = response.request.extensions.get("rag_stream_tag")
    if tag:
        with _open_lock:
            _open_responses[tag] = response


def new_stream_tag() -> str:
    return f"rag-{uuid.uuid4().hex}"


def release_stream(tag: str) -> None:
    """Close the HTTP response of the request tagged `tag`, if it is still open; forget it either way."""
    with _open_lock:
        response = _open_responses.pop(tag, None)
    if response is not None:
        try:
            response.close()
        except Exception:  # noqa: BLE001
            pass


def supports_stream_tag(llm: Any) -> bool:
    """True for an LLM built by build_llm (its httpx client carries our response hook)."""
    client = getattr(llm, "_http_client", None)
    hooks = getattr(client, "event_hooks", None) or {}
    return _remember_response in (hooks.get("response") or [])


def build_llm(settings: Any):
    """OpenAILike from the settings, or None (extractive mode) when the API URL or model name is empty."""
    api_base = normalize_api_base(getattr(settings, "llm_api_url", "") or "")
    model = (getattr(settings, "llm_model", "") or "").strip()
    if not api_base or not model:
        return None
    refused = refused_target(api_base)  # saved before the check existed, or the name resolves elsewhere now
    if refused:
        logger.error("LLM not used: %s (extractive answers until the API URL is changed)", refused)
        return None
    from llama_index.llms.openai_like import OpenAILike  # imported lazily: keeps extractive mode light

    api_key = (getattr(settings, "llm_api_key", "") or "").strip() or PLACEHOLDER_API_KEY
    logger.info("LLM configured: model=%s api_base=%s timeout=%ss", model, api_base, settings.llm_timeout)
    http_client = openai.DefaultHttpxClient(event_hooks={"request": [_take_tag],
                                                                 "response": [_remember_response]})
    llm = OpenAILike(
        model=model,
        api_base=api_base,
        api_key=api_key,
        temperature=float(settings.llm_temperature),
        is_chat_model=True,
        is_function_calling_model=False,
        timeout=float(settings.llm_timeout),
        max_retries=MAX_RETRIES,
        reuse_client=True,
        http_client=http_client,
    )
    return llm


# --- error mapping ---------------------------------------------------------------------------------------------

UPSTREAM_EXCERPT = 200  # characters of an upstream error body we show: enough to read it, not a page of HTML


def _api_message(exc: BaseException) -> str:
    """The server's own error message if there is one, else str(exc) — cut to a short excerpt either way (an
    admin's URL may point at any server; its body is not ours to relay)."""
    text = _full_api_message(exc)
    text = " ".join(text.split())
    return text if len(text) <= UPSTREAM_EXCERPT else text[:UPSTREAM_EXCERPT] + "…"


def _full_api_message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
    msg = getattr(exc, "message", None)
    return msg if isinstance(msg, str) and msg else str(exc)


def _api_code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if not code:
        body = getattr(exc, "body", None)
        if isinstance(body, dict):
            inner = body.get("error", body)
            if isinstance(inner, dict):
                code = inner.get("code") or inner.get("type")
    return str(code or "")


def _root_cause(exc: BaseException) -> BaseException:
    seen = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return exc


def _connect_detail(exc: BaseException) -> str:
    root = _root_cause(exc)
    text = str(root) or type(root).__name__
    low = text.lower()
    if "refused" in low:
        return "连接被拒绝，服务未启动或端口错误"
    if "name or service not known" in low or "nodename nor servname" in low or "getaddrinfo" in low \
            or "name resolution" in low:
        return "无法解析主机名"
    if "reset" in low:
        return "连接被重置"
    if "ssl" in low or "certificate" in low:
        return f"TLS/证书错误（{text}）"
    if "unreachable" in low:
        return "网络不可达"
    return text


def _connect_message(exc: BaseException, api_base: str | None) -> str:
    detail = _connect_detail(exc)
    return f"无法连接大模型服务：{api_base}（{detail}）" if api_base else f"无法连接大模型服务：{detail}"


_MODEL_MISSING = re.compile(r"model.*(not[ _]?(exist|found)|does not exist|unknown|invalid)|不存在.*模型|模型.*不存在"
                            r"|no such model|model_not_found", re.I | re.S)


def _looks_like_missing_model(exc: BaseException) -> bool:
    text = f"{_api_code(exc)} {_api_message(exc)}"
    return bool(_MODEL_MISSING.search(text))


def _scrub(text: str, api_key: str | None) -> str:
    if api_key and len(api_key) >= 4 and api_key in text:
        text = text.replace(api_key, "****")
    text = re.sub(r"(sk-[A-Za-z0-9_\-]{6})[A-Za-z0-9_\-]+", r"\1****", text)  # any key-looking token
    text = re.sub(r"(?i)(bearer\s+)\S+", r"\1****", text)
    return text[:300]


def map_llm_error(exc: BaseException, *, mid_stream: bool = False, timeout: float | None = None,
                  model: str | None = None, api_base: str | None = None,
                  api_key: str | None = None) -> LLMError:
    """Translate an exception from the openai/httpx/llama-index stack into an LLMError with a Chinese message."""
    if isinstance(exc, LLMError):
        return exc
    t = f"（{timeout:g} 秒内无响应）" if timeout else ""
    where = f"：{api_base}" if api_base else ""
    model_txt = model or "（未知）"

    def mk(msg: str, kind: str) -> LLMError:
        return LLMError(_scrub(msg, api_key), kind)

    # --- timeouts (APITimeoutError subclasses APIConnectionError: check first)
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException)):
        if mid_stream:
            return mk(f"大模型输出中断：超过 {timeout:g} 秒未收到新内容" if timeout else "大模型输出中断：读取超时",
                      KIND_INTERRUPTED)
        return mk(f"大模型请求超时{t}", KIND_TIMEOUT)
    if isinstance(exc, openai.AuthenticationError):
        return mk("大模型鉴权失败，请检查 API Key", KIND_AUTH)
    if isinstance(exc, openai.PermissionDeniedError):
        return mk(f"大模型拒绝访问（403），请检查 API Key 权限或模型授权：{_api_message(exc)}", KIND_FORBIDDEN)
    if isinstance(exc, openai.RateLimitError):
        detail = _api_message(exc)
        if "quota" in detail.lower() or "余额" in detail or "insufficient" in detail.lower():
            return mk(f"大模型额度不足或请求过于频繁（429）：{detail}", KIND_RATELIMIT)
        return mk("大模型请求过于频繁（429），请稍后重试", KIND_RATELIMIT)
    if isinstance(exc, openai.NotFoundError):
        if _looks_like_missing_model(exc):
            return mk(f"模型名称不存在：{model_txt}", KIND_MODEL)
        return mk(f"大模型接口地址不存在（404），请检查 API 地址{where}", KIND_NOT_FOUND)
    if isinstance(exc, openai.BadRequestError):
        if _looks_like_missing_model(exc):
            return mk(f"模型名称不存在：{model_txt}", KIND_MODEL)
        return mk(f"大模型调用失败：请求被拒绝（400）：{_api_message(exc)}", KIND_OTHER)
    if isinstance(exc, openai.InternalServerError):
        status = getattr(exc, "status_code", 500)
        return mk(f"大模型服务内部错误（{status}）：{_api_message(exc)}", KIND_SERVER)
    if isinstance(exc, openai.APIConnectionError):
        if mid_stream:
            return mk(f"大模型输出中断：{_connect_detail(exc)}", KIND_INTERRUPTED)
        return mk(_connect_message(exc, api_base), KIND_CONNECT)
    if isinstance(exc, openai.APIStatusError):
        return mk(f"大模型调用失败：HTTP {exc.status_code}：{_api_message(exc)}", KIND_OTHER)
    # --- stream-phase transport errors come out of httpx unwrapped
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.StreamError, httpx.NetworkError)):
        if isinstance(exc, httpx.ConnectError) and not mid_stream:
            return mk(_connect_message(exc, api_base), KIND_CONNECT)
        return mk("大模型输出中断：连接在回答结束前被关闭", KIND_INTERRUPTED)
    if isinstance(exc, openai.APIError):  # e.g. an SSE {"error": …} payload inside the stream
        if mid_stream:
            return mk(f"大模型输出中断：{_api_message(exc)}", KIND_INTERRUPTED)
        return mk(f"大模型调用失败：{_api_message(exc)}", KIND_OTHER)
    if isinstance(exc, (ConnectionError, OSError)) and mid_stream:
        return mk(f"大模型输出中断：{type(exc).__name__}: {exc}", KIND_INTERRUPTED)
    return mk(f"大模型调用失败：{type(exc).__name__}: {exc}", KIND_OTHER)


# --- connection test --------------------------------------------------------------------------------------------

def test_llm_connection(api_url: str, model: str, api_key: str, timeout: float = 10) -> tuple[bool, str]:
    """One minimal chat request with the given (unsaved) values. Never raises.

    Returns (True, "连接成功：模型 xxx 响应正常，用时 N ms") or (False, a specific Chinese reason).
    """
    api_base = normalize_api_base(api_url)
    model = (model or "").strip()
    key = (api_key or "").strip()
    if not api_base:
        return False, "请填写 API 地址"
    if not re.match(r"^https?://[^/\s]+", api_base):
        return False, f"API 地址格式不正确（应以 http:// 或 https:// 开头）：{api_base}"
    if not model:
        return False, "请填写模型名称"
    refused = refused_target(api_base)
    if refused:
        return False, refused
    client = openai.OpenAI(base_url=api_base, api_key=key or PLACEHOLDER_API_KEY,
                           timeout=float(timeout), max_retries=0)
    start = time.perf_counter()
    try:
        resp = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "你好"}], max_tokens=1, stream=False,
        )
        if not getattr(resp, "choices", None):
            return False, f"大模型返回了无法识别的响应（没有 choices），请检查 API 地址：{api_base}"
    except Exception as exc:  # noqa: BLE001 — every failure becomes a message
        err = map_llm_error(exc, timeout=float(timeout), model=model, api_base=api_base, api_key=key)
        logger.info("LLM connection test failed: %s", err.msg)
        return False, err.msg
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass
    ms = int((time.perf_counter() - start) * 1000)
    return True, f"连接成功：模型 {model} 响应正常，用时 {ms} ms"


test_llm_connection.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported into tests
