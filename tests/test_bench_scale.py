"""The growth-curve benchmark's own test (tools/bench/bench_scale.py): the command at tiny sizes in team mode, on
the test session's PostgreSQL and Chroma server, with real web and worker processes."""
from __future__ import annotations

import json

import pytest

from tests.shared_data import DATA, needs
from tools.bench import bench_scale

pytestmark = [pytest.mark.slow, needs(DATA / "cmrc2018" / "cmrc2018_dev.json")]


def test_tiny_growth_curve_in_team_mode(team_deployment, tmp_path, capsys):
    dep = team_deployment
    out = tmp_path / "scale.json"
    rc = bench_scale.main(["--sizes", "600,1200", "--base", "60", "--queries", "5", "--web", "2",
                           "--database-url", dep.database_url, "--chroma-url", dep.chroma_url,
                           "--files-dir", str(dep.files_dir), "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text(encoding="utf-8"))
    assert [r["chunks"] for r in rows] == [600, 1200]
    for r in rows:
        lat = r["latency_ms"]
        assert lat["failed"] == 0
        assert all(lat[k]["p50"] > 0 for k in ("embed", "bm25", "vector", "fusion", "retrieval_no_rerank", "answer"))
        assert r["fill"]["chunks"] == 600 and r["fill"]["chroma_chunks_per_s"] > 0
        assert len(r["web"]) == 2
        for w in r["web"]:
            assert w["rss_mb"] > 0 and w["start"]["ready_s"] > 0 and w["restart"]["ready_s"] > 0
            assert w["start"]["chunks"] >= r["chunks"]  # the web processes serve what this size filled
        change = r["change"]
        assert change["last_s"] > 0 and all(s is not None for s in change["visible_s"])
        assert len(change["full_builds"]) == 2
    printed = capsys.readouterr().out
    assert "## Growth" in printed and "Issue 29 goals at 1200 chunks" in printed
    # the servers must start empty: a second run on the same databases is refused
    with pytest.raises(SystemExit, match="must start empty"):
        bench_scale.main(["--sizes", "600", "--base", "60", "--database-url", dep.database_url,
                          "--chroma-url", dep.chroma_url, "--files-dir", str(dep.files_dir)])
