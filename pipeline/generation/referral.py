"""A sentence that hands its matter to another document: 「对诊疗活动中医疗事故的行政调查处理，依照《医疗事故处理条例》
的相关规定执行。」 When that is the best sentence of an extractive answer and the knowledge base does not hold the
named document, the rule asked about is in a document the user has not uploaded: quoting the pointer as if it were
the answer would be answering from the neighbouring rule. The answer says where the rule is instead (and is weak).

Only a sentence that *ends* in the hand-over counts: 「依照《…》第三十条规定的程序，由…负责」 answers a who-question
itself and names the law only as its ground.
"""
from __future__ import annotations

import re

# 「…依照《X》的相关规定执行。」「…按照《X》的有关规定处理」「…适用《X》」: the hand-over closes the sentence
_HANDED_OVER = re.compile(r"(?:依照|按照|根据|参照|适用)《([^《》]{2,40})》(?:的)?(?:有关|相关)?(?:规定)?"
                          r"(?:予以|给予)?(?:执行|处理|办理|处罚|处分|实施)?[。；;.]?\s*$")
_STATE_PREFIX = re.compile(r"^中华人民共和国")


def handed_over_to(sentence: str) -> str | None:
    """The title of the document `sentence` hands its matter to, or None."""
    m = _HANDED_OVER.search((sentence or "").strip())
    return m.group(1) if m else None


def title_key(title: str) -> str:
    """What a file name holding the document must contain: 《中华人民共和国劳动合同法》 is uploaded as
    「劳动合同法.pdf」 as often as under its full name."""
    return _STATE_PREFIX.sub("", title.strip()) or title.strip()
