"""Extractive answers for when no LLM is configured: the best-matching sentences of the top chunks, cited.

Deterministic: sentences are scored by the question's jieba tokens they contain (ChineseTokenizer, the same one
BM25 uses), longer tokens weighing more; ties go to the higher-ranked chunk, then the earlier sentence.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.events import EXTRACTIVE_LABEL
from pipeline.retrieval.nodes import node_text

VERIFIED_LABEL = "未配置大模型，以下为已核实问答"
MAX_CHUNKS = 3          # look at the top-ranked chunks only
MAX_SENTENCES = 3
MAX_SENTENCE_CHARS = 200
MIN_SENTENCE_CHARS = 4

_SENT_SPLIT = re.compile(r"([。！？；!?;]+|\n+)")

# Function words and question words that say nothing about the topic.
STOPWORDS = frozenset("""
的 了 是 在 和 与 及 或 吗 呢 吧 啊 呀 么 嘛 也 都 就 还 又 把 被 给 对 从 向 以 为 于 而 并 且 但 等 之 其 这 那 哪
什么 怎么 怎样 怎么样 如何 哪些 哪个 哪里 为什么 为何 多少 几 是否 是不是 有没有 能否 可以 能 会 要 需要 应该 请 请问 问
一下 一个 有 没有 我 你 您 他 她 它 我们 你们 他们 这个 那个 这些 那些 关于 中 里 上 下 吗？
""".split())

@dataclass(frozen=True)
class Sentence:
    text: str          # without the closing punctuation
    punct: str         # the closing punctuation ("" for a line break)
    source: int        # 1-based material number
    position: int      # index within its chunk


def split_sentences(text: str) -> list[tuple[str, str]]:
    """[(sentence, closing punctuation)] split on 。！？；\\n (and ASCII !?;)."""
    parts = _SENT_SPLIT.split(text or "")
    out: list[tuple[str, str]] = []
    for i in range(0, len(parts), 2):
        body = parts[i].strip()
        sep = parts[i + 1] if i + 1 < len(parts) else ""
        punct = "" if "\n" in sep else sep[:1]
        if body:
            out.append((body, punct))
    return out


def _query_terms(tokens: list[str]) -> set[str]:
    terms = {t for t in tokens if t not in STOPWORDS}
    return terms or set(tokens)


def select_sentences(question: str, nodes: Sequence[Any], tokenizer,
                     max_sentences: int = MAX_SENTENCES) -> list[Sentence]:
    tok = tokenizer
    q_terms = _query_terms(tok(question))
    candidates: list[tuple[tuple, Sentence]] = []
    seen: set[str] = set()
    for rank, nws in enumerate(list(nodes)[:MAX_CHUNKS], start=1):
        for pos, (body, punct) in enumerate(split_sentences(node_text(nws))):
            key = re.sub(r"\s+", "", body)
            if key in seen:  # chunk overlap repeats sentences
                continue
            seen.add(key)
            s_terms = set(tok(body))
            hit = q_terms & s_terms
            weight = sum(len(t) for t in hit)
            short = len(key) < MIN_SENTENCE_CHARS
            # sort key: more matched weight, more distinct terms, not tiny, better chunk, earlier sentence
            sort_key = (-weight, -len(hit), short, rank, pos)
            candidates.append((sort_key, Sentence(body, punct, rank, pos)))
    if not candidates:
        return []
    candidates.sort(key=lambda c: c[0])
    picked = [s for key, s in candidates if key[0] < 0][:max_sentences]
    if not picked:  # nothing overlaps: fall back to the opening sentence of the top chunk
        picked = [min(candidates, key=lambda c: (c[1].source, c[0][2], c[1].position))[1]]
    return picked


def render_sentence(s: Sentence) -> str:
    body = s.text
    if len(body) > MAX_SENTENCE_CHARS:
        body = body[:MAX_SENTENCE_CHARS].rstrip() + "……"
    punct = {"！": "！", "!": "！", "？": "？", "?": "？"}.get(s.punct, "。")
    return f"- {body}[{s.source}]{punct}"


def extractive_deltas(question: str, nodes: Sequence[Any], tokenizer) -> tuple[list[str], set[int]]:
    """The deltas of an extractive answer (label first) and the set of cited material numbers.

    When the best source is a verified Q&A entry, its checked answer is the reply (quoting sentences of it
    would start with its own 「问：」 line)."""
    nodes = list(nodes)
    if nodes and (getattr(nodes[0], "node", nodes[0]).metadata or {}).get("verified"):
        from pipeline.conversation.verified import answer_of

        return [f"{VERIFIED_LABEL}：\n", f"{answer_of(node_text(nodes[0]))}[1]"], {1}
    picked = select_sentences(question, nodes, tokenizer)
    deltas = [f"{EXTRACTIVE_LABEL}：\n"]
    for i, s in enumerate(picked):
        deltas.append(render_sentence(s) + ("\n" if i < len(picked) - 1 else ""))
    return deltas, {s.source for s in picked}
