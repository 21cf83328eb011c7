"""The evaluation command runs on a small slice and its metrics are sane."""
from __future__ import annotations

import json

import pytest

from tests.shared_data import DATA, needs
from tools.eval import evaluate
from tools.eval.evaluate import metrics

# Marked slow: the dev-set slices (cmrc, dureader) — the packaged e5 model (real quality, minutes on 2 cores).


def test_metrics_arithmetic():
    m = metrics([[False, True, False], [True], [False] * 10], [1, 1, 1], [1.0, 2.0, 3.0])
    assert m["hit@1"] == pytest.approx(1 / 3, abs=1e-4)
    assert m["hit@3"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["mrr@10"] == pytest.approx((0.5 + 1 + 0) / 3, abs=1e-4)
    assert m["ndcg@10"] == pytest.approx((1 / 1.5849625 + 1 + 0) / 3, abs=1e-3)
    assert m["p50_ms"] == 2.0


@needs(DATA / "cmrc2018" / "cmrc2018_dev.json")
@pytest.mark.slow
def test_cmrc_slice(tmp_path):
    out = tmp_path / "cmrc.json"
    evaluate.main(["--squad", str(DATA / "cmrc2018" / "cmrc2018_dev.json"), "--limit", "50",
                   "--contexts", "80", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["questions"] == 50
    r = res["routes"]
    assert set(r) >= {"bm25", "vector", "union_oracle", "rrf", "adaptive_rrf", "fused"}
    assert r["bm25"]["hit@5"] >= 0.8
    assert r["vector"]["hit@5"] >= 0.7
    for name, route in r.items():
        assert 0 <= route["hit@1"] <= route["hit@3"] <= route["hit@5"] <= route["hit@10"] <= 1
        assert route["mrr@10"] <= route["hit@10"]
        if name in ("bm25", "vector", "fused"):  # the routes the engine ran (the others are re-fused offline)
            assert route["p95_ms"] >= route["p50_ms"] > 0
    best_single = max(r["bm25"]["mrr@10"], r["vector"]["mrr@10"])
    assert r["rrf"]["mrr@10"] >= best_single - 0.05 and r["fused"]["mrr@10"] >= best_single - 0.05
    assert r["union_oracle"]["hit@1"] >= max(r["bm25"]["hit@10"], r["vector"]["hit@10"])


@needs(DATA / "dureader2_demo" / "search.dev.json")
@pytest.mark.slow
def test_dureader_slice(tmp_path):
    out = tmp_path / "du.json"
    evaluate.main(["--dureader", str(DATA / "dureader2_demo" / "search.dev.json"), "--limit", "8",
                   "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["questions"] == 8
    assert res["routes"]["rrf"]["hit@10"] >= 0.5 and res["routes"]["fused"]["hit@10"] >= 0.5


def test_rescore_dump(tmp_path):
    """--from-dump re-fuses stored full-information candidates with the given fusion settings."""
    from pipeline.settings import Settings

    d = tmp_path / "d.jsonl"
    # cands: [chunk_id, bm25_rank, vector_rank, bm25_score, cosine, hit, length] — every chunk has both real
    # scores; equal lengths, so the fragment prior adds the same to every candidate and changes no order here
    rows = [{"q": "a", "n_rel": 1, "features": {"coverage": 1.0},
             "cands": [["1", 1, None, 5.0, 0.70, False, 300], ["2", 2, 1, 1.0, 0.90, True, 300]]},
            {"q": "b", "n_rel": 1, "features": {"coverage": 0.5},
             "cands": [["3", 1, None, 1.0, 0.60, False, 300], ["4", 2, None, 0.99, 0.50, False, 300],
                       ["5", None, 1, 0.0, 0.90, True, 300], ["6", None, 2, 0.0, 0.80, False, 300]]}]
    d.write_text("\n".join(json.dumps(r) for r in rows))
    res = evaluate.rescore_dump(d, Settings())
    r = res["routes"]
    assert res["questions"] == 2
    assert r["bm25"]["hit@1"] == 0.0 and r["vector"]["hit@1"] == 1.0 and r["union_oracle"]["hit@1"] == 1.0
    # SRS RRF (K = 60, equal weights): q1 chunk 2 is in both lists → rank 1; q2: 3 and 5 tie at 1/61, id 3 wins
    assert r["rrf"]["hit@1"] == 0.5
    # adaptive RRF: q2's BM25 is flat (1.0 / 0.99) → BM25 weight at the floor → the vector's chunk 5 first
    assert r["adaptive_rrf"]["hit@1"] == 1.0
    # convex with a fixed share: α = 1 is BM25's order, α = 0 the vector route's order
    assert evaluate.rescore_dump(d, Settings(convex_auto_weight=False, convex_bm25_weight=1.0)
                                 )["routes"]["fused"]["hit@1"] == 0.0
    assert evaluate.rescore_dump(d, Settings(convex_auto_weight=False, convex_bm25_weight=0.0)
                                 )["routes"]["fused"]["hit@1"] == 1.0


def test_rescore_dump_reports_the_fusion_without_the_prior_beside_it(tmp_path):
    """Old and new in one run: a question whose vector top-1 is a 6-character echo of it and whose gold chunk
    (300 characters) is second — the shipped fusion (prior on) puts the gold first, `fused_no_prior` does not."""
    from pipeline.calibration import profile_for
    from pipeline.models.paths import PACKAGED_MODEL_ID
    from pipeline.settings import Settings

    assert profile_for(PACKAGED_MODEL_ID).profile.fusion.length_prior["minmax"].beta > 0
    d = tmp_path / "d.jsonl"
    row = {"q": "塘沽区什么地方有男科医院", "n_rel": 1, "features": {"coverage": 0.2},
           "cands": [["1", 2, 1, 1.0, 0.95, False, 6], ["2", 1, 2, 1.1, 0.93, True, 300],
                     ["3", 3, 3, 0.2, 0.80, False, 300]]}
    d.write_text(json.dumps(row))
    r = evaluate.rescore_dump(d, Settings())["routes"]
    assert r["fused"]["hit@1"] == 1.0 and r["vector"]["hit@1"] == 0.0
    off = evaluate.rescore_dump(d, Settings(convex_length_prior=False))["routes"]
    assert r["fused_no_prior"]["hit@1"] == 0.0  # the echo first, as before the prior
    assert "fused_no_prior" not in off and off["fused"]["hit@1"] == r["fused_no_prior"]["hit@1"]
