"""The one Chinese tokenizer used at index time and at query time (BM25, extractive answers).

jieba search mode (better recall than lcut: 天气 is found inside 今天天气), lower-cased, punctuation and
whitespace dropped. Identifiers such as `PPR-9087`, `v1.2.3`, `API_KEY`, `GB/T 7714-2015` are protected
before jieba sees them, so they stay whole tokens. A user dictionary is loaded per tokenizer instance.
"""
from __future__ import annotations

import logging
import re
import threading
import unicodedata
from pathlib import Path

import jieba

jieba.setLogLevel(logging.WARNING)

# An identifier: ASCII letters/digits joined by - _ . / (at least one joiner or a digit+letter mix),
# optionally "GB/T 7714-2015"-style with one inner space between a code and a number.
_IDENT = re.compile(
    r"(?:[A-Za-z]+/[A-Za-z]+\s?\d[\w.\-]*)"          # GB/T 7714-2015, ISO/IEC 27001
    r"|(?:[A-Za-z0-9]+(?:[-_./][A-Za-z0-9]+)+)"       # PPR-9087, v1.2.3, API_KEY, a.b.c
)
_WORD = re.compile(r"\w", re.UNICODE)

_init_lock = threading.Lock()


class ChineseTokenizer:
    """Callable: text → list of tokens. Stateless apart from its jieba instance (thread-safe after init)."""

    def __init__(self, user_dict: Path | None = None):
        self._jieba = jieba.Tokenizer()
        self._pos = None  # jieba.posseg over the same dictionary, built on first use
        self.user_dict = user_dict if user_dict and Path(user_dict).is_file() else None
        with _init_lock:
            self._jieba.initialize()
            if self.user_dict:
                self._jieba.load_userdict(str(self.user_dict))

    def __call__(self, text: str) -> list[str]:
        return self.tokenize(text)

    def tokenize(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFKC", text or "").lower()
        tokens: list[str] = []
        pos = 0
        for m in _IDENT.finditer(text):
            tokens.extend(self._plain(text[pos:m.start()]))
            ident = re.sub(r"\s+", " ", m.group(0))
            tokens.append(ident)
            pos = m.end()
        tokens.extend(self._plain(text[pos:]))
        return tokens

    def segments(self, text: str) -> list[str]:
        """Non-overlapping words in text order (jieba's precise mode), normalised like `tokenize`; punctuation
        and whitespace are kept as their own segments, so runs of words can be told apart."""
        text = unicodedata.normalize("NFKC", text or "").lower()
        return [w for w in self._jieba.lcut(text) if w.strip()]

    def tagged(self, text: str) -> list[tuple[str, str]]:
        """(word, part of speech) pairs, jieba.posseg over this tokenizer's dictionary (nr person, ns place, m
        numeral, t time …); for a few answer candidates, not for indexing. Names the dictionary lacks go through
        the HMM search (pipeline/models/pos_viterbi.py: jieba's search on numpy, same tags, ~30× faster)."""
        pos = self._pos or self.warm_tags()
        return [(w.word, w.flag) for w in pos.lcut(unicodedata.normalize("NFKC", text or ""))]

    def warm_tags(self):
        """Ready the part-of-speech tagger (the engine calls it while loading, so no question pays for it).
        Importing jieba.posseg reads the main dictionary's tags once per process (~0.7 s of pure Python, holding
        the GIL: every other thread stalled behind the first question that needed it); each tokenizer then takes
        a copy of that table instead of reading the dictionary file again (POSTokenizer's own constructor would,
        ~0.6 s more). A copy, because the tagger adds the user dictionary's words to its table."""
        with _init_lock:
            if self._pos is None:
                import jieba.posseg as pseg

                from pipeline.models.pos_viterbi import pos_tokenizer

                # dt: the module's tagger over the same main dictionary
                self._pos = pos_tokenizer(self._jieba, dict(pseg.dt.word_tag_tab))
            return self._pos

    def _plain(self, text: str) -> list[str]:
        if not text.strip():
            return []
        out = []
        for tok in self._jieba.cut_for_search(text):
            tok = tok.strip()
            if tok and _WORD.search(tok):  # drop punctuation/whitespace-only tokens
                out.append(tok)
        return out
