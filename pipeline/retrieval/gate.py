"""The no-answer gate: answer / weak evidence / refuse, decided on evidence that transfers across knowledge bases.

Inputs (pipeline/retrieval/gate_features.py, measured on this query's retrieval):
  * the best cosine as a z-score against THIS knowledge base's background (probe questions unrelated to it,
    pipeline/retrieval/gate_background.py) — e5 cosines sit high and shift by domain, the z-score does not;
  * lexical evidence: the IDF-weighted share of the question's content words in the best fused top-3 chunk
    times the share of its character bigrams there (both high only when the chunk shares the question's words
    AND their order; each alone is high for generic questions whose common words stand anywhere);
  * route agreement: whether the fused top chunk is in the top-3 of both routes (words and meaning point at the
    same passage — an off-topic question's best cosine and best BM25 hit usually name different chunks).
A logistic score of these decides: ≥ answer_at → answer, ≥ refuse_below → weak evidence (answered, shown with
「资料相关度较低，请核对原文」), else refuse (fixed text, no LLM call). `min_similarity` stays the admin's hard
floor: below it the gate refuses whatever the score. Coefficients and thresholds are fitted by
`python -m tools.calibrate_gate` with leave-one-set-out over the dev sets (docs/retrieval-eval.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.retrieval.gate_background import Background
from pipeline.retrieval.gate_features import GateFeatures

ANSWER, WEAK, REFUSE = "answer", "weak", "refuse"
WEAK_BANNER = "资料相关度较低，请核对原文"
INPUTS = ("similarity_z", "coverage×phrase_coverage", "top_agreement")


@dataclass(frozen=True)
class GateModel:
    """score = bias + Σ coef·input; thresholds on the score (a logit: p = 1 / (1 + e^−score))."""

    coef: tuple[float, ...]
    bias: float
    refuse_below: float
    answer_at: float

    def score(self, f: GateFeatures, bg: Background) -> float:
        return self.bias + sum(c * x for c, x in zip(self.coef, gate_inputs(f, bg)))


def gate_inputs(f: GateFeatures, bg: Background) -> tuple[float, ...]:
    """The model's inputs, in INPUTS order."""
    return (bg.sim_z(f.max_similarity), f.coverage * f.phrase_coverage, f.top_agreement)


# Fitted on all five dev sets by tools/calibrate_gate.py (leave-one-set-out numbers in docs/retrieval-eval.md).
SHIPPED = GateModel(coef=(1.1723, 6.4433, 0.8689), bias=-4.4710, refuse_below=-1.1198, answer_at=0.3399)


@dataclass(frozen=True)
class GateDecision:
    outcome: str                 # answer | weak | refuse
    reason: str                  # why, in Chinese (shown in 检索过程)
    score: float | None
    features: GateFeatures
    background: Background | None
    min_similarity: float

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
            "background_median": _r(bg.sim_median) if bg else None,
            "coverage": _r(f.coverage, 3), "phrase_coverage": _r(f.phrase_coverage, 3),
            "agreement": _r(f.agreement, 2), "top_agreement": _r(f.top_agreement, 3), "routes_agree": f.routes_agree,
            "score": _r(self.score, 3), "confidence": _r(self.confidence, 3),
        }


def _r(x, nd: int = 4):
    return None if x is None else round(float(x), nd)


def decide(f: GateFeatures, bg: Background | None, min_similarity: float, has_results: bool = True,
           model: GateModel = SHIPPED, adaptive: bool = True) -> GateDecision:
    """Pure decision (no I/O): the outcome for these features against this background.

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
    s = model.score(f, bg)
    if s < model.refuse_below:
        outcome, reason = REFUSE, "与本知识库的相关证据不足（相似度接近无关问题的水平，关键词覆盖低）"
    elif s < model.answer_at:
        outcome, reason = WEAK, WEAK_BANNER
    else:
        outcome, reason = ANSWER, "相关证据充分"
    return GateDecision(outcome, reason, s, f, bg, min_similarity)
