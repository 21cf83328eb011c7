"""Lexical evidence shared by the no-answer gate, the extractive picker and the citation support check.

`TermWeights` gives every token an IDF from the live BM25 snapshot (the knowledge base's own statistics): a
question word that occurs in few chunks weighs much, one that occurs everywhere weighs little, and a word the
knowledge base has never seen weighs most — "梅西" in a legal corpus is the strongest sign the question is
about something else. `coverage` is the IDF-weighted share of a question's content words present in a text.
"""
from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable

import numpy as np

# Function words and question words that say nothing about the topic.
STOPWORDS = frozenset("""
的 了 是 在 和 与 及 或 吗 呢 吧 啊 呀 么 嘛 也 都 就 还 又 把 被 给 对 从 向 以 为 于 而 并 且 但 等 之 其 这 那 哪
什么 怎么 怎样 怎么样 如何 哪些 哪个 哪里 为什么 为何 多少 几 是否 是不是 有没有 能否 可以 能 会 要 需要 应该 请 请问 问
一下 一个 有 没有 我 你 您 他 她 它 我们 你们 他们 这个 那个 这些 那些 关于 中 里 上 下 吗？ 谁 哪位 何 何时 何地 哪年
哪一年 时候 什么样 啥 咋 多 呢？ 这份 该 此 所 得 地 着 过 来 去 到 说 被称为 称为 叫 叫做 指 主要
""".split())


_WORD = re.compile(r"\w")


def content_terms(tokens: Iterable[str]) -> list[str]:
    """The question's topical words: distinct, in order, stopwords and single ASCII characters dropped."""
    seen: dict[str, None] = {}
    for t in tokens:
        if t in STOPWORDS or (len(t) == 1 and t.isascii()):
            continue
        seen.setdefault(t, None)
    return list(seen)


def content_bigrams(segments: Iterable[str]) -> list[str]:
    """Distinct character bigrams inside runs of consecutive content words ("刘备三顾茅庐" → 刘备, 备三, 三顾 …).

    `segments`: non-overlapping words in text order (ChineseTokenizer.segments). Matching the bigrams is phrase
    evidence: a text that shares the question's words *in order* shares its bigrams.
    """
    runs: list[str] = []
    cur = ""
    for w in segments:
        if w in STOPWORDS or not _WORD.search(w):
            if cur:
                runs.append(cur)
            cur = ""
        else:
            cur += w
    if cur:
        runs.append(cur)
    grams: dict[str, None] = {}
    for r in runs:
        for i in range(len(r) - 1):
            grams.setdefault(r[i:i + 2], None)
    return list(grams)


_QUESTION_WORDS = ("什么", "多少", "谁", "哪", "几", "何时", "怎样", "怎么", "如何", "为什么", "多大", "多长", "多高",
                   "多久", "多远")


def focus_terms(segments: list[str]) -> list[str]:
    """The words the question asks about: the nearest content word on each side of its question word
    (「前鼻丝鳗的体长是多少？」 → 体长; 「王江泾镇内有多少人口？」 → 镇内, 人口). An answer sentence names what was
    asked even when it leaves out the topic (「体长可达46.5公分」)."""
    out: list[str] = []
    for i, w in enumerate(segments):
        if not w.startswith(_QUESTION_WORDS):
            continue
        for side in (range(i - 1, max(i - 4, -1), -1), range(i + 1, min(i + 3, len(segments)))):
            for j in side:
                x = segments[j]
                if not _WORD.search(x):
                    break  # punctuation ends the clause
                if x not in STOPWORDS and len(x) >= 2:
                    if x not in out:
                        out.append(x)
                    break
    return out


class TermWeights:
    """IDF per token from a bm25s index (lucene idf: ln(1 + (N − df + 0.5) / (df + 0.5)))."""

    def __init__(self, vocab: dict[str, int], df: np.ndarray, n_docs: int):
        self.vocab = vocab
        self.df = df
        self.n = max(int(n_docs), 1)
        self.max_idf = self._idf(0)

    def _idf(self, df: int) -> float:
        return math.log(1.0 + (self.n - df + 0.5) / (df + 0.5))

    def df_of(self, token: str) -> int:
        i = self.vocab.get(token)
        return int(self.df[i]) if i is not None and i < len(self.df) else 0

    def idf(self, token: str) -> float:
        return self._idf(self.df_of(token))

    def unseen_share(self, terms: list[str]) -> float:
        """IDF-weighted share of the terms that occur in no chunk at all."""
        w = [self.idf(t) for t in terms]
        total = sum(w)
        return sum(x for t, x in zip(terms, w) if self.df_of(t) == 0) / total if total else 0.0

    def visible_share(self, terms: list[str]) -> float:
        """IDF-weighted share of the terms some chunk holds: what a keyword search can match at all (1.0 with no
        terms: nothing is hidden from it)."""
        return 1.0 - self.unseen_share(terms) if terms else 1.0

    @classmethod
    def uniform(cls) -> "TermWeights":
        """Every token weighs the same (no index yet)."""
        return cls({}, np.zeros(0, dtype=np.int64), 1)


class MergedWeights(TermWeights):
    """The IDF of several knowledge bases' chunks taken together (a question scoped to several of them): a
    token's document frequency is the sum of its frequencies, N the sum of the chunk counts — the statistics
    of the union corpus the question searches, summed per token at question time (a few tokens) instead of
    merging vocabularies."""

    def __init__(self, parts: list[TermWeights]):
        self.parts = parts
        self.n = max(sum(p.n for p in parts), 1)
        self.max_idf = self._idf(0)

    def df_of(self, token: str) -> int:
        return sum(p.df_of(token) for p in self.parts)


def merged_weights(parts: list[TermWeights]) -> TermWeights:
    return parts[0] if len(parts) == 1 else MergedWeights(parts)


def normalize(text: str) -> str:
    """The form tokens are matched in: NFKC, lower case (as ChineseTokenizer produces them)."""
    return unicodedata.normalize("NFKC", text or "").lower()


def coverage(terms: list[str], weights: TermWeights, text: str) -> float:
    """IDF-weighted share of `terms` occurring in `text` (already `normalize`d); 0 when there are no terms.

    Substring matching, not token matching: jieba may cut the same word differently inside a longer text.
    """
    if not terms:
        return 0.0
    w = [weights.idf(t) for t in terms]
    total = sum(w)
    return sum(x for t, x in zip(terms, w) if t in text) / total if total else 0.0
