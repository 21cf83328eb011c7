"""网页导入: fetch one web page under the server's rules and extract its main text.

The server fetches on an admin's behalf, so every request is bounded: http/https only; each hop's host resolved
and vetted by the address guard (pipeline.generation.llm_target.fetch_addresses: link-local and metadata never,
private / loopback only when the admin setting allows) and the connection made to exactly the vetted address
(SNI and Host still name the host); redirects followed by hand up to the setting's number, each hop vetted
again; a timeout per socket operation and a deadline for the whole fetch; the body read in blocks and dropped as
soon as it passes the size limit (a Content-Length over the limit is refused before reading anything).

A response that is not 2xx is a failure with its reason, never content: a 404 page's text must not become the
document (WeKnora #2883). The main text comes from trafilatura (boilerplate — navigation, footers — left out);
it parses the bytes handed to it and downloads nothing itself.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from pipeline.generation.llm_target import AddressRefused, fetch_addresses

USER_AGENT = "kbqa-web-import/1.0"
READ_BLOCK = 64 * 1024
HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain", "text/markdown")
MIN_TEXT_CHARS = 20  # less than this after extraction: nothing worth indexing


class FetchFailed(RuntimeError):
    """The page could not be fetched or yielded no text; `reason` is the Chinese text the document shows."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FetchLimits:
    timeout_s: float
    max_bytes: int
    max_redirects: int
    allow_private: bool


@dataclass
class Fetched:
    url: str            # the final URL after redirects
    content_type: str
    charset: str | None
    body: bytes


@dataclass
class Page:
    url: str
    title: str
    text: str           # the extracted main text (markdown)

    def snapshot(self, source_url: str) -> str:
        """The stored original: title, source and the main text. Nothing that changes between two fetches of an
        unchanged page (no fetch time), so an unchanged page has the same content hash and makes no version."""
        head = f"# {self.title}\n\n" if self.title else ""
        return f"{head}来源：{source_url}\n\n{self.text.strip()}\n"


