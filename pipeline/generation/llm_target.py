"""Where 测试连接 (/api/config/test-llm) may send a request: never to link-local or cloud-metadata addresses.

An admin types any URL into the LLM settings and the server fetches it — a server-side request the browser could
not make. Link-local space (169.254.0.0/16, fe80::/10) and the metadata endpoints of the clouds (169.254.169.254,
fd00:ec2::254, metadata.google.internal, Alibaba's 100.100.100.200, Oracle's 192.0.0.192) hand out credentials
to whoever asks from inside the machine, so the test refuses them. Decided on the resolver's answer (every address
a name resolves to), so a DNS name pointing there is refused too; a name that does not resolve is left to the
request itself (it then fails with the usual connection message).

The same guard, stricter, decides where 网页导入 (pipeline/ingestion/web_fetch.py) may fetch: `fetch_addresses`
also refuses private, loopback and other non-public addresses unless the admin setting allows them (link-local
and metadata stay refused either way), and hands back the vetted addresses so the fetch connects to exactly
those (a name re-resolving elsewhere between the check and the connection cannot slip through).
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

METADATA_NAMES = {"metadata.google.internal", "metadata.goog", "metadata", "instance-data",
                  "instance-data.ec2.internal"}
METADATA_ADDRS = {ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200",
                                                     "192.0.0.192")}


def _bad(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip in METADATA_ADDRS


def resolve(host: str) -> list[str]:
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
    except (OSError, UnicodeError):
        return []


def refused_target(api_base: str) -> str | None:
    """The refusal text when `api_base` points at a link-local or metadata address, else None."""
    host = (urlsplit(api_base).hostname or "").rstrip(".").lower()
    if not host:
        return None
    if host in METADATA_NAMES:
        return f"不允许连接云主机元数据地址：{host}"
    bad = [a for a in ([host] if _bad(host) else resolve(host)) if _bad(a)]
    if bad:
        return f"不允许连接链路本地或云主机元数据地址：{host}（{bad[0]}）"
    return None


class AddressRefused(ValueError):
    """A fetch target the guard refuses (the message is the Chinese reason shown to the user)."""


def _ip(addr: str):
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return None
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None else ip


def fetch_addresses(host: str, *, allow_private: bool) -> list[str]:
    """The addresses a server-side fetch of `host` may connect to, or AddressRefused. Every address the name
    resolves to must pass: link-local and metadata never, private / loopback / other non-global only with
    `allow_private`."""
    host = (host or "").rstrip(".").lower().strip("[]")
    if not host:
        raise AddressRefused("网址缺少主机名")
    if host in METADATA_NAMES:
        raise AddressRefused(f"不允许访问云主机元数据地址：{host}")
    addrs = [host] if _ip(host) is not None else resolve(host)
    if not addrs:
        raise AddressRefused(f"无法解析域名：{host}")
    for a in addrs:
        ip = _ip(a)
        if ip is None:
            raise AddressRefused(f"无法识别的地址：{a}")
        if _bad(a):
            raise AddressRefused(f"不允许访问链路本地或云主机元数据地址：{host}（{a}）")
        if not ip.is_global and not allow_private:
            raise AddressRefused(f"不允许访问内网或本机地址：{host}（{a}）；管理员可在设置中允许")
    return addrs
