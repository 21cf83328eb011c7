"""Fusion (pipeline.retrieval.fusion): exact arithmetic of both modes, full-information completion through a real
engine (real SQLite, Chroma, bm25s; a tiny random embedding model), deterministic ties, mode switch without reload,
and the offline CV arithmetic agreeing with the engine's."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from llama_index.core.schema import NodeWithScore, TextNode

from pipeline.calibration import profile_for
from pipeline.models.paths import PACKAGED_MODEL_ID
from pipeline.retrieval.fusion import (
    Candidates,
    FusionParams,
    auto_weight,
    convex_scores,
    fragment_length,
    fuse,
    length_prior,
    minmax,
    query_features,
)

# the packaged e5's calibration profile: what rescore_dump re-fuses a dump with (dumps are the packaged e5's)
_PACKAGED = profile_for(PACKAGED_MODEL_ID).profile

# Marked slow: tests on the `engine` fixture — the packaged e5 model (real quality, minutes on 2 cores).


def _cands(rows, texts=None):
    """rows: (chunk_id, bm25_rank, vector_rank, bm25_score, cosine); texts: chunk id → text (default "t<id>")."""
    c = Candidates()
    c.ids = [r[0] for r in rows]
    c.nodes = [NodeWithScore(node=TextNode(id_=r[0], text=(texts or {}).get(r[0], f"t{r[0]}")), score=None)
               for r in rows]
    c.lengths = [fragment_length(n) for n in c.nodes]
    c.bm25_rank = [r[1] for r in rows]
    c.vector_rank = [r[2] for r in rows]
    c.bm25_score = np.array([r[3] for r in rows], dtype=float)
    c.cosine = np.array([r[4] for r in rows], dtype=float)
    return c


# chunk 30 is BM25-only, chunk 40 vector-only; both still carry their real score on the other route
HAND = [("10", 1, 2, 9.0, 0.80), ("20", 2, 1, 5.0, 0.90), ("30", 3, None, 1.0, 0.70), ("40", None, 3, 0.0, 0.85)]


def test_rrf_mode_exact():
    fused, w = fuse(_cands(HAND), FusionParams(mode="rrf", rrf_k=60, bm25_adaptive=False))
    got = {n.node.node_id: n.score for n in fused}
    assert got == pytest.approx({"10": 1 / 61 + 1 / 62, "20": 1 / 62 + 1 / 61, "30": 1 / 63, "40": 1 / 63})
    # 10 and 20 tie exactly, as do 30 and 40: chunk_id ascending breaks both ties
    assert [n.node.node_id for n in fused] == ["10", "20", "30", "40"] and w == 1.0
    m = fused[2].node.metadata
    assert (m["bm25_rank"], m["vector_rank"], m["bm25_score"], m["similarity"]) == (3, None, 1.0, 0.70)
    assert m["fused_score"] == m["rrf_score"] == pytest.approx(1 / 63)


def test_convex_mode_exact():
    fused, w = fuse(_cands(HAND), FusionParams(mode="convex", convex_bm25_weight=0.25))
    # minmax: bm25 9,5,1,0 → 1, 5/9, 1/9, 0 ; cosine .80,.90,.70,.85 → .5, 1, 0, .75
    want = {"10": 0.25 * 1 + 0.75 * 0.5, "20": 0.25 * 5 / 9 + 0.75 * 1.0, "30": 0.25 / 9, "40": 0.75 * 0.75}
    assert {n.node.node_id: n.score for n in fused} == pytest.approx(want)
    assert [n.node.node_id for n in fused] == ["20", "10", "40", "30"] and w == 0.25
    # α = 1 is BM25's order, α = 0 the vector route's order, over the same candidates
    assert [n.node.node_id for n in fuse(_cands(HAND), FusionParams(convex_bm25_weight=1.0))[0]] == \
        ["10", "20", "30", "40"]
    assert [n.node.node_id for n in fuse(_cands(HAND), FusionParams(convex_bm25_weight=0.0))[0]] == \
        ["20", "40", "10", "30"]
    assert list(minmax(np.array([2.0, 2.0]))) == [0.0, 0.0]  # no spread → no preference
    assert convex_scores(np.array([3.0, 1.0]), np.array([0.5, 0.9]), 0.5) == pytest.approx([0.5, 0.5])


def test_length_prior_exact():
    """The fragment prior: β·min(1, log(1 + len)/log(1 + cap)) added to the convex score, per candidate; a
    verified Q&A entry counts as full length; RRF and a prior of β = 0 are unchanged."""
    texts = {"10": "x" * 200, "20": "y" * 9, "30": "z" * 99, "40": "w" * 500}
    c = _cands(HAND, texts)
    assert c.lengths == [200.0, 9.0, 99.0, 500.0]
    beta, cap = 1.0, 99
    fused, _ = fuse(c, FusionParams(convex_bm25_weight=0.25, prior_beta=beta, prior_cap=cap))
    base = {"10": 0.25 * 1 + 0.75 * 0.5, "20": 0.25 * 5 / 9 + 0.75 * 1.0, "30": 0.25 / 9, "40": 0.75 * 0.75}
    prior = {"10": beta, "20": beta * math.log(10) / math.log(100), "30": beta, "40": beta}  # 9 chars: ½ of cap
    assert {n.node.node_id: n.score for n in fused} == pytest.approx({k: base[k] + prior[k] for k in base})
    # the 9-character fragment that led the vector route (and the plain convex order) falls to third
    assert [n.node.node_id for n in fused] == ["10", "40", "20", "30"]
    assert {n.node.node_id: n.node.metadata["length_prior"] for n in fused} == pytest.approx(prior)
    assert list(length_prior([0, 5, 1000], 1.0, 400)) == pytest.approx([0.0, math.log(6) / math.log(401), 1.0])
    assert not length_prior([3, 4], 0.0, 400).any()
    # a verified Q&A entry is curated, never a fragment: full prior however short; so is a document's later chunk
    # (a page's or document's tail is short by where the cut fell), while its first chunk is measured
    qa = TextNode(id_="9", text="问：年假？\n答：五天", metadata={"verified": True})
    assert fragment_length(qa) == math.inf and length_prior([fragment_length(qa)], 0.5, 400)[0] == 0.5
    assert fragment_length(TextNode(id_="8", text="的违约金。", metadata={"chunk_index": 3})) == math.inf
    assert fragment_length(TextNode(id_="7", text="塘沽男科医院", metadata={"chunk_index": 0})) == 6.0
    # off: exactly the plain convex scores, no prior in the metadata; RRF ignores it
    off, _ = fuse(_cands(HAND, texts), FusionParams(convex_bm25_weight=0.25))
    assert {n.node.node_id: n.score for n in off} == pytest.approx(base)
    assert all(n.node.metadata["length_prior"] is None for n in off)
    rrf, _ = fuse(_cands(HAND, texts), FusionParams(mode="rrf", bm25_adaptive=False, prior_beta=beta, prior_cap=cap))
    assert [n.node.node_id for n in rrf] == ["10", "20", "30", "40"]
    # the gate's evidence order: the same nodes in the order without the prior (exactly the plain convex order)
    from pipeline.retrieval.fusion import without_prior

    assert [n.node.node_id for n in without_prior(fused)] == [n.node.node_id for n in off] == ["20", "10", "40", "30"]
    assert without_prior(off) is off


def test_length_prior_comes_from_the_fitted_weights_and_its_setting(tmp_path):
    """The prior's β and cap are the calibration profile's, per normalisation; the setting turns it off."""
    from pipeline.calibration import read
    from pipeline.retrieval import fusion
    from pipeline.settings import Settings

    fused = _PACKAGED.fusion
    w = tmp_path / "w.json"
    data = _PACKAGED.model_dump(mode="json")
    data["fusion"]["length_prior"] = {"minmax": {"cap": 200, "beta": 0.3}, "zscore": {"cap": 1, "beta": 0.0}}
    w.write_text(json.dumps(data))
    got = read(w).fusion
    assert FusionParams.from_settings(Settings(), got).prior_beta == 0.3
    zs = FusionParams.from_settings(Settings(convex_norm="zscore"), got)
    assert {"beta": zs.prior_beta, "cap": zs.prior_cap} == fusion.NO_PRIOR
    del data["fusion"]["length_prior"]["zscore"]  # a profile must hold every normalisation's prior
    w.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="zscore"):
        read(w)
    shipped = fused.length_prior["minmax"]
    on = FusionParams.from_settings(Settings(), fused)
    assert (on.prior_beta, on.prior_cap) == (shipped.beta, shipped.cap)
    off = FusionParams.from_settings(Settings(convex_length_prior=False), fused)
    assert off.prior_beta == 0.0


def test_auto_weight_and_features_exact():
    f = query_features([6.0, 3.0, 1.0], [0.91, 0.88], ["1", "2", "3"], ["2", "9", "8"], 0.75, 9)
    assert f == pytest.approx({"bm25_ratio": math.log(2.0), "coverage": 0.75, "agree3": 1 / 3, "agree10": 0.1,
                               "dense_margin": 0.3, "dense_spread": 0.3, "cos1": 0.91, "qlen": math.log(10)})
    coefs = {"bias": -1.0, "bm25_ratio": 2.0, "coverage": 1.0}
    z = -1.0 + 2.0 * math.log(2.0) + 0.75
    assert auto_weight(f, coefs) == pytest.approx(1 / (1 + math.exp(-z)))
    lo_hi = {"bias": 0.0, "lo": 0.1, "hi": 0.5}
    assert auto_weight(f, lo_hi) == pytest.approx(0.1 + 0.4 * 0.5)  # σ(0) = ½ mapped into [lo, hi]
    # auto mode uses it: the weight reported is the one computed from the features
    fused, w = fuse(_cands(HAND), FusionParams(mode="convex", convex_bm25_weight=None, auto_coefs=coefs), f)
    assert w == pytest.approx(auto_weight(f, coefs))
    assert fused[0].score == pytest.approx(max(convex_scores(np.array([9.0, 5, 1, 0]),
                                                             np.array([.8, .9, .7, .85]), w)))
    # the shipped weights apply only to the embedding model they were fitted for; another gets a constant share
    from pipeline.calibration import profile_for

    e5 = profile_for(_PACKAGED.embedding_model)
    assert e5.calibrated and e5.profile.fusion.alpha_model["minmax"] == _PACKAGED.fusion.alpha_model["minmax"]
    other = profile_for("local:some-other-model")
    assert not other.calibrated
    assert auto_weight(f, other.profile.fusion.alpha_model["minmax"]) == pytest.approx(0.25)


def test_auto_weight_is_scaled_by_the_share_of_the_question_the_keyword_route_sees():
    """Words no chunk holds give BM25 nothing to match: the auto α is the model's times the visible share (a
    question typed in everyday words against a regulation leans on the vector route). A fixed weight is the
    user's own and stays as set; features without the share (an old dump, tests) count as fully visible."""
    from tools.eval.fusion_cv import Fitted, Q, row_features

    f = query_features([6.0, 3.0, 1.0], [0.91, 0.88], ["1", "2", "3"], ["2", "9", "8"], 0.75, 9)
    coefs = {"bias": -1.0, "bm25_ratio": 2.0, "coverage": 1.0}
    auto = FusionParams(mode="convex", convex_bm25_weight=None, auto_coefs=coefs)
    assert fuse(_cands(HAND), auto, f)[1] == pytest.approx(auto_weight(f, coefs))
    half = f | {"visible": 0.5}
    fused, w = fuse(_cands(HAND), auto, half)
    assert w == pytest.approx(0.5 * auto_weight(f, coefs))
    assert [n.score for n in fused] == pytest.approx(sorted(convex_scores(np.array([9.0, 5, 1, 0]),
                                                                          np.array([.8, .9, .7, .85]), w),
                                                            reverse=True))
    assert fuse(_cands(HAND), FusionParams(mode="convex", convex_bm25_weight=0.6), half)[1] == 0.6
    # the offline fitting tool computes the same α from a dump row, so a refit fits what the engine runs
    row = {"q": "长江流入哪里", "features": {"coverage": 0.75, "visible": 0.5},
           "cands": [["1", 1, 2, 6.0, 0.88, True, 30], ["2", 2, 1, 3.0, 0.91, False, 30], ["3", 3, None, 1.0, 0.5,
                                                                                        False, 30]]}
    feats = row_features(row)
    assert feats["visible"] == 0.5 and row_features(row | {"features": {"coverage": 0.75}})["visible"] == 1.0
    q = Q(np.array([1, 2, 3]), np.array([1.0, 2, 3]), np.array([2.0, 1, np.inf]), np.array([6.0, 3, 1]),
          np.array([.88, .91, .5]), np.array([True, False, False]), feats)
    m = Fitted("convex_auto", coefs=coefs)
    z = -1.0 + 2.0 * feats["bm25_ratio"] + 0.75
    assert m.alphas([q])[0] == pytest.approx(0.5 / (1 + math.exp(-z)))


