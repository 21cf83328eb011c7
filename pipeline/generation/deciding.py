"""The part of an answer sentence that decides a formal question (the clause to bold), and the lead-in a list
item needs.

「钱撕破了去银行换要收手续费吗？」 is decided by the clause 「无偿为公众兑换残缺、污损的人民币」 of a sentence that
starts with who must do it: the bold goes on the clause holding the deciding words of the question's kind
(answer_type.DECIDING for yes/no, consequence and body questions; a number or date for how long / how much).
A regulation's enumerations put the verdict in a lead-in line (「下列土地免缴土地使用税：」) above items that only
name cases (「(五)直接用于农、林、牧、渔业的生产用地；」): an item is shown under its lead-in. Lexical only: nothing
here embeds.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.generation.answer_type import DECIDING, expected_kind, holds_verdict, offers, untagged
from pipeline.generation.sentences import Piece, clauses

_ITEM = re.compile(r"^\s*[（(][一二三四五六七八九十\d]+[）)]")  # 「（一）」「(三)」: an enumerated item
MAX_ITEMS_BACK = 12  # an item this far below its lead-in is still under it (regulations: lists of up to ~10)

_VERDICT_BREAK = re.compile(r"[，,；;：:]")  # not 、: 「残缺、污损的人民币」 is one thing


def verdict_clauses(text: str, min_chars: int = 4) -> list[tuple[int, int]]:
    """(start, end) of the clauses of a sentence split at ，；： (an enumeration with 、 stays whole)."""
    return clauses(text, min_chars, _VERDICT_BREAK)


def deciding_clause(question: str, text: str, kind: str | None = None) -> list[tuple[int, int]]:
    """The clauses of `text` holding an answer of the kind the question asks for (deciding words the question does
    not already hold; for how long / how much, a number or date). Empty when the kind has none or none holds one.
    `kind`: the question's (answer_type.expected_kind), when the caller has it already."""
    kind = kind or expected_kind(question)
    if kind not in DECIDING and kind not in ("number", "time"):
        return []
    if kind in DECIDING:
        return [sp for sp in verdict_clauses(text) if holds_verdict(kind, text[sp[0]:sp[1]], question)]
    return [sp for sp in verdict_clauses(text) if offers(kind, text[sp[0]:sp[1]], question, untagged)]


def continued_lead_in(head: str, item: str, before: str) -> str:
    """The lead-in of a list item whose list the chunk starts inside (a long article cut in its list): the last
    line of the chunk before (`before`) that is no item, when it ends in ：. `head`: this chunk's text above the
    item, which must hold only items. Lines, not sentences: an item may run over several sentences."""
    if not _ITEM.match(item) or any(not _ITEM.match(x) for x in _lines(head)):
        return ""
    for line in reversed(_lines(before)[-MAX_ITEMS_BACK:]):
        if not _ITEM.match(line):
            return line if line.endswith(("：", ":")) else ""
    return ""


def _lines(text: str) -> list[str]:
    return [x.strip() for x in (text or "").splitlines() if x.strip()]


def lead_in(pieces: Sequence[Piece], position: int) -> str:
    """The lead-in line of the list item at `position` (the nearest earlier line ending in ：, with only items
    between), or "" when it is no item or its lead-in is not in this chunk."""
    if position >= len(pieces) or not _ITEM.match(pieces[position].text):
        return ""
    for back in range(position - 1, max(position - 1 - MAX_ITEMS_BACK, -1), -1):
        t = pieces[back].text.rstrip()
        if t.endswith(("：", ":")):
            return t
        if not _ITEM.match(t):
            return ""
    return ""


def item_verdict(pieces: Sequence[Piece], position: int, question: str) -> bool:
    """Does the lead-in of the list item at `position` state the yes/no verdict the question asks? 「军队医师不得有下列
    行为：」 decides 「(三)开展以牟利为目的的私人诊疗活动；」 although the item holds no deciding word of its own."""
    lead = lead_in(pieces, position)
    return bool(lead) and holds_verdict("yesno", lead, question)
