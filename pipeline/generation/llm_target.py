"""Where 测试连接 (/api/config/test-llm) may send a request: never to link-local or cloud-metadata addresses.

An admin types any URL into the LLM settings and the server fetches it — a server-side request the browser could
not make. Link-local space (169.254.0.0/16, fe80::/10) and the metadata endpoints of the clouds (169.254.169.254,
fd00:ec2::254, metadata.google.internal, Alibaba's 100.100.100.200, Oracle's 192.0.0.192) hand out credentials
to whoever asks from inside the machine, so the test refuses them. Decided on the resolver's answer (every address
a name resolves to), so a DNS name pointing there is refused too; a name that does not resolve is left to the
request itself (it then fails with the usual connection message).
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
