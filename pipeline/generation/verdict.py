"""The LLM's 「资料不足」 verdict: the materials do not address the specific point asked (the product, act, party,
number the question names), even where they hold a neighbouring general rule.

The prompt (prompting.py) asks for the verdict alone, first; a model that notices only while writing ends its
answer with it on a line of its own. Both are recognised here, on the text the user would see:

- `VerdictWatch` sits on the streamed deltas and holds back only the characters that could still be the start
  of the verdict (「资料」 could open 「资料不足」 or 「资料显示…」): at most the decoration, the four characters
  and the one after them; anything else passes through at once.
- `ends_with_verdict` reads a finished answer: its last non-empty line is the verdict.

A verdict is the marker standing alone — followed by nothing, a full stop or a colon with a note — so an answer
that quotes a rule about insufficient materials (「资料不足的，应当补正」「申请资料不足，可以…」) is not one.
"""
from __future__ import annotations

import re

VERDICT = "资料不足"
# characters a model puts around a standalone verdict: quotes, brackets, Markdown emphasis, headings
_DECOR = "「」『』【】[]\"'“”‘’*#_`>〔〕（）() \t\r\n"
# after the marker, on its line: decoration and citations (「资料不足[1]」), or a citation still arriving (「[1」)
_TAIL = re.compile(r"(?:\[\d{1,3}\]|\[\d{0,3}$|[「」『』【】\[\]\"'“”‘’*#_`>〔〕（）() \t])*")
_ENDS = "。.！!：:；;\r\n"  # what may follow the marker in a verdict (a colon or stop may carry a short note)
HOLD_LIMIT = 16  # characters held back at most before the start is certain not to be the verdict


def _state(text: str, final: bool) -> str:
    """Whether `text` opens with the verdict: "yes", "no", or "maybe" (not known yet; only while not `final`)."""
    lead = text.lstrip(_DECOR)
    if len(lead) <= len(VERDICT) and lead != VERDICT:
        return "maybe" if not final and VERDICT.startswith(lead) else "no"
    if not lead.startswith(VERDICT):
        return "no"
    rest = lead[len(VERDICT):]
    rest = rest[_TAIL.match(rest).end():]
    if not rest:
        return "yes" if final else "maybe"
    return "yes" if rest[0] in _ENDS else "no"  # 「资料不足的，…」: a sentence, not the verdict


def is_verdict_line(line: str) -> bool:
    """The line says 「资料不足」 and nothing that makes it part of a sentence about something else."""
    return _state(line, final=True) == "yes"


def ends_with_verdict(text: str) -> bool:
    """The answer's last non-empty line is the verdict (a model that found out while writing)."""
    lines = [ln for ln in re.split(r"[\r\n]+", text or "") if ln.strip(_DECOR)]
    return bool(lines) and is_verdict_line(lines[-1])


class VerdictWatch:
    """Feeds streamed text through, holding back a start that may still turn out to be the verdict.

    `feed(text)` returns what may be shown now; once `verdict` is True the answer is the verdict (show nothing).
    `flush()` at the end of the stream returns what is still held (and decides a verdict that is all there was).
    """

    def __init__(self):
        self.verdict = False
        self._held = ""
        self._decided = False

    def feed(self, text: str) -> str:
        if self._decided:
            return "" if self.verdict else text
        self._held += text
        state = _state(self._held, final=False)
        if state == "yes":
            self._decided = self.verdict = True
            return ""
        if state == "maybe" and len(self._held) < HOLD_LIMIT:
            return ""
        return self._release()

    def flush(self) -> str:
        if self._decided:
            return ""
        if _state(self._held, final=True) == "yes":
            self._decided = self.verdict = True
            return ""
        return self._release()

    def _release(self) -> str:
        self._decided = True
        out, self._held = self._held, ""
        return out
