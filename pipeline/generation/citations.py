"""Citation guard for streamed answers.

The model is told to cite reference material n as `[n]`. While the answer streams, `CitationGuard`:

* removes citations whose numbers are outside 1…k (invented sources), even when "[", "1", "2", "]" arrive in
  different deltas — a possible partial citation at the end of a delta is held back until it either closes or
  can no longer be one, then released as plain text;
* understands `[n]`, full-width `【n】` / `［n］`, full-width digits, lists `[1,2]` `[1，2]` `[1、2]` `[1, 2]`,
  ranges `[1-3]`, and the wordy `[资料1]` / `【材料 2】` / `[参考资料3]`;
* rewrites every kept citation in the canonical form `[n]` (a list becomes `[1][2]`; invalid members of a list
  are dropped, a list with no valid member disappears entirely);
* records in `cited` the valid numbers the answer really cites (and `order`, first-cited first).

Text that only looks like a bracket (`[注]`, `[a]`, `【重要】`) passes through unchanged.
"""
from __future__ import annotations

import re

OPENERS = "[［【"
CLOSERS = "]］】"
_PREFIX_WORDS = ("参考资料", "参考材料", "参考", "资料", "材料", "来源", "文献")
_SEP_CHARS = ",，、;；-–—~～ 　"
_DIGITS = "0123456789０１２３４５６７８９"
_MAX_INNER = 40  # longest bracket content still considered a possible citation

_NUM = r"(?:%s)?\s*[0-9０-９]{1,4}" % "|".join(_PREFIX_WORDS)
_SEP = r"\s*[,，、;；\-–—~～]\s*|\s+"
_INNER = re.compile(r"\s*(%s)((?:(?:%s)(?:%s))*)\s*" % (_NUM, _SEP, _NUM))
_TOKEN = re.compile(r"([0-9０-９]{1,4})|([\-–—~～])")
# characters allowed inside a citation that is still being typed
_ALLOWED_INNER = set(_DIGITS + _SEP_CHARS + "".join(_PREFIX_WORDS))
_FULLWIDTH_DIGITS = str.maketrans("０１２３４５６７８９", "0123456789")


def _parse_numbers(inner: str) -> list[int] | None:
    """Numbers cited by bracket content, or None when the content is not a citation."""
    if not _INNER.fullmatch(inner):
        return None
    nums: list[int] = []
    range_pending = False
    for m in _TOKEN.finditer(inner):
        if m.group(1) is not None:
            n = int(m.group(1).translate(_FULLWIDTH_DIGITS))
            if range_pending and nums:
                lo = nums[-1]
                if lo < n <= lo + 50:
                    nums.extend(range(lo + 1, n + 1))
                else:
                    nums.append(n)
                range_pending = False
            else:
                nums.append(n)
        else:
            range_pending = True
    return nums


def _could_continue(inner: str) -> bool:
    """Could `opener + inner` still grow into a citation?"""
    if len(inner) > _MAX_INNER:
        return False
    if any(ch not in _ALLOWED_INNER for ch in inner):
        return False
    stripped = inner.strip(" 　")
    # a prefix word must come before digits: "[资料" / "[参考资" are fine, "[料" alone is not worth holding
    if stripped and stripped[0] not in _DIGITS:
        if not any(w.startswith(stripped[: len(w)]) or stripped.startswith(w) for w in _PREFIX_WORDS):
            return False
    return True


class CitationGuard:
    """Feed streamed text in, get filtered text out. `flush()` at the end releases any held-back tail."""

    def __init__(self, k: int):
        self.k = int(k)
        self.cited: set[int] = set()
        self.order: list[int] = []
        self.removed: list[str] = []  # raw text of citations dropped (for logging/tests)
        self._buf = ""

    def _render(self, raw: str, inner: str) -> str | None:
        nums = _parse_numbers(inner)
        if nums is None:
            return None  # not a citation: caller emits it verbatim
        valid = []
        for n in nums:
            if 1 <= n <= self.k and n not in valid:
                valid.append(n)
        if len(valid) < len(nums) or not valid:
            self.removed.append(raw)
        for n in valid:
            if n not in self.cited:
                self.cited.add(n)
                self.order.append(n)
        return "".join(f"[{n}]" for n in valid)

    def feed(self, text: str) -> str:
        if not text:
            return ""
        s = self._buf + text
        self._buf = ""
        out: list[str] = []
        i = 0
        n = len(s)
        while i < n:
            # copy plain text up to the next opener
            j = i
            while j < n and s[j] not in OPENERS:
                j += 1
            out.append(s[i:j])
            if j >= n:
                break
            # s[j] is an opener: look for its closer
            k = j + 1
            while k < n and s[k] not in CLOSERS and s[k] not in OPENERS and k - j - 1 <= _MAX_INNER:
                k += 1
            if k < n and s[k] in CLOSERS:
                inner = s[j + 1:k]
                rendered = self._render(s[j:k + 1], inner)
                if rendered is None:
                    out.append(s[j])  # not a citation: emit the opener, rescan after it
                    i = j + 1
                else:
                    out.append(rendered)
                    i = k + 1
                continue
            if k >= n and _could_continue(s[j + 1:]):
                self._buf = s[j:]  # possible partial citation at the end: hold it back
                break
            out.append(s[j])  # cannot become a citation
            i = j + 1
        return "".join(out)

    def flush(self) -> str:
        """End of stream: a still-open bracket was not a citation; release it verbatim."""
        tail, self._buf = self._buf, ""
        if not tail:
            return ""
        # release the opener literally; the rest is scanned again (it may hold further brackets)
        return tail[0] + self.feed(tail[1:]) + self.flush()

    @property
    def pending(self) -> str:
        return self._buf


def strip_citations(text: str, k: int) -> tuple[str, set[int]]:
    """Non-streaming convenience: filter a whole text at once."""
    g = CitationGuard(k)
    out = g.feed(text) + g.flush()
    return out, g.cited
