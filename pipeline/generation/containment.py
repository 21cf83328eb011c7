"""Prompt containment: the one function every untrusted text goes through before it is put into a prompt.

Untrusted = document text and names (materials), earlier turns (history), the user's question and the rewritten
query — in the answer prompt and in the follow-up rewrite prompt. `contain(text)` makes every *marker* inert:

- our own delimiter tags (<material>, <materials>, <history>, <query>, <question>, …), opening or closing, with or
  without attributes;
- chat-template and role tokens of the common model families: <|im_start|> <|im_end|> <|system|> <|user|>
  <|assistant|> <|endoftext|> <|begin_of_text|> <|start_header_id|> <|eot_id|> (any <|…|>), <<SYS>> [INST]
  [/INST], <s> </s>, <start_of_turn> <end_of_turn>, <think>, <bos> <eos>, <system>/<user>/<assistant> …

— in every encoding form: HTML entities (&lt; &#60; &#x3c;, also double-encoded: entities are decoded first, up
to three times — the model sees the characters, so it should be checked on the characters), full-width and other
compatibility forms (NFKC), look-alike letters and brackets (a confusables fold: Cyrillic а → a, ‹ 〈 ⟨ → <, ǀ │ → |)
and zero-width characters inside a token. Detection runs on that folded view; the matching span of the *original*
text is replaced by 「name」 (corner brackets: nothing in NFKC or the fold turns them back into a delimiter), so
the rest of the text — Chinese punctuation included — reaches the model as written.

`markers(text)` lists what is left (tests, tools/eval): after `contain`, it finds nothing.
"""
from __future__ import annotations

import html
import re
import unicodedata

# Look-alikes NFKC leaves alone (a small fold in the spirit of Unicode confusables.txt, for the letters of our
# tag names and the delimiter characters). '' = dropped (zero-width / invisible).
_FOLD = {
    # Cyrillic
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s", "ԁ": "d",
    "һ": "h", "ӏ": "l", "т": "t", "м": "m", "к": "k", "н": "h", "в": "b", "ԛ": "q", "ԝ": "w", "ү": "y", "ɡ": "g",
    "А": "a", "В": "b", "Е": "e", "К": "k", "М": "m", "Н": "h", "О": "o", "Р": "p", "С": "c", "Т": "t", "Х": "x",
    "І": "i", "Ј": "j", "Ѕ": "s", "Ү": "y", "Ӏ": "l",
    # Greek
    "α": "a", "ο": "o", "ρ": "p", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "τ": "t", "υ": "u", "χ": "x", "η": "n",
    "Α": "a", "Β": "b", "Ε": "e", "Η": "h", "Ι": "i", "Κ": "k", "Μ": "m", "Ν": "n", "Ο": "o", "Ρ": "p", "Τ": "t",
    "Υ": "y", "Χ": "x", "Ζ": "z",
    # Latin look-alikes
    "ı": "i", "ɪ": "i", "ʟ": "l", "ɴ": "n", "ꜱ": "s", "ᴍ": "m", "ᴀ": "a", "ᴇ": "e", "ᴛ": "t", "ʀ": "r", "ᴜ": "u",
    # brackets, bars, slashes
    "‹": "<", "›": ">", "〈": "<", "〉": ">", "⟨": "<", "⟩": ">", "❮": "<", "❯": ">", "ᐸ": "<", "ᐳ": ">", "˂": "<",
    "˃": ">", "《": "<", "》": ">", "≺": "<", "≻": ">", "⦑": "<", "⦒": ">",
    "ǀ": "|", "│": "|", "∣": "|", "┃": "|", "ℓ": "l", "⁄": "/", "∕": "/", "⧸": "/",
    "【": "[", "】": "]", "〔": "[", "〕": "]", "⟦": "[", "⟧": "]",
    # invisible
    "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "", "\u00ad": "", "\u180e": "",
}