def test_ties_are_deterministic_whatever_the_input_order():
    rows = [("7", 1, None, 2.0, 0.5), ("3", None, 1, 0.0, 0.9), ("12", 2, 2, 1.0, 0.7)]
    for params in (FusionParams(mode="convex", convex_bm25_weight=0.5),
                   FusionParams(mode="rrf", bm25_adaptive=False)):
        orders = {tuple(n.node.node_id for n in fuse(_cands(r), params)[0]) for r in (rows, rows[::-1])}
        assert len(orders) == 1
    # convex α = ½: 7 → ½·1 + ½·0 = ½, 3 → ½·0 + ½·1 = ½ (tie, 3 < 7), 12 → ½·½ + ½·½ = ½ (tie: all equal)
    assert [n.node.node_id for n in fuse(_cands(rows), FusionParams(convex_bm25_weight=0.5))[0]] == ["3", "7", "12"]


def test_one_route_only():
    only_bm25 = _cands([("1", 1, None, 3.0, 0.0), ("2", 2, None, 1.0, 0.0)])
    only_bm25.cosine = None  # vector route off (model mismatch): BM25's order, weight 1
    fused, w = fuse(only_bm25, FusionParams())
    assert [n.node.node_id for n in fused] == ["1", "2"] and w == 1.0
    assert fused[0].node.metadata["similarity"] is None
    assert fuse(Candidates(), FusionParams()) == ([], 1.0)


