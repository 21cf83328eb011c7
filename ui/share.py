"""Public share link for the mounted app (`python app.py --share`, only together with --auth).

`gr.mount_gradio_app` has no `share=`; this opens the same FRP tunnel `Blocks.launch(share=True)` would, through
`gradio.networking.setup_tunnel` (gradio 6.31). Offline it fails (no frpc binary, no share server): we say so
plainly and the app keeps serving on its local address.
"""
from __future__ import annotations

import logging
import sys
from urllib.parse import urlparse, urlunparse

log = logging.getLogger(__name__)


def _reason(exc: BaseException) -> str:
    try:
        from pathlib import Path

        from gradio.tunneling import BINARY_PATH

        if not Path(BINARY_PATH).exists():
            return f"缺少 Gradio 的隧道程序 frpc（{BINARY_PATH}），且无法联网下载"
    except Exception:  # pragma: no cover - gradio layout changed
        pass
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"无法连接 Gradio 分享服务器（{text}）"


def open_share_tunnel(blocks, host: str, port: int, out=None) -> str | None:
    """Open a share tunnel to host:port; return the public URL, or None (after printing why) on failure."""
    out = out or sys.stdout
    from gradio import networking

    local_host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
    address = getattr(blocks, "share_server_address", None)
    protocol = getattr(blocks, "share_server_protocol", None) or ("http" if address else "https")
    try:
        url = networking.setup_tunnel(local_host=local_host, local_port=int(port), share_token=blocks.share_token,
                                      share_server_address=address,
                                      share_server_tls_certificate=getattr(blocks, "share_server_tls_certificate",
                                                                           None))
    except Exception as exc:
        log.debug("share tunnel failed", exc_info=True)
        print(f"* 未能创建公网分享链接：{_reason(exc)}。应用继续在本地地址提供服务。", file=out, flush=True)
        return None
    url = urlunparse((protocol,) + urlparse(url)[1:])
    blocks.share_url = url
    blocks.share = True
    print(f"* 公网分享链接: {url} （需要登录；链接最长有效 1 周）", file=out, flush=True)
    return url
