"""The evaluation command runs on a small slice and its metrics are sane."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import evaluate
from tools.evaluate import metrics

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


def test_rescore_dump(tmp_path):
    """--from-dump re-fuses stored route lists with the current fusion settings."""
    from pipeline.settings import Settings

    d = tmp_path / "d.jsonl"
    rows = [{"q": "a", "n_rel": 1, "bm25": [["1", 5.0, False], ["2", 1.0, True]], "vector": [["2", 0.9, True]]},
            {"q": "b", "n_rel": 1, "bm25": [["3", 1.0, False], ["4", 0.99, False]],
             "vector": [["5", 0.9, True], ["6", 0.8, False]]}]
    d.write_text("\n".join(json.dumps(r) for r in rows))
    res = evaluate.rescore_dump(d, Settings())
    assert res["questions"] == 2
    assert res["routes"]["bm25"]["hit@1"] == 0.0 and res["routes"]["vector"]["hit@1"] == 1.0
    # q1: decisive BM25 (5.0 / 1.0) but chunk 2 is found by both routes → rank 1; q2: flat BM25 → vector wins
    assert res["routes"]["rrf"]["hit@1"] == 1.0
    plain = evaluate.rescore_dump(d, Settings(bm25_adaptive=False))
    assert plain["routes"]["rrf"]["hit@1"] == 0.5  # equal weights: 3 and 5 tie at 1/61, chunk_id 3 wins