# ---------------------------------------------------------------------------------------------- real engine
DOCS = {
    "长江.txt": "长江是中国第一长河，全长约六千三百公里，流经青海、西藏、四川、湖北等地，最终注入东海。",
    "黄河.txt": "黄河是中国第二长河，发源于青海巴颜喀拉山，流经九个省区，在山东注入渤海。",
    "北京.txt": "北京是中华人民共和国的首都，也是全国的政治中心和文化中心，有故宫和长城。",
    "上海.txt": "上海位于长江入海口，是中国最大的经济中心城市，港口吞吐量世界第一。",
    "模型.txt": "向量检索用模型把文档变成向量，再按余弦相似度找出与问题最接近的文档。",
    "公司.txt": "公司的客服电话是 400-800-1234，工作时间为每天九点到十八点。",
    "天气.txt": "今天天气很好，我们去公园散步，看到湖边的柳树已经发芽了。",
    "河流.txt": "中国的河流众多，其中长江和黄河是最重要的两条大河，被称为母亲河。",
}
QUESTION = "长江最后流入哪里"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from pipeline.engine import Engine
    from store.config_store import ConfigStore
    from store.db import Database
    from tests.tiny_models import make_tiny_bert_embedding

    root = tmp_path_factory.mktemp("fusion")
    model = make_tiny_bert_embedding(root / "tiny-emb")
    data = root / "data"
    data.mkdir()
    db = Database(data / "app.db")
    ConfigStore(db).save({"embedding_model_path": str(model), "recall_size": 3})  # short lists → misses
    db.close()
    e = Engine(data)
    src = root / "src"
    src.mkdir()
    items = []
    for name, text in DOCS.items():
        (src / name).write_text(text, encoding="utf-8")
        items.append((name, src / name))
    e.upload(items)
    assert e.wait_idle(120)
    yield e
    e.close()


