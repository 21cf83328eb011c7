"""The no-answer gate: answer / weak evidence / refuse, decided on evidence that transfers across knowledge bases.

Inputs (pipeline/retrieval/gate_features.py, measured on this query's retrieval):
  * the best cosine above THIS knowledge base's background (probe questions unrelated to it,
    pipeline/retrieval/gate_background.py), in hundredths of cosine — e5 cosines sit high and shift by domain;
  * lexical evidence: the IDF-weighted share of the question's content words in the best fused top-3 chunk
    times the share of its character bigrams there (both high only when the chunk shares the question's words
    AND their order; each alone is high for generic questions whose common words stand anywhere);
  * route agreement: whether the fused top chunk is in the top-3 of both routes (words and meaning point at the
    same passage — an off-topic question's best cosine and best BM25 hit usually name different chunks);
  * sentence evidence: the question's best cosine against single sentences of the fused top-3 chunks, above the
    probes' own best-sentence median (pipeline/retrieval/sentence_evidence.py). It costs embedding those
    sentences, so it is a second stage: the first three inputs give a quick score, and only a question whose
    quick score lies between `sure_refuse` and `sure_answer` (a quarter to two fifths of answerable questions on the dev
    sets) is scored by the full model with the sentence evidence.
A logistic score decides: ≥ answer_at → answer, ≥ refuse_below → weak evidence (answered, shown with
「资料相关度较低，请核对原文」), else refuse (fixed text, no LLM call). `min_similarity` stays the admin's hard
floor: below it the gate refuses whatever the score. Coefficients and thresholds belong to the embedding model
(its calibration profile, pipeline/calibration, section `gate`: the inputs are on that model's cosine scale); they
are fitted by `python -m tools.eval.calibrate` (tools/eval/calibrate_gate.py) with leave-one-set-out over the dev sets
(docs/retrieval-eval.md).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.retrieval.gate_background import Background
from pipeline.retrieval.gate_features import GateFeatures
from pipeline.retrieval.result import rounded as _r

ANSWER, WEAK, REFUSE = "answer", "weak", "refuse"
WEAK_BANNER = "资料相关度较低，请核对原文"
QUICK_INPUTS = ("similarity_above", "coverage×phrase_coverage", "top_agreement")
INPUTS = ("similarity_above", "sentence_above", "coverage×phrase_coverage", "top_agreement")


@dataclass(frozen=True)
class GateModel:
    """Two logistic scores (logits: p = 1 / (1 + e^−score)) and their thresholds.

    quick = quick_bias + Σ quick_coef·QUICK_INPUTS: below sure_refuse → refuse, at/above sure_answer → answer;
    in between, full = bias + Σ coef·INPUTS (with the sentence evidence) against refuse_below / answer_at. Where
    the sentence evidence cannot be had (no embedding model, a background measured without it) the quick score
    decides against quick_refuse_below / quick_answer_at."""

    coef: tuple[float, ...]
    bias: float
    refuse_below: float
    answer_at: float
    quick_coef: tuple[float, ...]
    quick_bias: float
    quick_refuse_below: float
    quick_answer_at: float
    sure_refuse: float
    sure_answer: float
    similarity: str = "above"  # first input: "above" = 100·(cos − median) (model-scaled) | "z" (scale-free)

    @property
    def two_stage(self) -> bool:
        return bool(self.coef)

    @classmethod
    def from_calibration(cls, g) -> "GateModel":
        """The gate of a calibration profile (its `gate` section). A one-stage gate has no full model and no open
        band: every question reaches the quick thresholds."""
        q = g.quick
        if g.full is None:
            full, band = dict(coef=(), bias=0.0, refuse_below=0.0, answer_at=0.0), (-math.inf, math.inf)
        else:
            full = dict(coef=tuple(g.full.coef), bias=g.full.bias, refuse_below=g.full.refuse_below,
                        answer_at=g.full.answer_at)
            band = (g.band.sure_refuse, g.band.sure_answer)
        return cls(**full, quick_coef=tuple(q.coef), quick_bias=q.bias, quick_refuse_below=q.refuse_below,
                   quick_answer_at=q.answer_at, sure_refuse=band[0], sure_answer=band[1], similarity=g.similarity)

    def quick(self, f: GateFeatures, bg: Background) -> float:
        return self.quick_bias + sum(c * x for c, x in zip(self.quick_coef, quick_inputs(f, bg, self.similarity)))

    def full(self, f: GateFeatures, bg: Background) -> float | None:
        x = gate_inputs(f, bg) if self.two_stage else None
        return None if x is None else self.bias + sum(c * v for c, v in zip(self.coef, x))


def quick_inputs(f: GateFeatures, bg: Background, similarity: str = "above") -> tuple[float, ...]:
    """The quick model's inputs, in QUICK_INPUTS order (the first as a z-score for the scale-free model)."""
    sim = bg.sim_z(f.max_similarity) if similarity == "z" else bg.sim_above(f.max_similarity)
    return (sim, f.coverage * f.phrase_coverage, f.top_agreement)


