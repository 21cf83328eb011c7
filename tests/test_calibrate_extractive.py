"""tools/eval/calibrate_extractive's leave-one-family-out and the formal family's dump rules
(tools/eval/extractive_dataset), on tiny synthetic candidate arrays: no model, no knowledge base."""
from __future__ import annotations

import numpy as np

from pipeline.generation.extractive import PickerParams
from tools.eval import calibrate_extractive as cx
from tools.eval.extractive_dataset import _plan, formal_chunk_holds, formal_sentence_holds

WEIGHTS = PickerParams(w_cos=10.0, w_cov=0.0, w_phrase=0.0, w_rank=0.0, margin=0.5, not_found_below=0.0,
                       w_context=0.0, w_focus=0.0, w_fpart=0.0, w_type=0.0)


def _set(name: str, cos_answerable: np.ndarray, cos_other: np.ndarray, bg: float) -> cx.SetData:
    """One candidate per question, holding the answer for every answerable question."""
    n = len(cos_answerable) + len(cos_other)
    kind = np.r_[np.ones(len(cos_answerable), bool), np.zeros(len(cos_other), bool)]
    f = {k: np.zeros((n, 1)) for k in cx.FEATURES}
    f["cos"][:, 0] = np.r_[cos_answerable, cos_other]
    return cx.SetData(name, kind, kind.copy(), np.ones((n, 1), bool), f, np.ones((n, 1)), np.zeros((n, 1)),
                      kind[:, None].copy(), np.full(n, bg))


def _sets() -> dict[str, cx.SetData]:
    rnd = np.random.default_rng(3)
    return {"xquad_zh": _set("xquad_zh", rnd.uniform(0.90, 0.95, 50), rnd.uniform(0.80, 0.86, 20), 0.85),
            "dureader_dev": _set("dureader_dev", rnd.uniform(0.88, 0.93, 50), rnd.uniform(0.80, 0.86, 20), 0.86),
            "regulations": _set("regulations", rnd.uniform(0.85, 0.90, 50), rnd.uniform(0.83, 0.88, 20), 0.84)}


def _floor(d: cx.SetData) -> float:
    above = 10 * d.f["cos"][d.kind, 0] - 10 * d.bg_median[d.kind]
    return float(np.quantile(above, cx.NOT_FOUND_QUANTILE))


def test_the_floor_is_the_lowest_training_quantile_above_each_sets_background():
    sets = _sets()
    p = cx.fit_floor([sets["xquad_zh"], sets["dureader_dev"]], WEIGHTS)
    assert p.not_found_below == min(_floor(sets["xquad_zh"]), _floor(sets["dureader_dev"]))
    assert p.w_cos == WEIGHTS.w_cos and p.margin == WEIGHTS.margin  # only the floor is fitted
    m = cx.metrics(sets["xquad_zh"], p)
    assert m["not_found_answerable"] <= cx.NOT_FOUND_QUANTILE + 1e-9


def test_leave_one_family_out_never_fits_on_the_family_it_scores():
    assert cx.family_of("cmrc_dev_news") == "encyclopedic" and cx.family_of("dureader_train") == "web"
    assert cx.family_of("regulations") == "formal" and cx.family_of("someone_elses") == "someone_elses"
    sets = _sets()
    lofo = cx.leave_one_family_out(sets, WEIGHTS)
    assert set(lofo) == {"encyclopedic", "web", "formal"}
    formal = lofo["formal"]
    assert formal["trained_on"] == ["xquad_zh", "dureader_dev"] and set(formal["sets"]) == {"regulations"}
    assert formal["params"]["not_found_below"] == min(_floor(sets["xquad_zh"]), _floor(sets["dureader_dev"]))
    assert lofo["web"]["params"]["not_found_below"] == min(_floor(sets["xquad_zh"]), _floor(sets["regulations"]))
    # the formal family's answers score lower above its background: a floor fitted without it refuses more of them
    assert formal["sets"]["regulations"]["not_found_answerable"] > cx.NOT_FOUND_QUANTILE
    # without fixed weights the grid is fitted too (on the other families only)
    full = cx.leave_one_family_out(sets)
    assert full["formal"]["trained_on"] == ["xquad_zh", "dureader_dev"]


def test_the_formal_family_is_dumped_with_its_own_questions_and_formal_evals_rules():
    ds, plan, holds, holds_chunk = _plan("regulations", 240)
    assert ds.name == "regulations" and [k for k, _ in plan] == ["answerable", "unanswerable"]
    answerable, unanswerable = (qs for _, qs in plan)
    assert len(answerable) >= 100 and len(unanswerable) >= 20 and all(a == [] for _, a in unanswerable)
    span = "经营者应当在收到申请之日起三十日内作出决定"
    assert holds("第十条　经营者应当在收到申请之日起三十日内作出决定。", [span], [])
    assert holds("经营者应当在收到申请之日起三十日内，", [span], [])  # ≥ 60% of the span in one run
    assert not holds("收到申请之日起三十日内", [span], [])
    assert holds_chunk("第十条　经营者应当在收到申请之日起\n三十日内作出决定。", [span], [])
    assert formal_sentence_holds is holds and formal_chunk_holds is holds_chunk


def test_run_decides_not_found_and_loose_as_the_picker_does():
    """The calibration's vectorised rule and ExtractivePicker.select agree on the floor read over the visible
    words: below it on every word but above it on the visible ones is a (loose) answer, below both not found."""
    from dataclasses import replace

    from pipeline.generation.candidates import Candidate
    from pipeline.generation.extractive import ExtractivePicker
    from pipeline.generation.sentences import Piece
    from pipeline.models.tokenize_zh import ChineseTokenizer

    p = replace(WEIGHTS, w_cov=2.0, w_context=2.0, not_found_below=0.8)
    picker = ExtractivePicker(ChineseTokenizer())
    picker.params = p
    rows = [(0.84, 0.15, 0.0, 0.4), (0.84, 0.15, 0.0, 1.0), (0.80, 0.0, 0.0, 0.4), (0.86, 0.3, 0.1, 0.5),
            (0.80, 0.1, 0.2, 0.3)]  # (cosine, coverage, context, visible) of each question's one candidate
    n = len(rows)
    f = {k: np.zeros((n, 1)) for k in cx.FEATURES}
    for i, (cos, cov, ctx, _) in enumerate(rows):
        f["cos"][i, 0], f["coverage"][i, 0], f["context"][i, 0] = cos, cov, ctx
    d = cx.SetData("t", np.ones(n, bool), np.ones(n, bool), np.ones((n, 1), bool), f, np.ones((n, 1)),
                   np.zeros((n, 1)), np.ones((n, 1), bool), np.full(n, 0.8), np.array([r[3] for r in rows]))
    r = cx.run(d, p)
    picks = [picker.select([Candidate(Piece("第一条", "。", 0), 1, cov, 0.0, cosine=cos, context=ctx)], 6, 0.8,
                           visible=v) for cos, cov, ctx, v in rows]
    assert list(r["found"]) == [x.found for x in picks] == [True, False, False, True, True]
    assert list(r["loose"]) == [x.found and x.loose for x in picks] == [True, False, False, False, True]
    assert cx.metrics(d, p)["loose_answerable"] == 0.4