def _route_lists(engine, question):
    """Both routes' full lists (recall = every chunk): each chunk's own score on each route."""
    from llama_index.core.schema import QueryBundle

    c = engine.components
    hybrid = c.retrieval.stages(engine.settings, c.docs.counts()["chunks"]).fusion
    qb = QueryBundle(question, embedding=c.models.embedding.embed_model.get_query_embedding(question))
    bm25 = {x.node.node_id: x.score for x in hybrid.bm25_retriever.retrieve(qb)}
    vec = {x.node.node_id: x.score for x in hybrid.vector_retriever.retrieve(qb)}
    return bm25, vec


@pytest.mark.slow
def test_missing_chunk_gets_its_real_score_from_that_route(engine):
    res = engine.retrieve(QUESTION)
    metas = [n.node.metadata for n in res.fused]
    assert len(res.bm25) <= 3 and len(res.vector) <= 3
    only_bm25 = [m for m in metas if m["vector_rank"] is None]
    only_vec = [m for m in metas if m["bm25_rank"] is None]
    assert only_bm25 and only_vec, "the hand-made KB should give chunks that one route missed"
    bm25_full, vec_full = _route_lists(engine, QUESTION)
    for n in res.fused:
        m = n.node.metadata
        # the score a route gives the chunk when it does return it (BM25: 0 when no query word occurs)
        assert m["bm25_score"] == pytest.approx(bm25_full.get(n.node.node_id, 0.0), abs=1e-5)
        assert m["similarity"] == pytest.approx(vec_full[n.node.node_id], abs=1e-5)
    # and independently of the stored vectors: the cosine of a re-embedded passage text
    emb = engine.components.models.embedding.embed_model
    q = np.asarray(emb.get_query_embedding(QUESTION))
    for n in res.fused:
        if n.node.metadata["vector_rank"] is None:
            p = np.asarray(emb.get_text_embedding(n.node.get_content()))
            cos = float(p @ q / (np.linalg.norm(p) * np.linalg.norm(q)))
            assert n.node.metadata["similarity"] == pytest.approx(max(0.0, cos), abs=1e-4)


@pytest.mark.slow
def test_trace_shows_fused_and_both_routes(engine):
    from pipeline import events as ev

    tr = ev.trace_payload(engine.retrieve(QUESTION))
    assert tr["fusion"]["mode"] == engine.settings.fusion_mode
    assert 0.0 <= tr["fusion"]["bm25_weight"] <= 1.0 and set(tr["fusion"]["features"]) >= {"bm25_ratio"}
    row = tr["fused"][0]
    assert {"fused_score", "bm25_rank", "bm25_score", "vector_rank", "similarity", "length_prior"} <= set(row)
    # the fragment prior's term, from the chunk's real length and the β / cap of the profile the engine runs on
    lp = engine.components.models.calibration.profile.fusion.length_prior["minmax"]
    res = engine.retrieve(QUESTION)
    for n in res.fused:
        want = length_prior([fragment_length(n)], lp.beta, lp.cap)[0]
        assert n.node.metadata["length_prior"] == pytest.approx(want)
    dbg = engine.search(QUESTION, 5)
    assert dbg["fusion"]["mode"] == engine.settings.fusion_mode
    assert all(r["bm25_score"] is not None and r["similarity"] is not None for r in dbg["fused"])