OUR_TAGS = ("materials", "material", "history", "query", "question", "instructions", "instruction", "rules",
            "flagged", "context", "document", "documents", "turn")
ROLE_TAGS = ("system", "user", "assistant", "human", "bot", "model", "tool", "tool_call", "tool_response",
             "function", "think", "thinking", "start_of_turn", "end_of_turn", "bos", "eos", "pad", "sep", "s",
             "im_start", "im_end", "endoftext", "eot_id", "start_header_id", "end_header_id", "begin_of_text")

_MARKER = re.compile(
    r"<\s*\|[^<>|\n]{1,60}\|\s*>"                                     # <|im_start|> <|eot_id|> … (any <|…|>)
    r"|<\s*\|\s*(?:im_start|im_end|system|user|assistant|endoftext|end)\b"  # an unclosed one
    r"|<<\s*/?\s*sys\s*>>"                                            # Llama 2 <<SYS>> <</SYS>>
    r"|\[\s*/?\s*(?:inst|sys|system_prompt|available_tools|tool_calls|tool_results)\s*\]"  # [INST] [/INST] …
    r"|<\s*/?\s*(?:" + "|".join(sorted(OUR_TAGS, key=len, reverse=True)) + r")\b[^<>\n]{0,200}>?"  # ours, attrs
    r"|<\s*/?\s*(?:" + "|".join(sorted(ROLE_TAGS, key=len, reverse=True)) + r")\s*/?\s*>",  # <s> </s> <user> …
    re.I)


def _fold_char(ch: str) -> str:
    return "".join(_FOLD.get(c, c) for c in unicodedata.normalize("NFKC", _FOLD.get(ch, ch))).lower()


def _triggers() -> re.Pattern:
    """The characters a marker can start with once folded (<, [, & and every look-alike NFKC or the fold maps
    there): a text without any of them holds no marker, and the per-character fold is skipped (the common case)."""
    chars = {chr(cp) for cp in range(0x20, 0x10000) if not 0xD800 <= cp < 0xE000
             and any(c in "<[&" for c in _fold_char(chr(cp)))}
    return re.compile("[" + "".join(re.escape(c) for c in sorted(chars)) + "]")


_TRIGGER = _triggers()


def _decoded(text: str) -> str:
    for _ in range(3):  # &amp;lt; → &lt; → <
        nxt = html.unescape(text)
        if nxt == text:
            break
        text = nxt
    return text


def _folded(text: str) -> tuple[str, list[int]]:
    """The detection view of `text` and, for each of its characters, the index of the original character."""
    out, owner = [], []
    for i, ch in enumerate(text):
        f = _fold_char(ch)
        out.append(f)
        owner.extend([i] * len(f))
    return "".join(out), owner


def _inert(folded_marker: str) -> str:
    core = " ".join(re.sub(r"[<>|\[\]]+", " ", folded_marker).split())
    return f"「{core[:60]}」"


def contain(text: object) -> str:
    """`text` with every marker (see module doc) replaced by an inert 「…」 form; entities decoded."""
    s = "" if text is None else str(text)
    if not _TRIGGER.search(s):
        return s
    s = _decoded(s)
    folded, owner = _folded(s)
    spans = [(owner[m.start()], owner[m.end() - 1] + 1, m.group(0)) for m in _MARKER.finditer(folded)]
    if not spans:
        return s
    out, pos = [], 0
    for start, end, marker in spans:
        if start < pos:  # two markers folded from overlapping characters: the first one covers it
            continue
        out.append(s[pos:start])
        out.append(_inert(marker))
        pos = end
    out.append(s[pos:])
    return "".join(out)


def markers(text: str) -> list[str]:
    """The markers `text` still holds (in the detection view): [] after contain()."""
    if not text or not _TRIGGER.search(text):
        return []
    return [m.group(0) for m in _MARKER.finditer(_folded(_decoded(text))[0])]
