"""Which way a question goes before anything is retrieved.

    DIRECT  greetings, thanks, farewells, 「你是谁」-style chit-chat, or the user switched 知识库检索 off:
            no retrieval, a short reply (the LLM, or a fixed text offline), no sources.
    LIGHT   a standalone knowledge question and no reranker: recall + fusion.
    STRONG  plus query rewriting (the question follows earlier turns) and/or the cross-encoder rerank.

Chit-chat is recognised conservatively: the whole message must consist of chit-chat phrases (and particles /
punctuation / emoji). Anything left over — 「你好，请问退货期限是多久？」 leaves 「请问退货期限是多久」 —
is a knowledge question, so a real question is never routed away from the knowledge base.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

DIRECT, LIGHT, STRONG = "DIRECT", "LIGHT", "STRONG"
ROUTE_LABELS = {DIRECT: "直接回复（不检索）", LIGHT: "轻量检索（召回 + 融合）", STRONG: "完整检索（改写 / 精排）"}

# Phrase lexicon by kind (normalised: lower case, no spaces). Longest phrases are tried first.
CHITCHAT: dict[str, tuple[str, ...]] = {
    "greeting": (
        "你好", "您好", "你们好", "大家好", "哈喽", "哈啰", "嗨", "嘿", "hello", "hi", "hey", "早上好", "上午好",
        "中午好", "下午好", "晚上好", "晚安", "早安", "早", "在吗", "在不在", "有人吗", "有人在吗", "在么", "打扰了",
        "打扰一下", "喂", "你好呀", "好久不见", "初次见面", "请多指教", "good morning", "good evening",
    ),
    "thanks": (
        "谢谢", "谢谢你", "谢谢您", "多谢", "感谢", "感谢你", "感谢您", "非常感谢", "十分感谢", "谢了", "谢啦",
        "thanks", "thank you", "thx", "辛苦", "辛苦了", "麻烦你了", "麻烦了", "太感谢了", "谢谢帮忙", "感谢帮助",
    ),
    "farewell": ("再见", "拜拜", "bye", "goodbye", "回头见", "下次见", "明天见", "先这样", "就这样吧", "没事了",
                 "没有了", "没别的了", "不用了"),
    "identity": (
        "你是谁", "你叫什么", "你叫什么名字", "你的名字", "你是什么", "你是机器人吗", "你是人吗", "你是ai吗",
        "你是真人吗", "介绍一下你自己", "介绍下你自己", "自我介绍", "你能做什么", "你会什么", "你会做什么",
        "你有什么功能", "你可以做什么", "你能干什么", "你能帮我做什么", "你是哪个模型", "你用的什么模型",
        "谁开发的你", "谁做的你", "怎么用你", "怎么使用你",
    ),
    "ack": (
        "好的", "好", "好吧", "行", "行吧", "可以", "嗯", "嗯嗯", "哦", "噢", "喔", "ok", "okay", "收到", "知道了",
        "明白了", "明白", "懂了", "了解", "了解了", "没问题", "对", "对的", "是的", "是", "不是", "不对", "不错",
        "很好", "太好了", "真棒", "你真棒", "厉害", "你真厉害", "牛", "赞", "哈哈", "哈哈哈", "呵呵", "嘻嘻",
        "有意思", "有道理", "原来如此", "这样啊", "酷", "棒", "给力", "好厉害", "666",
    ),
}
# Fillers allowed around the phrases: particles, address words, interjections.
_FILLERS = ("啊", "呀", "哇", "呢", "吧", "啦", "哦", "喔", "嘛", "哈", "了", "的", "呐", "哟", "咯", "哒", "嗷",
            "小助手", "助手", "机器人", "朋友", "老师", "同学", "亲", "请问", "那", "那么", "哎", "唉", "诶", "嗯",
            "你", "您", "很", "非常", "真的", "真", "太", "一下", "大家", "各位", "啊啊")
MAX_CHITCHAT_CHARS = 40  # a chit-chat message is short; longer text is never routed away


@dataclass(frozen=True)
class Route:
    route: str
    reason: str
    kind: str | None = None  # chit-chat kind for DIRECT (greeting / thanks / …), "kb_off" when switched off

    @property
    def label(self) -> str:
        return ROUTE_LABELS[self.route]

    def to_dict(self) -> dict:
        return {"route": self.route, "label": self.label, "reason": self.reason, "kind": self.kind}


def _normalise(text: str) -> str:
    t = unicodedata.normalize("NFKC", text or "").lower()
    # drop punctuation, symbols (emoji), whitespace; keep letters/digits of every script
    return "".join(ch for ch in t if unicodedata.category(ch)[0] in "LN")


# lexicon entries go through the same normalisation as messages ("thank you" → "thankyou")
_KIND = {_normalise(p): k for k, ps in CHITCHAT.items() for p in ps}
_PHRASES = sorted(set(_KIND) | {_normalise(f) for f in _FILLERS}, key=len, reverse=True)
_PHRASE_RE = re.compile("|".join(re.escape(p) for p in _PHRASES))


def chitchat_kind(text: str) -> str | None:
    """The chit-chat kind when the whole message is chit-chat, else None."""
    t = _normalise(text)
    if not t:
        # nothing but emoji / symbols (「👍」「🙂🙂」): no question to look up
        return "ack" if (text or "").strip() and not any(c in "?？" for c in text) else None
    if len(t) > MAX_CHITCHAT_CHARS:
        return None
    kinds = [_KIND[m.group(0)] for m in _PHRASE_RE.finditer(t) if m.group(0) in _KIND]
    if not kinds or _PHRASE_RE.sub("", t):
        return None  # no chit-chat phrase, or something else is left: a real question
    # the most telling kind wins: asking who we are > thanks > farewell > greeting > acknowledgement
    for k in ("identity", "thanks", "farewell", "greeting", "ack"):
        if k in kinds:
            return k
    return kinds[0]


class Router:
    """route(question, use_kb, has_history, rerank_available) → Route. Stateless; no model needed."""

    def route(self, question: str, *, use_kb: bool = True, has_history: bool = False,
              rerank_available: bool = False) -> Route:
        if not use_kb:
            return Route(DIRECT, "知识库检索已关闭：直接与大模型对话", "kb_off")
        kind = chitchat_kind(question)
        if kind:
            return Route(DIRECT, f"闲聊（{CHITCHAT_LABELS[kind]}），不检索知识库", kind)
        if has_history or rerank_available:
            why = [w for w, on in (("追问改写", has_history), ("精排", rerank_available)) if on]
            return Route(STRONG, "知识问题：召回 + 融合 + " + " + ".join(why))
        return Route(LIGHT, "知识问题：召回 + 融合（无对话历史，未配置精排模型）")


CHITCHAT_LABELS = {"greeting": "问候", "thanks": "致谢", "farewell": "道别", "identity": "询问身份",
                   "ack": "应答"}
