"""Calibration profiles (pipeline/calibration): the shipped files validate and carry their provenance; a model
without its own profile runs on the generic one and says so (/api/health over real HTTP, the header, the answer
trace); `python -m tools.eval.calibrate`'s entry function fits a tiny random model on a generated dev-data fixture,
writes a valid profile with provenance, and an engine started on that model runs on its numbers."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from pipeline.calibration import CalibrationProfile, generic, profile_for, read, slug, write
from pipeline.calibration.store import DIR_ENV, PACKAGE_DIR
from pipeline.models.paths import PACKAGED_MODEL_ID
from pipeline.retrieval.fusion import FusionParams
from pipeline.retrieval.gate import GateModel
from store.config_store import ConfigStore
from store.db import Database
from tests.calibration_fixture import write_dev_data
from tests.tiny_models import make_tiny_bert_embedding

SETS = ["xquad_zh", "cmrc_trial"]  # two SQuAD-format sets: enough for every step's leave-one-set-out
QUESTION = "公司的总部在哪里？"


def _engine(data: Path, model: Path, calibration_dir: Path | None = None, texts: tuple[str, ...] = ()):
    """A real engine on the model (its path saved as a setting before the start, like tests/tiny_engine.py)."""
    from pipeline.engine import Engine

    data.mkdir(parents=True, exist_ok=True)
    db = Database(data / "app.db")
    ConfigStore(db).save({"embedding_model_path": str(model)})
    db.close()
    engine = Engine(data, calibration_dir=calibration_dir)
    if texts:
        src = data.parent / f"{data.name}-src"
        src.mkdir(exist_ok=True)
        items = []
        for i, t in enumerate(texts):
            (src / f"{i}.txt").write_text(t, encoding="utf-8")
            items.append((f"{i}.txt", src / f"{i}.txt"))
        engine.upload(items)
        assert engine.wait_idle(300)
    return engine


def test_shipped_profiles_validate_and_say_where_their_numbers_come_from(tmp_path):
    e5 = profile_for(PACKAGED_MODEL_ID, 384)
    assert e5.calibrated and e5.name == slug(PACKAGED_MODEL_ID) == "packaged-multilingual-e5-small"
    p = e5.profile
    for section in (p.fusion, p.gate, p.floor, p.extractive, p.support):
        prov = section.provenance
        assert prov.fitted_for == PACKAGED_MODEL_ID and prov.dev_sets and prov.command and prov.date and prov.commit
    assert set(p.fusion.provenance.left_out) >= {"cmrc_dev_news", "cmrc_trial", "dureader_dev", "dureader_train",
                                                 "xquad_zh", "average"}
    assert p.gate.full is not None and p.floor.min_similarity == 0.82
    gen = generic()
    assert gen.embedding_model is None and gen.gate.full is None and gen.floor.min_similarity == 0.3
    assert gen.floor.provenance.fitted_for is None  # the SRS's value, not fitted: says so
    # a model without a profile, or a profile of another vector size: the generic one, with the reason
    for active in (profile_for("local:bge-small-zh", 512), profile_for(PACKAGED_MODEL_ID, 512)):
        assert not active.calibrated and active.name == "generic" and active.profile == gen and active.note
    # a profile is validated: out-of-range and inconsistent numbers are refused naming the field
    bad = p.model_dump(mode="json")
    bad["gate"]["full"]["answer_at"] = bad["gate"]["full"]["refuse_below"] - 1
    (tmp_path / "x.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="answer_at"):
        read(tmp_path / "x.json")
    bad = p.model_dump(mode="json")
    bad["floor"]["min_similarity"] = 1.5
    (tmp_path / "x.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="min_similarity"):
        read(tmp_path / "x.json")
    # a file named for one model but holding another's numbers is an error, not silently used
    (tmp_path / "local-other.json").write_text(json.dumps(p.model_dump(mode="json")))
    with pytest.raises(ValueError, match="not of 'local:other'"):
        profile_for("local:other", None, tmp_path)


def test_a_model_without_a_profile_runs_on_the_generic_one_and_says_so(tmp_path, monkeypatch):
    from pipeline import events as ev
    from tests.live import LiveApp
    from ui.header import badge_html
    from ui.render import render_trace

    monkeypatch.delenv(DIR_ENV, raising=False)
    model = make_tiny_bert_embedding(tmp_path / "no-profile-emb")
    engine = _engine(tmp_path / "data", model, texts=("甲公司的总部在北京市，成立于一九九八年。",))
    try:
        assert engine.default_settings(engine.settings).min_similarity == generic().floor.min_similarity  # 恢复默认's floor
        app = LiveApp(engine)
        try:
            with app.http() as http:
                health = http.get("/api/health").json()["data"]
        finally:
            app.stop()
        assert health["calibrated"] is False
        assert health["calibration"]["profile"] == "generic" and health["calibration"]["calibrated"] is False
        assert health["calibration"]["embedding_model"] == "local:no-profile-emb"
        header = badge_html(engine)
        assert "未校准" in header and "no-profile-emb" in header
        tr = ev.trace_payload(engine.retrieve(QUESTION))
        assert tr["calibration"]["profile"] == "generic" and tr["calibration"]["calibrated"] is False
        html = render_trace(tr)
        assert 'data-calibrated="false"' in html and "未校准" in html
        gen = generic()
        assert engine.components.retrieval.gate_model == GateModel.from_calibration(gen.gate)
        assert engine.components.picker.params.__dict__ == gen.extractive.params()
    finally:
        engine.close()


# The whole calibration (dev-set KBs built, five fits) even on a tiny model: minutes, not the fast loop.
@pytest.mark.slow
def test_calibrate_fits_a_tiny_model_and_an_engine_then_runs_on_its_profile(tmp_path, monkeypatch):
    from pipeline import events as ev
    from tools.eval.calibrate import calibrate
    from ui.header import badge_html
    from ui.render import render_trace

    monkeypatch.delenv(DIR_ENV, raising=False)
    monkeypatch.setenv("KBQA_SHARED_DATA", str(write_dev_data(tmp_path / "shared")))
    model = make_tiny_bert_embedding(tmp_path / "tiny-calib")
    out = tmp_path / "profiles"
    path = calibrate(str(model), tmp_path / "kb-cache", tmp_path / "dumps", SETS, out,
                     {"gate": 12, "extractive": 8, "support": 4})
    assert path == out / "local-tiny-calib.json" and path.is_file()
    assert DIR_ENV not in os.environ  # the draft's search dir was for the run only
    assert not (PACKAGE_DIR / path.name).exists()  # written where asked, not into the package
    prof = read(path)
    assert isinstance(prof, CalibrationProfile)
    assert prof.embedding_model == "local:tiny-calib" and prof.embedding_dim == 32
    today = datetime.date.today().isoformat()
    for name in ("fusion", "gate", "floor", "extractive", "support"):
        prov = getattr(prof, name).provenance
        assert prov.fitted_for == "local:tiny-calib", name
        assert prov.dev_sets == sorted(SETS) and prov.date == today and "tools.eval.calibrate" in prov.command, name
    for name in ("fusion", "gate", "extractive", "support"):  # left-out metrics of every set that was left out
        assert set(SETS) <= set(getattr(prof, name).provenance.left_out), name
    assert "false_refusals" in prof.gate.provenance.left_out["xquad_zh"]
    assert prof.gate.full is not None and prof.gate.band is not None  # the two-stage gate was fitted
    gen = generic()
    assert prof.gate != gen.gate and prof.floor.min_similarity != gen.floor.min_similarity
    # --steps: a refit of one step keeps every other section as the model's profile has it (a hand-set marker in
    # the floor survives; a whole refit would have fitted it again)
    marked = prof.model_copy(update={"floor": prof.floor.model_copy(update={"min_similarity": 0.4321})})
    write(marked, path)
    again = read(calibrate(str(model), tmp_path / "kb-cache", tmp_path / "dumps", SETS, out, {"support": 4},
                           steps=("support",)))
    assert again.floor.min_similarity == 0.4321
    assert (again.fusion, again.gate, again.extractive, again.about) == (prof.fusion, prof.gate, prof.extractive,
                                                                         prof.about)
    assert again.support.provenance.date == today and "tools.eval.calibrate" in again.support.provenance.command
    write(prof, path)
    # an engine started on that model reads the profile's numbers
    engine = _engine(tmp_path / "data", model, out, texts=tuple(
        f"{n}公司的总部在{c}市，成立于{y}年。" for n, c, y in (("甲", "北京", 1998), ("乙", "上海", 2005))))
    try:
        h = engine.health()
        assert h["calibrated"] is True and h["calibration"]["profile"] == "local-tiny-calib"
        assert h["calibration"]["min_similarity"] == prof.floor.min_similarity
        # the default floor (恢复默认 in the settings tab) is the fitted one; saved, the gate refuses below it
        assert engine.default_settings(engine.settings).min_similarity == prof.floor.min_similarity
        engine.update_settings({"min_similarity": engine.default_settings(engine.settings).min_similarity})
        assert "未校准" not in badge_html(engine)
        rs = engine.components.retrieval
        assert rs.gate_model == GateModel.from_calibration(prof.gate) and rs.gate_model.two_stage
        params = FusionParams.from_settings(engine.settings, rs.calibration.profile.fusion)
        assert params.auto_coefs == prof.fusion.alpha_model["minmax"]
        assert engine.components.picker.params.__dict__ == prof.extractive.params()
        assert engine.components.support.params.__dict__ == prof.support.params()
        res = engine.retrieve(QUESTION)
        tr = ev.trace_payload(res)
        assert tr["calibration"]["profile"] == "local-tiny-calib" and tr["calibration"]["calibrated"] is True
        assert tr["gate"]["min_similarity"] == prof.floor.min_similarity
        assert 'data-profile="local-tiny-calib"' in render_trace(tr)
    finally:
        engine.close()


def test_calibrate_refuses_an_unknown_set_or_weighing_before_building_anything(tmp_path):
    from tools.eval.calibrate import calibrate

    with pytest.raises(ValueError, match="unknown dev set.*regulations"):  # the message lists what is known
        calibrate("", tmp_path / "kb", tmp_path / "dumps", ["xquad_zh", "no_such_set"], tmp_path / "out")
    with pytest.raises(ValueError, match="weigh"):
        calibrate("", tmp_path / "kb", tmp_path / "dumps", ["xquad_zh", "regulations"], tmp_path / "out",
                  weigh="questions")
    with pytest.raises(ValueError, match="features no_such_input"):
        calibrate("", tmp_path / "kb", tmp_path / "dumps", ["xquad_zh", "regulations"], tmp_path / "out",
                  features=["cos1", "no_such_input"])
    assert not (tmp_path / "kb").exists() and not (tmp_path / "out").exists()


# The formal family joins the fit: the real regulations (../shared/data/regulations) built with a tiny model, and
# the left-out metrics of every step leave out a whole family of text.
@pytest.mark.slow
def test_calibrate_by_family_with_the_formal_set(tmp_path, monkeypatch):
    from tools.eval.calibrate import calibrate
    from tools.eval.devsets import family_of, shared_data_dir

    regulations = shared_data_dir() / "regulations"
    assert regulations.is_dir(), "../shared/data/regulations is part of the test data"
    monkeypatch.delenv(DIR_ENV, raising=False)
    shared = write_dev_data(tmp_path / "shared")
    (shared / "regulations").symlink_to(regulations)
    monkeypatch.setenv("KBQA_SHARED_DATA", str(shared))
    model = make_tiny_bert_embedding(tmp_path / "tiny-family")
    sets = ["xquad_zh", "dureader_dev", "regulations"]  # one set of each family
    path = calibrate(str(model), tmp_path / "kb-cache", tmp_path / "dumps", sets, tmp_path / "profiles",
                     {"gate": 10, "extractive": 6}, steps=("fusion", "gate", "extractive"), by_family=True,
                     weigh="families", features=["cos1", "qlen"])
    prof = read(path)
    for name in ("fusion", "gate", "extractive"):
        prov = getattr(prof, name).provenance
        assert prov.dev_sets == sorted(sets), name
        # each set scored by a fit on the other families only, and says which family it was left out with
        assert {s: m["left_out_with"] for s, m in prov.left_out.items() if s in sets} == \
            {s: family_of(s) for s in sets}, name
        assert "without its family" in prov.notes, name
        assert "--by-family --weigh families --features cos1,qlen" in prov.command, name  # the run, reproducible
    assert "families weighing alike" in prof.fusion.provenance.notes and "reading cos1, qlen" in prof.fusion.provenance.notes
    for norm in ("minmax", "zscore"):  # the α model reads the two inputs named, every other one weighs 0
        assert all(v == 0.0 for k, v in prof.fusion.alpha_model[norm].items() if k not in ("cos1", "qlen", "bias"))
    formal_gate = prof.gate.provenance.left_out["regulations"]
    # the formal rows: its same-domain unanswerable questions stand where gold-removed ones stand elsewhere, the
    # everyday off-topic questions are its out-of-KB ones
    assert formal_gate["answerable"] == 10 and formal_gate["gold_removed"] == 40 and formal_gate["out_of_kb"] == 51
    assert prof.extractive.provenance.left_out["regulations"]["gold_removed"] == 40
    assert prof.support == profile_for("local:tiny-family").profile.support  # not a step of this run: kept
