"""The schema of a calibration profile: every number of the retrieval and answer path that was fitted on data.

One profile per embedding model (pipeline/calibration/<model-slug>.json, loaded by pipeline.calibration.store),
because most of these numbers read cosines, and every embedding model has its own cosine scale: e5 puts unrelated
passages near 0.8, bge-small-zh near 0.3. Structural constants — how many chunks a feature looks at, how many
sentences an answer quotes — stay in the code that defines the feature; a number chosen by looking at dev-set
results is here, with where it came from (`Provenance`).

Sections (each a consumer's constructor argument, handed over by pipeline.components.load_models):
  fusion        pipeline/retrieval/fusion.py — the per-query BM25 share α (logistic model per normalisation), the
                fragment prior, and the adaptive-RRF weight rule of fusion_mode=rrf;
  gate          pipeline/retrieval/gate.py — the quick and the full logistic model, their thresholds, the open band;
  floor         the default of the min_similarity setting (the admin's hard floor under the gate);
  extractive    pipeline/generation/extractive.py — the sentence picker's weights and its 「未找到」 threshold;
  support       pipeline/generation/support.py — the citation check's weights and thresholds.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Norm = Literal["minmax", "zscore"]
NORMS: tuple[Norm, ...] = ("minmax", "zscore")
Metric = float | int | str | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Provenance(_Strict):
    """Where a section's numbers came from. Only what was recorded: None where it was not."""

    fitted_for: str | None = Field(
        description="the embedding model id the numbers were fitted with (None: not fitted on data, e.g. the SRS's "
                    "default)")
    dev_sets: list[str] = Field(
        default_factory=list,
        description="the dev sets the shipped numbers were fitted on (the left-out metrics come from fits on all "
                    "of them but one)")
    command: str | None = Field(None, description="the command that fitted them")
    date: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$", description="the day of the fit (YYYY-MM-DD)")
    commit: str | None = Field(None, description="the git commit that shipped these numbers (None: not committed yet)")
    left_out: dict[str, dict[str, Metric]] = Field(
        default_factory=dict,
        description="per left-out set, its metrics under the fit on the other sets (leave-one-set-out); empty when "
                    "none were recorded")
    notes: str | None = Field(None, description="anything a reader of the numbers must know")


# ------------------------------------------------------------------------------------------------ fusion
class LengthPrior(_Strict):
    """fused += beta · min(1, log(1 + len) / log(1 + cap)) (fusion.length_prior); beta 0: no prior."""

    cap: int = Field(ge=0, le=100_000, description="characters from which a first chunk counts as full length")
    beta: float = Field(ge=0, le=10, description="weight of the fragment prior in the convex score; 0: off")


class AdaptiveRRF(_Strict):
    """fusion_mode=rrf with bm25_adaptive: w_bm25 = clamp((s1 / s2 − 1) · slope, floor, bm25_weight)."""

    slope: float = Field(gt=0, le=100, description="BM25 weight per unit of BM25's top-1/top-2 score ratio above 1")
    floor: float = Field(ge=0, le=1, description="the lowest BM25 weight the ratio can give")
    provenance: Provenance


