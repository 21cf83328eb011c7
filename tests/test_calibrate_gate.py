"""tools/eval/calibrate_gate.py: the two models, the open band and the left-out scoring through gate.decide."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.retrieval.gate import decide
from tools.eval import calibrate_gate as cg


def _row(kb: str, kind: str, qset: str, sim: float, sent: float, cp: float, agree: float) -> dict:
    f = {"max_similarity": sim, "similarity_gap": 0.0, "similarity_gap50": 0.0, "coverage": cp,
         "phrase_coverage": 1.0, "coverage_vector": cp, "coverage_mass": 0.0, "unseen": 0.0, "agreement": 0.0,
         "top_agreement": agree, "bm25_top": 0.0, "n_terms": 3, "best_sentence": sent}
    return {"kb": kb, "kind": kind, "qset": qset, "q": f"{kb}-{kind}-{sim:.5f}-{sent:.5f}", "f": f}


def _dumps(tmp: Path, with_sentence: bool = True) -> Path:
    """Three knowledge bases whose backgrounds sit at different cosines; the evidence is shifted alike."""
    rng = np.random.default_rng(0)
    for kb, base in (("a", 0.85), ("b", 0.87), ("c", 0.86)):
        rows = []
        for _ in range(64):
            rows.append(_row(kb, "probe", "probe", base + rng.normal(0, .01), base + rng.normal(0, .01),
                             rng.uniform(0, .2), 0.0))
        for _ in range(300):  # answerable: well above the background, words present, routes agree
            rows.append(_row(kb, "answerable", kb, base + .05 + rng.normal(0, .015), base + .07 + rng.normal(0, .015),
                             rng.uniform(.4, 1), float(rng.random() < .9)))
        for other in ("a", "b", "c"):
            if other != kb:
                for _ in range(100):
                    rows.append(_row(kb, "out_of_kb", other, base + rng.normal(0, .015), base + rng.normal(0, .015),
                                     rng.uniform(0, .3), float(rng.random() < .2)))
        for r in rows:
            if not with_sentence:
                r["f"]["best_sentence"] = None
        (tmp / f"{kb}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return tmp


def test_leave_one_set_out_fits_both_models_and_scores_through_decide(tmp_path):
    rows, bg = cg.load(_dumps(tmp_path))
    assert all(b.sent_median is not None for b in bg.values())  # the probes' sentence median
    result = cg.leave_one_set_out(rows, bg)
    assert set(result) == {"a", "b", "c"}
    for kb, m in result.items():
        assert m["false_refusals"] <= 0.05 and m["out_of_kb_refused"] >= 0.9, (kb, m)
        assert 0 < m["sentence_stage_answerable"] < 1  # some decided on the quick score, some in the band
        model = m["model"]
        assert model["sure_refuse"] <= model["quick_refuse_below"] <= model["quick_answer_at"] <= model["sure_answer"]
        assert len(model["coef"]) == 4 and len(model["quick_coef"]) == 3
    shipped = cg.fit(rows, bg)
    # the table is the app's decision: recompute one KB's false refusals with gate.decide directly
    own = [r for r in rows if r["kb"] == "b" and r["kind"] == "answerable"]
    refused = np.mean([decide(r["feat"], bg["b"], 0.0, True, shipped).outcome == "refuse" for r in own])
    assert cg.score_set(shipped, [r for r in rows if r["kb"] == "b"], bg["b"])["false_refusals"] == \
        pytest.approx(round(float(refused), 4))


def test_dumps_without_sentence_evidence_are_refused_with_a_clear_message(tmp_path):
    with pytest.raises(SystemExit, match="sentence evidence"):
        cg.load(_dumps(tmp_path, with_sentence=False))


def _family_dumps(tmp: Path) -> Path:
    """Four knowledge bases of three families (devsets.FAMILIES); the formal one has same-domain unanswerable and
    off-topic questions instead of gold-removed and other sets' ones."""
    rng = np.random.default_rng(1)
    kbs = (("xquad_zh", 0.85), ("cmrc_trial", 0.87), ("dureader_dev", 0.86), ("regulations", 0.84))
    for kb, base in kbs:
        rows = [_row(kb, "probe", "probe", base + rng.normal(0, .01), base + rng.normal(0, .01), rng.uniform(0, .2), 0.0)
                for _ in range(64)]
        rows += [_row(kb, "answerable", kb, base + .05 + rng.normal(0, .015), base + .07 + rng.normal(0, .015),
                      rng.uniform(.4, 1), float(rng.random() < .9)) for _ in range(120)]
        negatives = [("unanswerable", kb), ("out_of_kb", "offtopic")] if kb == "regulations" else \
            [("gold_removed", kb)] + [("out_of_kb", other) for other, _ in kbs[:3] if other != kb]
        for kind, qset in negatives:
            rows += [_row(kb, kind, qset, base + rng.normal(0, .015), base + rng.normal(0, .015), rng.uniform(0, .3),
                          float(rng.random() < .2)) for _ in range(40)]
        (tmp / f"{kb}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return tmp


def test_leave_one_family_out_trains_on_the_other_families_only(tmp_path):
    rows, bg = cg.load(_family_dumps(tmp_path))
    seen = {}

    def fitter(train, bg_):
        fam = ({"xquad_zh", "cmrc_trial", "dureader_dev", "regulations"} - {r["kb"] for r in train})
        seen[frozenset(fam)] = {(r["kb"], r["qset"]) for r in train}
        return cg.fit(train, bg_)

    result = cg.leave_one_family_out(rows, bg, fitter)
    assert set(result) == {"encyclopedic", "web", "formal"}
    assert set(result["encyclopedic"]["sets"]) == {"cmrc_trial", "xquad_zh"}
    assert result["encyclopedic"]["trained_on"] == ["dureader_dev", "regulations"]
    # leaving out the encyclopedic family drops dureader_dev's out-of-KB rows drawn from its sets too
    assert seen[frozenset({"cmrc_trial", "xquad_zh"})] == {("dureader_dev", "dureader_dev"),
                                                           ("regulations", "regulations"), ("regulations", "offtopic")}
    formal = result["formal"]["sets"]["regulations"]
    # same-domain unanswerable questions count where gold-removed ones do; off-topic ones as out of KB
    assert formal["gold_removed"] == 40 and formal["out_of_kb"] == 40 and formal["answerable"] == 120
    model = cg.fit([r for r in rows if r["kb"] != "regulations"], bg)
    own = [r for r in rows if r["kb"] == "regulations" and r["kind"] == "unanswerable"]
    refused = np.mean([decide(r["feat"], bg["regulations"], 0.0, True, model).outcome == "refuse" for r in own])
    assert formal["gold_removed_refused"] == pytest.approx(round(float(refused), 4))
    for m in result.values():
        for s in m["sets"].values():
            assert s["false_refusals"] <= 0.1 and s["out_of_kb_refused"] >= 0.8, s


def test_by_family_command_prints_the_folds_and_the_packaged_gate(tmp_path, capsys):
    out = tmp_path / "lofo.json"
    assert cg.main(["--dumps", str(_family_dumps(tmp_path)), "--by-family", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "left-out family formal (fitted on cmrc_trial, dureader_dev, xquad_zh)" in printed
    assert "min_similarity 0.82" in printed
    got = json.loads(out.read_text())
    assert set(got["packaged"]) == set(got["packaged_with_floor"]) == {"xquad_zh", "cmrc_trial", "dureader_dev",
                                                                       "regulations"}
