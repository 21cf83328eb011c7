"""The vocabulary-gap study's arithmetic (tools/eval/prf_study.py) against the code it stands in for: its
vectorised α-grid ranks equal fusion_cv's, its weighted BM25 equals the segment view's scores, and RM3 at λ = 1
is the question as asked."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from pipeline.retrieval.bm25 import SegmentView
from pipeline.retrieval.bm25_segments import Segment
from tools.eval import fusion_cv, prf_study
from tools.eval.fusion_cv import Q

DOCS = [["钱", "人民币", "残缺", "兑换"], ["人民币", "污损", "兑换", "银行"], ["期货", "手续费", "银行"],
        ["结婚", "登记", "机关"], ["残缺", "人民币", "人民币", "兑换", "手续费"]]


def _view() -> SegmentView:
    seg = Segment.build("t", enumerate(DOCS, start=1))
    return SegmentView((seg,), (np.ones(seg.size, dtype=bool),), 1.5, 0.75)


def test_weighted_scores_equal_the_views_scores_for_counted_tokens():
    view = _view()
    tokens = ["人民币", "兑换", "人民币", "银行"]
    got = prf_study.weighted_scores(view, prf_study.original_weights(tokens))
    assert np.allclose(got, view.scores(tokens), atol=1e-5)


def test_grid_ranks_equal_fusion_cv():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(3, 25))
        hit = rng.random(n) < 0.2
        q = Q(np.arange(100, 100 + n, dtype=np.int64), rng.permutation(n).astype(float) + 1, np.full(n, math.inf),
              np.round(rng.random(n), 1), np.round(rng.random(n), 1), hit, {},
              np.where(rng.random(n) < 0.3, math.inf, rng.integers(10, 400, n)).astype(float))
        for prior in ((0, 0.0), (200, 0.7)):
            assert np.array_equal(prf_study.grid_ranks(q, prior), fusion_cv.alpha_grid_rr(q, "minmax", None, prior))


def test_rm3_keeps_the_question_at_lambda_one_and_adds_feedback_terms_below_it():
    view = _view()
    d = prf_study.SetData("t", view.chunk_ids, np.zeros(len(DOCS)), np.zeros(len(DOCS)), [""] * len(DOCS), DOCS,
                          np.zeros((len(DOCS), 2)), view, [], [], [], [], [])
    tokens = ["钱", "撕", "银行"]
    same, shown = prf_study.rm3(d, tokens, [(0, 1.0), (1, 1.0)], 5, 1.0, False)
    assert same == dict(Counter(tokens)) and shown == []
    w, shown = prf_study.rm3(d, tokens, [(0, 1.0), (1, 1.0)], 3, 0.7, False)
    assert [t for t, _ in shown][:1] == ["人民币"]  # in both feedback chunks
    assert math.isclose(sum(w.values()), len(tokens))  # the expanded query keeps the question's mass
    assert not prf_study.expandable("的") and not prf_study.expandable("3") and prf_study.expandable("钱")
