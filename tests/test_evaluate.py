"""The evaluation command runs on a small slice and its metrics are sane."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import evaluate
from pipeline.evaluate import metrics

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def test_metrics_arithmetic():
    m = metrics([[False, True, False], [True], [False] * 10], [1, 1, 1], [1.0, 2.0, 3.0])
    assert m["hit@1"] == pytest.approx(1 / 3, abs=1e-4)
    assert m["hit@3"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["mrr@10"] == pytest.approx((0.5 + 1 + 0) / 3, abs=1e-4)
    assert m["ndcg@10"] == pytest.approx((1 / 1.5849625 + 1 + 0) / 3, abs=1e-3)
    assert m["p50_ms"] == 2.0


def test_cmrc_slice(tmp_path):
    out = tmp_path / "cmrc.json"
    evaluate.main(["--squad", str(DATA / "cmrc2018" / "cmrc2018_dev.json"), "--limit", "50",
                   "--contexts", "80", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["questions"] == 50
    r = res["routes"]
    assert set(r) >= {"bm25", "vector", "rrf"}
    assert r["bm25"]["hit@5"] >= 0.8
    assert r["vector"]["hit@5"] >= 0.7
    for route in r.values():
        assert 0 <= route["hit@1"] <= route["hit@3"] <= route["hit@5"] <= route["hit@10"] <= 1
        assert route["mrr@10"] <= route["hit@10"] and route["p95_ms"] >= route["p50_ms"] > 0
    best_single = max(r["bm25"]["mrr@10"], r["vector"]["mrr@10"])
    assert r["rrf"]["mrr@10"] >= best_single - 0.05


def test_dureader_slice(tmp_path):
    out = tmp_path / "du.json"
    evaluate.main(["--dureader", str(DATA / "dureader2_demo" / "search.dev.json"), "--limit", "8",
                   "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["questions"] == 8
    assert res["routes"]["rrf"]["hit@10"] >= 0.5