@pytest.mark.slow
def test_the_engine_weighs_bm25_by_what_it_can_see(engine):
    """A question with words no chunk holds (潜水艇, 游到): the engine's α is the profile's α model times the
    visible share, and the trace shows the share among the fusion's features."""
    from pipeline import events as ev
    from pipeline.retrieval.lexical import content_terms

    q = "潜水艇沿着长江游到哪里"
    res = engine.retrieve(q)
    f = res.fusion_features
    c = engine.components
    held = {t for text in DOCS.values() for t in c.tokenizer(text)}
    assert {"潜水艇"} <= set(content_terms(c.tokenizer(q))) - held and "长江" in held
    assert 0 < f["visible"] < 1
    coefs = dict(c.models.calibration.profile.fusion.alpha_model["minmax"])
    assert res.fusion_mode == "convex" and res.bm25_weight == pytest.approx(auto_weight(f, coefs) * f["visible"])
    assert ev.trace_payload(res)["fusion"]["features"]["visible"] == pytest.approx(f["visible"], abs=1e-3)
    # The no-answer gate reads the candidates in the order of the α its thresholds were fitted on (the model's,
    # unscaled, and without the prior): scaling changes what is shown, not the evidence the gate was calibrated on
    _, out, _ = c.retrieval.recall(q, engine.settings)
    a0 = auto_weight({k: v for k, v in out.features.items() if k != "visible"}, coefs)
    meta = [n.node.metadata for n in out.evidence]
    want = convex_scores(np.array([m["bm25_score"] for m in meta]), np.array([m["similarity"] for m in meta]), a0)
    assert [m["fused_score"] - (m["length_prior"] or 0.0) for m in meta] == pytest.approx(list(want))
    assert list(want) == sorted(want, reverse=True) and out.bm25_weight == pytest.approx(a0 * f["visible"])
    # with the multi-query's phrasings BM25 searches their words too: the share is that of what it searched
    _, expanded, _ = c.retrieval.recall(q, engine.settings, expansions=["长江最终注入东海"])
    assert f["visible"] < expanded.features["visible"] < 1
    seen = engine.retrieve("长江最终注入哪里")  # 长江 最终 注入: every content word is in the documents
    assert seen.fusion_features["visible"] == 1.0
    assert seen.bm25_weight == pytest.approx(auto_weight(seen.fusion_features, coefs))
    # a fixed weight is not scaled, so the share is not measured (and the trace does not claim the weight shrank)
    fixed = engine.settings.model_copy(update={"convex_auto_weight": False, "convex_bm25_weight": 0.3})
    _, kept, _ = c.retrieval.recall(q, fixed)
    assert "visible" not in kept.features and kept.bm25_weight == pytest.approx(0.3)
    from ui.render import fusion_title
    assert "库中出现" not in fusion_title({"mode": "convex", "bm25_weight": 0.3, "features": kept.features})


@pytest.mark.slow
def test_the_gate_reads_the_order_without_the_prior(engine):
    """The fragment prior orders what is shown; the gate's features come from the prior-free order, so they are
    the same with the prior on or off."""
    svc = engine.components.retrieval
    q = "长江最终注入哪里"  # every word in the documents: the α is the model's as it is (see the test above)
    on = engine.settings
    off = on.model_copy(update={"convex_length_prior": False})
    _, f_on, _ = svc.recall(q, on)
    _, f_off, _ = svc.recall(q, off)
    assert any(n.node.metadata["length_prior"] for n in f_on.fused)
    assert [n.node.node_id for n in f_on.evidence] == [n.node.node_id for n in f_off.fused]
    assert svc.gate_features(q, f_on) == svc.gate_features(q, f_off)
    # On these few short documents the prior happens not to reorder anything, so the lines above alone could not
    # tell `evidence` from `fused`. Reordering one list and not the other does: the order matters to the gate,
    # and it is the evidence order it reads.
    import dataclasses

    flipped = f_off.fused[::-1]
    assert svc.gate_features(q, dataclasses.replace(f_off, evidence=flipped)) != \
        svc.gate_features(q, f_off)
    assert svc.gate_features(q, dataclasses.replace(f_off, fused=flipped, evidence=f_off.fused)) == \
        svc.gate_features(q, f_off)


@pytest.mark.slow
def test_mode_switch_takes_effect_without_reload(engine):
    reload_ms, emb = engine.last_reload_ms, engine.components.models.embedding
    try:
        out = engine.update_settings({"fusion_mode": "rrf", "bm25_adaptive": False})
        assert set(out["immediate"]) == {"fusion_mode", "bm25_adaptive"} and not out["need_reload"]
        res = engine.retrieve(QUESTION)
        assert res.fusion_mode == "rrf"
        for n in res.fused:
            m = n.node.metadata
            want = sum(1 / (60 + r) for r in (m["bm25_rank"], m["vector_rank"]) if r is not None)
            assert n.score == pytest.approx(want)
        engine.update_settings({"fusion_mode": "convex", "convex_auto_weight": False, "convex_bm25_weight": 1.0,
                                "convex_length_prior": False})
        res = engine.retrieve(QUESTION)
        assert res.fusion_mode == "convex" and res.bm25_weight == 1.0
        bm25_order = [n.node.node_id for n in res.bm25]
        assert [n.node.node_id for n in res.fused][:len(bm25_order)] == bm25_order  # α = 1 → BM25's order
        assert all(n.node.metadata["length_prior"] is None for n in res.fused)
        engine.update_settings({"convex_length_prior": True})  # the prior back on: in the very next question
        assert all(n.node.metadata["length_prior"] is not None for n in engine.retrieve(QUESTION).fused)
    finally:
        engine.update_settings({"fusion_mode": "convex", "convex_auto_weight": True, "bm25_adaptive": True,
                                "convex_bm25_weight": 0.25, "convex_length_prior": True})
    assert engine.last_reload_ms == reload_ms and engine.components.models.embedding is emb  # no reload


@pytest.mark.slow
def test_invalid_mode_is_refused_with_a_clear_message(engine):
    from pipeline.settings import SettingsError

    with pytest.raises(SettingsError) as err:
        engine.update_settings({"fusion_mode": "magic"})
    assert "融合方式" in err.value.errors["fusion_mode"] and "rrf" in err.value.errors["fusion_mode"]


