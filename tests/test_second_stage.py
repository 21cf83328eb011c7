"""tools/eval/second_stage.py: the rescoring, its fit on two families and the left-out score (synthetic rows; the
collection over real KBs is what `python -m tools.eval.second_stage` runs)."""
from __future__ import annotations

import random

from tools.eval import second_stage as st


def cand(rel, fused, s1, cov=0.5):
    return {"rel": rel, "fused": fused, "cos": 0.8, "s1": s1, "cov_chunk": cov, "cov_sentence": cov,
            "grams_chunk": 0.0, "grams_sentence": 0.0}


def question(rng, gold_first: bool):
    """20 candidates; the gold one is fused second (or first) and has the best sentence by far."""
    c = [cand(False, 1.0 - 0.03 * i, 0.80 + 0.01 * rng.random()) for i in range(20)]
    g = 0 if gold_first else 1
    c[g] = cand(True, c[g]["fused"], 0.90)
    return {"q": "?", "cands": c}


def test_the_fit_finds_the_sentence_weight_and_the_left_out_set_gains():
    rng = random.Random(0)
    data = {name: st.prepare([question(rng, i % 4 == 0) for i in range(40)])
            for name in ("xquad_zh", "cmrc_trial", "dureader_dev", "regulations")}
    assert st.metrics(data["regulations"], [], []) == (0.625, 0.25)  # gold first for 1 in 4, else second
    w = st.fit([data["xquad_zh"], data["dureader_dev"]], ["s1"])
    assert w[0] > 0 and st.metrics(data["regulations"], ["s1"], w) == (1.0, 1.0)
    res = st.left_out(data)["sentence cosine"]
    assert set(res) == set(data)  # every set scored once, by a fit without its family
    assert res["regulations"]["fused"] == [0.625, 0.25] and res["regulations"]["second_stage"] == [1.0, 1.0]


def test_a_feature_that_does_not_separate_gets_no_weight():
    rng = random.Random(1)
    rows = [question(rng, True) for _ in range(20)]
    for r in rows:  # the sentence cosine now says nothing about the gold
        for c in r["cands"]:
            c["s1"] = 0.8
    qs = st.prepare(rows)
    assert st.fit([qs], ["s1"]) == [0.0] and st.metrics(qs, ["s1"], [0.0]) == (1.0, 1.0)