def gate_inputs(f: GateFeatures, bg: Background) -> tuple[float, ...] | None:
    """The full model's inputs, in INPUTS order (None without the sentence evidence or its background)."""
    sent = None if f.best_sentence is None else bg.sent_above(f.best_sentence)
    if sent is None:
        return None
    return (bg.sim_above(f.max_similarity), sent, f.coverage * f.phrase_coverage, f.top_agreement)


@dataclass(frozen=True)
class GateDecision:
    outcome: str                 # answer | weak | refuse
    reason: str                  # why, in Chinese (shown in 检索过程)
    score: float | None
    features: GateFeatures
    background: Background | None
    min_similarity: float
    stage: str | None = None     # "quick" (decided by the cheap inputs) | "full" (with the sentence evidence)

    @property
    def hit(self) -> bool:
        return self.outcome != REFUSE

    @property
    def weak(self) -> bool:
        return self.outcome == WEAK

    @property
    def confidence(self) -> float | None:
        return None if self.score is None else 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, self.score))))

    def trace(self) -> dict:
        f, bg = self.features, self.background
        return {
            "outcome": self.outcome, "hit": self.hit, "weak": self.weak, "reason": self.reason,
            "max_similarity": _r(f.max_similarity), "min_similarity": self.min_similarity,
            "similarity_z": _r(bg.sim_z(f.max_similarity), 2) if bg else None,
            "similarity_above": _r(bg.sim_above(f.max_similarity), 2) if bg else None,
            "background_median": _r(bg.sim_median) if bg else None,
            # "previous": the knowledge base changed and its background is being measured again; this question
            # used the last one (gate_background.py). None: no background yet (the reason says so).
            "background_state": bg.state if bg else None,
            "best_sentence": _r(f.best_sentence),
            "sentence_above": _r(bg.sent_above(f.best_sentence), 2) if bg and f.best_sentence is not None else None,
            "stage": self.stage,
            "coverage": _r(f.coverage, 3), "phrase_coverage": _r(f.phrase_coverage, 3),
            "agreement": _r(f.agreement, 2), "top_agreement": _r(f.top_agreement, 3), "routes_agree": f.routes_agree,
            "score": _r(self.score, 3), "confidence": _r(self.confidence, 3),
        }


def decide(f: GateFeatures, bg: Background | None, min_similarity: float, has_results: bool = True,
           model: GateModel | None = None, adaptive: bool = True,
           sentence: Callable[[], float | None] | None = None) -> GateDecision:
    """The outcome for these features against this background. `sentence()` measures the sentence evidence; it is
    called only when the quick score leaves the outcome open (the rest of the decision is pure).

    `model`: the embedding model's gate (GateModel.from_calibration); adaptive=False (setting adaptive_gate off):
    the hard floor alone decides, as before the adaptive gate."""
    if not has_results:
        return GateDecision(REFUSE, "知识库中没有可检索的内容", None, f, bg, min_similarity)
    if f.max_similarity < min_similarity:
        return GateDecision(REFUSE, f"最高相似度 {f.max_similarity:.3f} 低于最低相似度 {min_similarity:.2f}",
                            None, f, bg, min_similarity)
    if not adaptive:
        return GateDecision(ANSWER, "最高相似度不低于最低相似度（自适应判定已关闭）", None, f, None, min_similarity)
    if bg is None:  # no background yet (vector route off / nothing measured): the floor alone decides
        return GateDecision(ANSWER, "最高相似度不低于最低相似度（尚无本知识库的背景分布）", None, f, bg,
                            min_similarity)
    if model is None:
        raise ValueError("the adaptive gate needs the gate model of the embedding model's calibration profile")
    q = model.quick(f, bg)
    if q < model.sure_refuse:
        return _by_score(q, math.inf, math.inf, f, bg, min_similarity, "quick")
    if q >= model.sure_answer:
        return _by_score(q, -math.inf, -math.inf, f, bg, min_similarity, "quick")
    if model.two_stage and f.best_sentence is None and sentence is not None and bg.sent_median is not None:
        f = dataclasses.replace(f, best_sentence=sentence())
    full = model.full(f, bg)
    if full is None:  # no sentence evidence to be had: the quick score against its own thresholds
        return _by_score(q, model.quick_refuse_below, model.quick_answer_at, f, bg, min_similarity, "quick")
    return _by_score(full, model.refuse_below, model.answer_at, f, bg, min_similarity, "full")


def _by_score(s: float, refuse_below: float, answer_at: float, f: GateFeatures, bg: Background,
              min_similarity: float, stage: str) -> GateDecision:
    if s < refuse_below:
        outcome, reason = REFUSE, "与本知识库的相关证据不足（相似度接近无关问题的水平，关键词覆盖低）"
    elif s < answer_at:
        outcome, reason = WEAK, WEAK_BANNER
    else:
        outcome, reason = ANSWER, "相关证据充分"
    return GateDecision(outcome, reason, s, f, bg, min_similarity, stage)