def check_url(url: str) -> str:
    """The URL, trimmed, if it is http(s) with a host; else FetchFailed."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise FetchFailed("只支持 http:// 或 https:// 网址")
    if not parts.hostname:
        raise FetchFailed("网址缺少主机名")
    if len(url) > 2000:
        raise FetchFailed("网址过长（最多 2000 个字符）")
    return url


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to a vetted address: the Host header names the host, the socket goes to `ip`."""

    def __init__(self, host: str, port: int | None, ip: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._ip = ip

    def connect(self):
        self.sock = socket.create_connection((self._ip, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, ip: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._ip = ip

    def connect(self):
        sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _get(url: str, limits: FetchLimits, deadline: float) -> tuple[int, dict, http.client.HTTPResponse, object]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchFailed(f"重定向到不支持的协议：{scheme or '无'}")
    try:
        host = (parts.hostname or "").encode("idna").decode("ascii")  # 例子.中国 → xn--… (Host header, SNI)
    except UnicodeError:
        raise FetchFailed(f"无效的主机名：{parts.hostname}") from None
    try:
        addrs = fetch_addresses(host, allow_private=limits.allow_private)
    except AddressRefused as exc:
        raise FetchFailed(str(exc)) from None
    cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    conn = cls(host, parts.port, addrs[0], timeout=max(0.1, min(limits.timeout_s, deadline - time.monotonic())))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("GET", path, headers={"User-Agent": USER_AGENT, "Accept": "text/html,text/plain;q=0.9,*/*;q=0.1",
                                           "Accept-Encoding": "identity"})
        resp = conn.getresponse()
    except TimeoutError:
        conn.close()
        raise FetchFailed(f"连接或响应超时（{limits.timeout_s:g} 秒）") from None
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise FetchFailed(f"无法连接：{type(exc).__name__} {exc}".strip()) from None
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp, conn


def _read_limited(resp, limits: FetchLimits, deadline: float) -> bytes:
    length = resp.getheader("content-length")
    if length and length.isdigit() and int(length) > limits.max_bytes:
        raise FetchFailed(f"网页过大（{int(length)} 字节，上限 {limits.max_bytes} 字节）")
    chunks, total = [], 0
    try:
        while True:
            if time.monotonic() > deadline:
                raise FetchFailed(f"下载超时（{limits.timeout_s:g} 秒）")
            block = resp.read1(READ_BLOCK) if hasattr(resp, "read1") else resp.read(READ_BLOCK)
            if not block:
                break
            total += len(block)
            if total > limits.max_bytes:
                raise FetchFailed(f"网页过大（超过上限 {limits.max_bytes} 字节）")
            chunks.append(block)
    except TimeoutError:
        raise FetchFailed(f"下载超时（{limits.timeout_s:g} 秒）") from None
    except (OSError, http.client.HTTPException) as exc:
        raise FetchFailed(f"下载中断：{type(exc).__name__}") from None
    return b"".join(chunks)


def fetch(url: str, limits: FetchLimits) -> Fetched:
    """GET `url` under `limits`; FetchFailed with the reason for anything but a 2xx page of text."""
    url = check_url(url)
    deadline = time.monotonic() + limits.timeout_s * (limits.max_redirects + 1)  # each hop its timeout at most
    seen = {url}
    for _ in range(limits.max_redirects + 1):
        status, headers, resp, conn = _get(url, limits, deadline)
        try:
            if status in (301, 302, 303, 307, 308):
                target = headers.get("location")
                if not target:
                    raise FetchFailed(f"HTTP {status} 重定向缺少 Location")
                url = urljoin(url, target.strip())
                if url in seen:
                    raise FetchFailed(f"重定向循环：{url}")
                seen.add(url)
                continue
            if not 200 <= status < 300:
                raise FetchFailed(f"HTTP {status} {resp.reason or ''}".strip())
            ctype, _, params = (headers.get("content-type") or "text/html").partition(";")
            ctype = ctype.strip().lower()
            if ctype not in HTML_TYPES + TEXT_TYPES:
                raise FetchFailed(f"不支持的网页类型：{ctype}")
            charset = next((p.split("=", 1)[1].strip().strip('"') for p in params.split(";")
                            if p.strip().lower().startswith("charset=")), None)
            return Fetched(url, ctype, charset, _read_limited(resp, limits, deadline))
        finally:
            conn.close()
    raise FetchFailed(f"重定向次数超过 {limits.max_redirects} 次")


def _decode(body: bytes, charset: str | None) -> str:
    for enc in filter(None, (charset, "utf-8", "gb18030")):
        try:
            return body.decode(enc)
        except (LookupError, UnicodeDecodeError):
            continue
    return body.decode("utf-8", errors="replace")


def extract(fetched: Fetched) -> Page:
    """The page's title and main text (boilerplate left out); FetchFailed when nothing is left."""
    if fetched.content_type in TEXT_TYPES:
        text = _decode(fetched.body, fetched.charset)
        title = ""
    else:
        import trafilatura  # lxml and friends load on the first import only

        html = _decode(fetched.body, fetched.charset) if fetched.charset else fetched.body
        text = trafilatura.extract(html, url=fetched.url, output_format="markdown", include_comments=False,
                                   include_tables=True, favor_precision=True) or ""
        meta = trafilatura.extract_metadata(html)
        title = ((meta.title if meta else None) or "").strip()
    if len(text.strip()) < MIN_TEXT_CHARS:
        raise FetchFailed("网页中没有可提取的正文")
    if title and text.lstrip().startswith(f"# {title}"):
        title = ""  # the extracted text carries the heading already
    return Page(fetched.url, title, text)


def fetch_page(url: str, limits: FetchLimits) -> Page:
    return extract(fetch(url, limits))