class FusionCalibration(_Strict):
    alpha_model: dict[Norm, dict[str, float]] = Field(
        description="per normalisation, the logistic α = lo + (hi − lo) · σ(bias + Σ c_f · f) over "
                    "fusion.AUTO_FEATURES: feature name → coefficient, plus 'bias' (and optionally 'lo', 'hi'); "
                    "a constant share α is {'bias': ln(α / (1 − α))}")
    length_prior: dict[Norm, LengthPrior] = Field(description="per normalisation, the fragment prior (cap, beta)")
    adaptive_rrf: AdaptiveRRF
    provenance: Provenance = Field(description="of alpha_model and length_prior (fitted together)")

    @field_validator("alpha_model", "length_prior")
    @classmethod
    def _every_norm(cls, v: dict) -> dict:
        missing = [n for n in NORMS if n not in v]
        if missing:
            raise ValueError(f"missing normalisation(s) {', '.join(missing)}")
        return v

    @field_validator("alpha_model")
    @classmethod
    def _has_bias(cls, v: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for norm, coefs in v.items():
            if "bias" not in coefs:
                raise ValueError(f"alpha_model.{norm} has no 'bias'")
        return v


# ------------------------------------------------------------------------------------------------ gate
class GateStage(_Strict):
    """score = bias + Σ coef · inputs; below refuse_below → refuse, below answer_at → weak, else answer."""

    coef: tuple[float, ...] = Field(description="one coefficient per input, in gate.QUICK_INPUTS / gate.INPUTS order")
    bias: float
    refuse_below: float = Field(description="logit below which the question is refused")
    answer_at: float = Field(description="logit from which it is answered without the weak banner")

    @model_validator(mode="after")
    def _ordered(self) -> "GateStage":
        if self.answer_at < self.refuse_below:
            raise ValueError(f"answer_at {self.answer_at} < refuse_below {self.refuse_below}")
        return self


class QuickBand(_Strict):
    """The quick score's open band [sure_refuse, sure_answer): only there the full model (sentence evidence) runs."""

    sure_refuse: float = Field(description="quick logit below which a question is refused at once")
    sure_answer: float = Field(description="quick logit from which it is answered at once")

    @model_validator(mode="after")
    def _ordered(self) -> "QuickBand":
        if self.sure_answer < self.sure_refuse:
            raise ValueError(f"sure_answer {self.sure_answer} < sure_refuse {self.sure_refuse}")
        return self


class GateCalibration(_Strict):
    similarity: Literal["above", "z"] = Field(
        description="the quick model's cosine input: 'above' = 100 · (cos − background median), on the model's "
                    "cosine scale; 'z' = (cos − median) / MAD scale, scale-free")
    quick: GateStage = Field(description="the three cheap inputs (gate.QUICK_INPUTS)")
    full: GateStage | None = Field(
        description="the four inputs with the sentence evidence (gate.INPUTS); None: one stage, the quick model "
                    "decides alone and no sentence is embedded")
    band: QuickBand | None = Field(description="the open band of a two-stage gate; None with a one-stage gate")
    provenance: Provenance

    @model_validator(mode="after")
    def _stages(self) -> "GateCalibration":
        if len(self.quick.coef) != 3:
            raise ValueError(f"quick.coef needs 3 coefficients, has {len(self.quick.coef)}")
        if self.full is not None and len(self.full.coef) != 4:
            raise ValueError(f"full.coef needs 4 coefficients, has {len(self.full.coef)}")
        if (self.full is None) != (self.band is None):
            raise ValueError("a two-stage gate needs both 'full' and 'band'; a one-stage gate neither")
        if self.full is not None and self.similarity != "above":
            raise ValueError("the two-stage gate reads raw differences ('above')")
        return self


class FloorCalibration(_Strict):
    min_similarity: float = Field(
        ge=0, le=1, description="default of the min_similarity setting: below this best cosine the gate refuses")
    provenance: Provenance


# ------------------------------------------------------------------------------------------------ answers
class ExtractiveCalibration(_Strict):
    """pipeline.generation.extractive.PickerParams."""

    w_cos: float = Field(ge=0, le=100, description="weight of the sentence's cosine to the question")
    w_cov: float = Field(ge=0, le=100, description="weight of the IDF coverage of the question's content words")
    w_phrase: float = Field(ge=0, le=100, description="weight of the question's bigram coverage")
    w_rank: float = Field(ge=0, le=100, description="cost per source rank below the first")
    margin: float = Field(ge=0, le=100, description="further sentences must score within this of the best")
    not_found_below: float = Field(
        ge=-1000, le=1000, description="best score − w_cos · background median below this → 「资料中未找到…」")
    w_context: float = Field(ge=0, le=100, description="weight of the question words established earlier in the section")
    w_focus: float = Field(ge=0, le=100, description="weight of naming what the question asks about")
    w_fpart: float = Field(ge=0, le=100, description="weight of the partial focus")
    w_type: float = Field(ge=0, le=100, description="weight of holding an answer of the kind asked")
    provenance: Provenance

    def params(self) -> dict[str, float]:
        return self.model_dump(exclude={"provenance"})


class SupportCalibration(_Strict):
    """pipeline.generation.support.SupportParams."""

    w_cos: float = Field(ge=0, le=100, description="weight of cos(claim, source)")
    w_cov: float = Field(ge=0, le=100, description="weight of the claim's IDF coverage in the source")
    w_phrase: float = Field(ge=0, le=100, description="weight of the claim's bigram coverage in the source")
    floor: float = Field(ge=-1000, le=1000, description="below this, a better-supported other source makes the "
                                                        "citation unsupported")
    margin: float = Field(ge=0, le=100, description="how much better the other source must be")
    hard_floor: float = Field(ge=-1000, le=1000, description="below this the citation is unsupported on its own")
    provenance: Provenance

    def params(self) -> dict[str, float]:
        return self.model_dump(exclude={"provenance"})


# ------------------------------------------------------------------------------------------------ profile
class CalibrationProfile(_Strict):
    schema_version: Literal[1] = Field(1, description="format version of this file")
    embedding_model: str | None = Field(
        description="the embedding model id this profile belongs to (pipeline.models.paths: 'packaged:…' or "
                    "'local:<folder name>'); None for the generic profile")
    embedding_dim: int | None = Field(None, ge=1, le=65_536,
                                      description="that model's vector size (a folder of another model with the "
                                                  "same name does not match); None: not checked")
    about: str = Field("", description="what this profile is, in a sentence")
    fusion: FusionCalibration
    gate: GateCalibration
    floor: FloorCalibration
    extractive: ExtractiveCalibration
    support: SupportCalibration