# ---------------------------------------------------------------------------------------------- offline CV
def test_cv_arithmetic_matches_the_engine(tmp_path):
    """tools.eval.fusion_cv's vectorised scoring gives the same ranks as fusion.fuse (via evaluate.rescore_dump)."""
    from pipeline.settings import Settings
    from tools.eval import evaluate, fusion_cv

    rng = np.random.default_rng(3)
    rows = []
    for qi in range(40):
        n = 12
        ids = rng.choice(1000, n, replace=False)
        br = rng.permutation(n)
        vr = rng.permutation(n)
        cands = []
        for j in range(n):
            b = int(br[j]) + 1 if br[j] < 8 else None
            v = int(vr[j]) + 1 if vr[j] < 8 else None
            if b is None and v is None:
                continue
            cands.append([str(ids[j]), b, v, round(float(rng.uniform(0, 9)), 4),
                          round(float(rng.uniform(.85, .95)), 6), bool(rng.random() < 0.15),
                          None if j == 0 else int(rng.integers(1, 500))])  # None: a verified entry
        rows.append({"q": "问题" * (qi % 7 + 1), "n_rel": 1, "features": {"coverage": float(rng.uniform())},
                     "cands": cands})
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    qs = fusion_cv.load_dump(path)

    for norm in ("minmax", "zscore"):
        for alpha in (0.0, 0.3, 1.0, None):  # None: the per-query auto weight (features recomputed from the row)
            for prior_on in (False, True):
                s = Settings(convex_norm=norm, convex_auto_weight=alpha is None, convex_bm25_weight=alpha or 0.0,
                             convex_length_prior=prior_on)
                engine_side = evaluate.rescore_dump(path, s)["routes"]["fused"]
                lp = _PACKAGED.fusion.length_prior[norm]
                fitted = fusion_cv.Fitted("c", alpha_const=alpha,
                                          coefs=None if alpha is not None else _PACKAGED.fusion.alpha_model[norm],
                                          norm=norm, prior=(lp.cap, lp.beta) if prior_on else fusion_cv.NO_PRIOR)
                cv_side = fusion_cv.score_fitted(fitted, qs)
                assert (engine_side["mrr@10"], engine_side["hit@1"]) == (cv_side["mrr@10"], cv_side["hit@1"]), \
                    (norm, alpha, prior_on)
    # with a strong prior on these random lengths the ranking really changes (the comparison above is not idle)
    strong = fusion_cv.Fitted("c", alpha_const=0.3, norm="minmax", prior=(400, 1.0))
    assert fusion_cv.fitted_ranks(strong, qs) != fusion_cv.fitted_ranks(fusion_cv.Fitted("c", alpha_const=0.3), qs)
    base = fusion_cv.baselines(qs, _PACKAGED.fusion.adaptive_rrf)
    engine_side = evaluate.rescore_dump(path, Settings())
    for r in ("bm25", "vector", "rrf", "adaptive_rrf"):
        assert engine_side["routes"][r]["mrr@10"] == base[r]["mrr@10"], r
    rows[0]["cands"] = [r[:6] for r in rows[0]["cands"]]  # a dump from before the prior is refused, clearly
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match="before the length prior"):
        fusion_cv.load_dump(path)


def _synthetic_set(rng, n_q: int, vector_better: bool) -> list:
    """Questions where the hit sits high on one route (vector_better chooses which) and the routes disagree."""
    from tools.eval.fusion_cv import Q

    out = []
    for _ in range(n_q):
        n = 20
        ids = rng.choice(10_000, n, replace=False).astype(np.int64)
        rb, rv = rng.permutation(n) + 1.0, rng.permutation(n) + 1.0
        sb = np.sort(rng.uniform(1, 9, n))[::-1][(rb - 1).astype(int)]
        sc = np.sort(rng.uniform(.8, .95, n))[::-1][(rv - 1).astype(int)]
        hit = np.zeros(n, bool)
        hit[int(np.argmin(rv if vector_better else rb) if rng.random() < .7 else rng.integers(n))] = True
        f = {k: float(rng.normal()) for k in ("bm25_ratio", "coverage", "agree3", "agree10", "dense_margin",
                                               "dense_spread", "cos1", "qlen")}
        f["cos1"] = 1.0 if vector_better else 0.0  # a feature that tells the kinds apart
        out.append(Q(ids, rb, rv, sb, sc, hit, f))
    return out


@pytest.mark.slow  # a full cross-validated fit: ~90 s of CPU on a busy 2-core machine
def test_cv_never_fits_on_the_left_out_set():
    """--cv: the fit scored on a set is made without it — changing that set's hits leaves its fit unchanged,
    and the auto weight learns which route a kind of question needs."""
    from tools.eval import fusion_cv

    rng = np.random.default_rng(5)
    data = {"a": _synthetic_set(rng, 60, False), "b": _synthetic_set(rng, 60, True),
            "c": _synthetic_set(rng, 60, False), "d": _synthetic_set(rng, 60, True)}
    res = fusion_cv.cross_validate(data, norms=("minmax",))
    flipped = dict(data)
    flipped["a"] = [fusion_cv.Q(q.ids, q.rb, q.rv, q.sb, q.sc, ~q.hit, q.f) for q in data["a"]]
    res2 = fusion_cv.cross_validate(flipped, norms=("minmax",))
    assert res["sets"]["a"]["fitted"] == res2["sets"]["a"]["fitted"]  # a's own fold ignores a
    assert res["sets"]["b"]["fitted"] != res2["sets"]["b"]["fitted"]  # the other folds train on it
    w = fusion_cv.fit_all(data)["minmax"]
    assert w["cos1"] < 0  # "vector kind" questions get a smaller BM25 share
    alpha = {s: res["sets"][s]["routes"]["convex_auto/minmax"]["mean_alpha"] for s in data}
    assert max(alpha["b"], alpha["d"]) < min(alpha["a"], alpha["c"])  # learnt without seeing the scored set


