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
floor: below it the gate refuses whatever the score. Coefficients and thresholds are fitted by
`python -m tools.eval.calibrate_gate` with leave-one-set-out over the dev sets (docs/retrieval-eval.md).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.models.paths import PACKAGED_MODEL_ID
from pipeline.retrieval.gate_background import Background
from pipeline.retrieval.gate_features import GateFeatures

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


# Fitted on all five dev sets by tools/eval/calibrate_gate.py (leave-one-set-out numbers in docs/retrieval-eval.md)
# with the packaged multilingual-e5-small: its inputs are differences on that model's cosine scale.
SHIPPED = GateModel(coef=(0.4365, 0.5646, 5.5302, 0.5993), bias=-4.7288, refuse_below=-0.8430, answer_at=0.5940,
                    quick_coef=(0.9070, 6.2739, 0.8730), quick_bias=-4.5196, quick_refuse_below=-1.2388,
                    quick_answer_at=0.3328, sure_refuse=-2.9453, sure_answer=3.7498)
SHIPPED_FOR = PACKAGED_MODEL_ID
# Any other embedding model: the session-2 model, one stage, its cosine input a z-score against the KB's probes
# (scale-free, so it carries over to another model's cosine range better than a difference fitted on e5's).
SCALE_FREE = GateModel(coef=(), bias=0.0, refuse_below=0.0, answer_at=0.0,
                       quick_coef=(1.1723, 6.4433, 0.8689), quick_bias=-4.4710, quick_refuse_below=-1.1198,
                       quick_answer_at=0.3399, sure_refuse=-math.inf, sure_answer=math.inf, similarity="z")


def model_for(embedding_model: str | None) -> GateModel:
    """The gate model fitted for this embedding model (None: the packaged one), else the scale-free one."""
    return SHIPPED if embedding_model in (None, SHIPPED_FOR) else SCALE_FREE


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
            "best_sentence": _r(f.best_sentence),
            "sentence_above": _r(bg.sent_above(f.best_sentence), 2) if bg and f.best_sentence is not None else None,
            "stage": self.stage,
            "coverage": _r(f.coverage, 3), "phrase_coverage": _r(f.phrase_coverage, 3),
            "agreement": _r(f.agreement, 2), "top_agreement": _r(f.top_agreement, 3), "routes_agree": f.routes_agree,
            "score": _r(self.score, 3), "confidence": _r(self.confidence, 3),
        }


def _r(x, nd: int = 4):
    return None if x is None else round(float(x), nd)


def decide(f: GateFeatures, bg: Background | None, min_similarity: float, has_results: bool = True,
           model: GateModel = SHIPPED, adaptive: bool = True,
           sentence: Callable[[], float | None] | None = None) -> GateDecision:
    """The outcome for these features against this background. `sentence()` measures the sentence evidence; it is
    called only when the quick score leaves the outcome open (the rest of the decision is pure).

    adaptive=False (setting adaptive_gate off): the hard floor alone decides, as before the adaptive gate."""
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
