"""tools/eval/cosine_margin.py: the gold chunk's cosine margin over the best other candidate, read from --cv dumps."""
import json

import pytest

from tools.eval import cosine_margin as cm


def _row(cands):
    # a dump row as tools.eval.evaluate.dump_row writes it: [id, bm25 rank, vector rank, bm25 score, cosine, gold, len]
    return {"q": "?", "n_rel": 1, "features": {},
            "cands": [[str(i), None, i + 1, 0.0, cos, gold, None] for i, (cos, gold) in enumerate(cands)]}


def test_the_margin_is_the_best_gold_cosine_over_the_best_other_one():
    assert cm.margin(_row([(0.86, False), (0.88, True), (0.84, True), (0.85, False)])) == pytest.approx(0.02)
    assert cm.margin(_row([(0.90, False), (0.87, True)])) == pytest.approx(-0.03)
    # a candidate without a cosine (none was measured) is not compared
    assert cm.margin(_row([(None, False), (0.80, True), (0.79, False)])) == pytest.approx(0.01)
    # no gold among the candidates (a recall miss) or nothing else: no margin
    assert cm.margin(_row([(0.9, False), (0.8, False)])) is None
    assert cm.margin(_row([(0.9, True)])) is None


def test_ties_are_margins_within_eps_either_way():
    s = cm.summarize([0.05, 0.011, 0.01, -0.005, -0.01, -0.02], eps=0.01)
    assert s["n"] == 6 and s["median"] == pytest.approx(0.0025)
    assert (s["ahead"], s["within"], s["behind"]) == (round(2 / 6, 3), 0.5, round(1 / 6, 3))
    assert cm.summarize([])["median"] is None


def test_report_groups_the_sets_by_family_and_counts_questions_without_a_margin(tmp_path, capsys):
    rows = {"xquad_zh": [_row([(0.90, True), (0.85, False)]), _row([(0.88, True), (0.86, False)])],
            "regulations_holdout": [_row([(0.85, True), (0.851, False)]), _row([(0.9, False), (0.8, False)])],
            "regulations_dev2": [_row([(0.84, True), (0.86, False)])]}
    for name, rs in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs), encoding="utf-8")
    r = cm.report(tmp_path)
    assert r["sets"]["xquad_zh"]["family"] == "encyclopedic" and r["sets"]["xquad_zh"]["ahead"] == 1.0
    assert r["sets"]["regulations_holdout"] == {"family": "formal", "n": 1, "median": -0.001, "ahead": 0.0,
                                                "within": 1.0, "behind": 0.0, "no_margin": 1}
    # the family pools its sets' questions
    assert r["families"]["formal"]["n"] == 2 and r["families"]["formal"]["behind"] == 0.5
    assert cm.main(["--dumps", str(tmp_path), "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "regulations_holdout" in out and "(all its sets)" in out
    assert json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["families"]["encyclopedic"]["n"] == 2


def test_a_folder_without_dumps_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        cm.main(["--dumps", str(tmp_path)])
    assert e.value.code == 2