def _fragment_set(rng, n_q: int, fragments: bool) -> list:
    """Questions whose vector top-1 is (fragments=True) a short non-hit fragment echoing the question, with the
    hit a long chunk just below it; without fragments every chunk is long and the hit leads the vector route.
    BM25 is flat, so whatever α the fit picks, only the cosine and the prior decide."""
    from tools.eval.fusion_cv import Q

    out = []
    for _ in range(n_q):
        n = 12
        ids = rng.choice(10_000, n, replace=False).astype(np.int64)
        rb, rv = rng.permutation(n) + 1.0, np.arange(1, n + 1, dtype=float)
        sb = np.full(n, 3.0)  # BM25 flat: no preference, so only the cosine and the prior order them
        sc = np.linspace(0.95, 0.85, n)
        hit = np.zeros(n, bool)
        hit[1 if fragments else 0] = True
        ln = rng.integers(250, 400, n).astype(float)
        if fragments:
            ln[0] = 12.0
        f = {k: 0.0 for k in ("bm25_ratio", "coverage", "agree3", "agree10", "dense_margin", "dense_spread",
                              "cos1", "qlen")}
        out.append(Q(ids, rb, rv, sb, sc, hit, f, ln))
    return out


def test_cv_chooses_the_length_prior_on_the_training_sets_only():
    """The prior is chosen inside each fold: sets whose vector top-1 is a short fragment teach β > 0, and the
    left-out fragment set is then ranked right; with no fragments anywhere no prior is chosen."""
    from tools.eval import fusion_cv

    rng = np.random.default_rng(11)
    data = {"a": _fragment_set(rng, 30, True), "b": _fragment_set(rng, 30, True), "c": _fragment_set(rng, 30, True)}
    grid = [fusion_cv.NO_PRIOR, (100, 0.1), (100, 0.5)]
    res = fusion_cv.cross_validate(data, norms=("minmax",), grid=grid)
    for s in data:
        got = res["sets"][s]["routes"]
        assert res["sets"][s]["fitted"]["convex_auto/minmax"]["length_prior"]["beta"] > 0
        assert got["convex_auto/minmax"]["hit@1"] == 1.0 > got["vector"]["hit@1"] == 0.0
        assert got["convex_auto_noprior/minmax"]["hit@1"] < 1.0
    plain = {s: _fragment_set(rng, 30, False) for s in "abc"}
    res = fusion_cv.cross_validate(plain, norms=("minmax",), grid=grid)
    assert all(r["fitted"]["convex_auto/minmax"]["length_prior"]["beta"] == 0.0 for r in res["sets"].values())


def test_leaving_a_family_out_fits_on_the_other_families_only():
    """--families: every set of the left-out family is scored by one fit made without any of them. Two fragment
    sets form a family: left out together, their fit sees only the plain family and learns no prior, although
    left out one at a time each set's fit learns it from its sibling."""
    from tools.eval import fusion_cv

    rng = np.random.default_rng(11)
    data = {"xquad_zh": _fragment_set(rng, 30, True), "cmrc_trial": _fragment_set(rng, 30, True),
            "dureader_dev": _fragment_set(rng, 30, False)}
    groups = fusion_cv.family_groups(list(data) + ["mine"])
    assert groups == {"encyclopedic": ["xquad_zh", "cmrc_trial"], "web": ["dureader_dev"], "mine": ["mine"]}
    grid = [fusion_cv.NO_PRIOR, (100, 0.1), (100, 0.5)]
    by_set = fusion_cv.cross_validate(data, norms=("minmax",), grid=grid)
    by_family = fusion_cv.cross_validate(data, norms=("minmax",), grid=grid, groups=fusion_cv.family_groups(data))
    for s in ("xquad_zh", "cmrc_trial"):
        assert by_set["sets"][s]["fitted"]["convex_auto/minmax"]["length_prior"]["beta"] > 0
        assert by_family["sets"][s]["fitted"]["convex_auto/minmax"]["length_prior"]["beta"] == 0.0
        assert by_family["sets"][s]["left_out_with"] == "encyclopedic"
        assert by_family["sets"][s]["routes"]["convex_auto/minmax"]["hit@1"] < 1.0
    assert by_family["sets"]["xquad_zh"]["fitted"] == by_family["sets"]["cmrc_trial"]["fitted"]


