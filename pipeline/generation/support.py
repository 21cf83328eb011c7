"""Citation support check: after an LLM answer, is each sentence's [n] backed by source n?

Every answer sentence that carries citations is a claim (its text without the brackets). Its support by a source
is     w_cos · cos(claim, source) + w_cov · coverage + w_phrase · phrase coverage
(cos: the claim embedded as a query against the source's stored vector; coverage / phrase: the claim's content
words and character bigrams found in the source text, as in the gate), taken above this knowledge base's
background (− w_cos × the median best cosine of the gate's probe questions: e5 cosines shift by domain).
A citation [n] is unsupported when the support by n is below `floor` while another source supports the claim by
at least `margin` more — the model cited the wrong material — or when it is below `hard_floor` however the others
score (nothing backs it).
The weights and thresholds belong to the embedding model (its calibration profile, pipeline/calibration, section
`support`); fitted by `python -m tools.eval.calibrate` (tools/eval/calibrate_support.py, leave-one-set-out;
docs/retrieval-eval.md).
The engine reports the result per source (`sources[i].support`), per sentence (`done.support`) and as a count
in the trace (检索过程).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.models.vectors import unit
from pipeline.retrieval.lexical import TermWeights, content_bigrams, content_terms, coverage, normalize
from pipeline.retrieval.nodes import kb_ids_of, node_text

_CITES = re.compile(r"\[(\d{1,3})\]")
_SENT = re.compile(r"[^。！？!?\n]+(?:[。！？!?]+|\n|$)")
_CLAIM_MIN_CHARS = 4


@dataclass(frozen=True)
class SupportParams:
    w_cos: float
    w_cov: float
    w_phrase: float
    floor: float        # below this, a better-supported other source makes the citation unsupported
    margin: float
    hard_floor: float   # below this the citation is unsupported on its own

    @classmethod
    def from_calibration(cls, section) -> "SupportParams":
        """The check of a calibration profile (its `support` section)."""
        return cls(**section.params())


@dataclass(frozen=True)
class SentenceSupport:
    text: str
    cited: list[int]
    scores: dict[int, float]     # support of the claim by every source
    unsupported: list[int]       # cited numbers that do not back the claim
    better: int | None           # the source that supports it best, when that is not a cited one

    def to_dict(self) -> dict:
        return {"text": self.text, "cited": self.cited,
                "scores": {str(k): round(v, 3) for k, v in self.scores.items()},
                "supported": not self.unsupported, "unsupported": self.unsupported, "better_source": self.better}


@dataclass(frozen=True)
class SupportReport:
    sentences: list[SentenceSupport]

    @property
    def checked(self) -> int:
        return sum(len(s.cited) for s in self.sentences)

    @property
    def unsupported(self) -> int:
        return sum(len(s.unsupported) for s in self.sentences)

    def per_source(self) -> dict[int, dict]:
        """source no → {score: best support among the sentences citing it, supported: all of them back}"""
        out: dict[int, dict] = {}
        for s in self.sentences:
            for n in s.cited:
                d = out.setdefault(n, {"score": s.scores.get(n, 0.0), "supported": True, "sentences": 0})
                d["score"] = max(d["score"], s.scores.get(n, 0.0))
                d["supported"] = d["supported"] and n not in s.unsupported
                d["sentences"] += 1
        return {n: d | {"score": round(d["score"], 3)} for n, d in out.items()}

    def summary(self) -> dict:
        return {"checked": self.checked, "unsupported": self.unsupported}


def claims(answer: str) -> list[tuple[str, list[int]]]:
    """(claim text without citations, cited numbers in order) for every answer sentence that cites."""
    out: list[tuple[str, list[int]]] = []
    prev: tuple[str, list[int]] | None = None
    for m in _SENT.finditer(answer or ""):
        sent = m.group(0)
        nums: list[int] = []
        for c in _CITES.findall(sent):
            if int(c) not in nums:
                nums.append(int(c))
        text = _CITES.sub("", sent).strip(" \n-*•")
        if not re.sub(r"\W", "", text) and nums and prev is not None:
            # 「……。[2]」: citations written after the full stop belong to the sentence before
            prev[1].extend(n for n in nums if n not in prev[1])
            if prev not in out:
                out.append(prev)
            continue
        prev = (text, nums) if len(re.sub(r"\W", "", text)) >= _CLAIM_MIN_CHARS else None
        if prev is not None and nums:
            out.append(prev)
    return out


class SupportChecker:
    """`source_vectors(nodes)` gives the stored embedding of each source (None → embed the texts);
    `weights_of(kb_ids)` / `background(kb_ids)`: the IDF table and the gate's background of the knowledge bases
    the sources come from (a None background: scores taken as they are); `params`: the embedding model's
    (SupportParams.from_calibration of its profile)."""

    def __init__(self, embed_model: Any, tokenizer: Any,
                 weights_of: Callable[[Sequence[int]], TermWeights] = lambda kb_ids: TermWeights.uniform(),
                 source_vectors: Callable[[Sequence[Any]], list | None] | None = None, *,
                 params: SupportParams, background: Callable[[Sequence[int]], Any] = lambda kb_ids: None):
        self.background = background
        self.embed_model = embed_model
        self.tokenizer = tokenizer
        self.weights_of = weights_of
        self.source_vectors = source_vectors
        self.params = params

    def scores(self, claim: str, texts: list[str], vectors: np.ndarray,
               kb_ids: Sequence[int] = ()) -> dict[int, float]:
        p = self.params
        terms = content_terms(self.tokenizer(claim))
        grams = content_bigrams(self.tokenizer.segments(claim))
        weights = self.weights_of(kb_ids)
        cos = vectors @ unit(self.embed_model.get_query_embedding(claim))
        bg = self.background(kb_ids)
        offset = p.w_cos * bg.sim_median if bg is not None else 0.0
        out = {}
        for i, t in enumerate(texts, start=1):
            phrase = sum(g in t for g in grams) / len(grams) if grams else 0.0
            out[i] = (p.w_cos * float(cos[i - 1]) - offset + p.w_cov * coverage(terms, weights, t)
                      + p.w_phrase * phrase)
        return out

    def judge(self, scores: dict[int, float], cited: list[int]) -> tuple[list[int], int | None]:
        """Pure: (unsupported cited numbers, the better source when it is not cited)."""
        p = self.params
        best = max(scores, key=lambda n: (scores[n], -n)) if scores else None
        bad = []
        for n in cited:
            s = scores.get(n)
            if s is None:
                continue
            # a co-cited source that backs the claim makes a citation of one that does not no better
            other = max((v for m, v in scores.items() if m != n), default=float("-inf"))
            if s < p.hard_floor or (s < p.floor and other - s >= p.margin):
                bad.append(n)
        return bad, (best if best is not None and best not in cited else None)

    def check(self, answer: str, nodes: Sequence[Any]) -> SupportReport:
        nodes = list(nodes)
        found = claims(answer)
        if not found or not nodes:
            return SupportReport([])
        texts = [normalize(node_text(n)) for n in nodes]
        vecs = self.source_vectors(nodes) if self.source_vectors else None
        if vecs is None or any(v is None for v in vecs):
            vecs = self.embed_model.get_text_embedding_batch([node_text(n) for n in nodes])
        vectors = unit(vecs)
        out = []
        for text, cited in found:
            cited = [n for n in cited if 1 <= n <= len(nodes)]
            if not cited:
                continue
            sc = self.scores(text, texts, vectors, kb_ids_of(nodes))
            bad, better = self.judge(sc, cited)
            out.append(SentenceSupport(text, cited, sc, bad, better))
        return SupportReport(out)
