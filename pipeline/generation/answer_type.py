"""What kind of answer a question asks for, and whether a sentence offers one it did not already have.

「谁在第 50 届超级碗上演唱了国歌？」 wants a person: a sentence that only restates the question (「…超级碗…国歌」)
does not answer it, one naming a person the question does not name (「女神卡卡献唱了国歌」) may. Cheap cues:
question words for the kind, jieba's part-of-speech tags (nr person, ns place) and number / date patterns for
the offer. The picker weighs the cue (w_type, fitted leave-one-set-out; pipeline/generation/extractive.py).
"""
from __future__ import annotations

import re
from collections.abc import Callable

# Order matters: 「哪一年」 is a time before 「哪」 makes it anything, 「多少年」 a time before 「多少」 a number.
_KINDS: list[tuple[str, re.Pattern]] = [
    ("time", re.compile(r"何时|什么时候|哪一?年|哪一?天|什么时间|何年|多少年前|哪个?世纪|哪个?朝代|哪个?年代|哪个?时期|几月|几号|何日")),
    ("person", re.compile(r"谁|哪一?位|何人|什么人|哪个人|哪些人")),
    ("place", re.compile(r"哪里|哪儿|何处|何地|什么地方|哪个?(?:国家|城市|省|地区|州|县|市|国)|在哪")),
    ("number", re.compile(r"多少|几[个次年天岁种位名人家条项倍]|多大|多长|多高|多重|多远|多久|多深|多宽|百分之几|几成")),
]
# a lone 一 before a measure word is mostly the article (「一个种」), not a quantity
_NUMBER = re.compile(r"\d|(?:[二三四五六七八九十百千万亿两〇零]|[一二三四五六七八九十百千万亿两〇零]{2,})"
                     r"(?:[个次年天岁种位名人家条项倍米公里吨元%％]|分之)")
_TIME = re.compile(r"\d{2,4}\s*年|\d{1,2}\s*月|\d{1,2}\s*日|世纪|年代|[一二三四五六七八九十〇零]{2,4}年|朝|时期|春|秋")
_POS = {"person": ("nr",), "place": ("ns",)}


def expected_kind(question: str) -> str | None:
    """'time' / 'person' / 'place' / 'number', or None for questions of other kinds (什么, 为什么, 如何 …)."""
    for kind, pat in _KINDS:
        if pat.search(question or ""):
            return kind
    return None


def offers(kind: str | None, text: str, question: str, tagged: Callable[[str], list[tuple[str, str]]]) -> bool:
    """Does `text` hold an answer of this kind that the question itself does not contain?"""
    if kind is None:
        return False
    if kind in ("number", "time"):
        pat = _NUMBER if kind == "number" else _TIME
        return any(m.group(0) not in question for m in pat.finditer(text))
    flags = _POS[kind]
    return any(flag.startswith(flags) and len(word) > 1 and word not in question for word, flag in tagged(text))