def test_paired_bootstrap_and_smoothed_gain_exact():
    """The noise report (paired differences, their standard error) and the smoothed training objective, by hand."""
    from tools.eval import fusion_cv

    b = fusion_cv.paired_bootstrap([1.0, 0.5, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5])
    d = np.array([0.5, 0.0, -0.5, 0.5])  # mean 0.125, sample sd sqrt(0.546875/3)
    assert b["diff"] == 0.125 and b["se"] == round(float(d.std(ddof=1) / 2), 4)
    assert b["ci95"][0] <= b["diff"] <= b["ci95"][1] and -0.5 <= b["ci95"][0] and b["ci95"][1] <= 0.5
    v = fusion_cv.versus([1, 2, 11], [2, 2, 1])  # RR 1, .5, 0 vs .5, .5, 1; Hit@1 1, 0, 0 vs 0, 0, 1
    assert v["mrr@10"]["diff"] == round((0.5 + 0 - 1) / 3, 4) and v["hit@1"]["diff"] == 0.0
    # one question, ranks over the α grid: hit at rank 1 for α ≤ .5, rank 2 above
    ranks = np.where(fusion_cv.ALPHAS <= 0.5, 1.0, 2.0)[None, :]
    assert fusion_cv.set_gain(ranks, np.array([0.5]), None, 0.0) == 1.0  # nearest grid point
    w = np.exp(-0.5 * ((fusion_cv.ALPHAS - 0.5) / 0.1) ** 2)
    want = float((w * np.where(fusion_cv.ALPHAS <= 0.5, 1.0, 0.5)).sum() / w.sum())
    assert fusion_cv.set_gain(ranks, np.array([0.5]), None, 0.0, smooth=0.1) == pytest.approx(want)
    # against the better route (MRR .75, Hit@1 .5): ½(ΔMRR + ΔHit@1)
    assert fusion_cv.set_gain(ranks, np.array([0.5]), (0.75, 0.5), 0.0) == pytest.approx(0.5 * (0.25 + 0.5))


def test_families_weigh_alike_when_asked():
    """set_weights: "sets" counts every training set alike; "families" gives each family (devsets.FAMILIES) one
    share split among its sets — two encyclopedic sets then no longer outvote one web set."""
    from tools.eval import fusion_cv

    names = ["xquad_zh", "cmrc_trial", "dureader_dev"]
    assert fusion_cv.set_weights(names) == {n: 1 / 3 for n in names}
    assert fusion_cv.set_weights(names, "families") == {"xquad_zh": 0.25, "cmrc_trial": 0.25, "dureader_dev": 0.5}
    with pytest.raises(ValueError, match="weigh"):
        fusion_cv.set_weights(names, "questions")
    # one question per set, its first-hit rank over the α grid: the encyclopedic sets want α ≥ .6 (rank 1, else 3),
    # the web set α ≤ .4 (rank 1, else 11: out of MRR@10)
    enc = np.where(fusion_cv.ALPHAS >= 0.6, 1.0, 3.0)[None, :]
    web = np.where(fusion_cv.ALPHAS <= 0.4, 1.0, 11.0)[None, :]
    train = {"xquad_zh": enc, "cmrc_trial": enc, "dureader_dev": web}
    assert fusion_cv.fit_constant(train) >= 0.6  # sets alike: (1 + 1 + 0) / 3 beats (⅓ + ⅓ + 1) / 3
    assert fusion_cv.fit_constant(train, fusion_cv.set_weights(train, "families")) <= 0.4  # ½·1 + ½·0 < ½·⅓ + ½·1


def test_the_alpha_model_reads_only_the_inputs_named(monkeypatch):
    """--features: the α model is fitted on the inputs named only; fit_all still writes every input the engine
    computes (0 for the others), so the profile's α model keeps its shape. Here cos1 tells the two kinds of question
    apart and qlen is noise: read alone, qlen cannot give them different shares."""
    from tools.eval import fusion_cv

    monkeypatch.setattr(fusion_cv, "PRIOR_GRID", [fusion_cv.NO_PRIOR])  # the α model alone: fast
    rng = np.random.default_rng(3)
    data = {"a": _synthetic_set(rng, 30, False), "b": _synthetic_set(rng, 30, True)}
    fitted = fusion_cv.fit_all(data, names=["cos1"])
    assert fitted["inputs_read"] == ["cos1"] and fitted["features"] == fusion_cv.AUTO_FEATURES
    with_cos = fitted["minmax"]
    noise = fusion_cv.fit_all(data, names=["qlen"])["minmax"]
    for w in (with_cos, noise):
        assert list(w) == [*fusion_cv.AUTO_FEATURES, "bias"]
    assert with_cos["cos1"] < 0 and all(v == 0.0 for k, v in with_cos.items() if k not in ("cos1", "bias"))
    assert noise["cos1"] == 0.0 and all(v == 0.0 for k, v in noise.items() if k not in ("qlen", "bias"))

    def spread(w):  # mean α of the vector kind minus the keyword kind under the fit
        m = fusion_cv.Fitted("convex_auto", coefs=w)
        return float(m.alphas(data["a"]).mean() - m.alphas(data["b"]).mean())

    assert spread(with_cos) > 0.3 and abs(spread(noise)) < spread(with_cos) / 3
    res = fusion_cv.cross_validate(data, norms=("minmax",), methods=("convex_auto",), names=["cos1"])
    assert set(res["sets"]["a"]["fitted"]["convex_auto/minmax"]["coefs"]) == {"cos1", "bias"}
    with pytest.raises(SystemExit):
        fusion_cv.main(["--features", "cos1,no_such_input", "x.jsonl"])
