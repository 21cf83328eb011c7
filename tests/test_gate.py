"""The adaptive no-answer gate: its pure decision, its evidence, the stored per-KB background, and the engine path.

Unit parts use hand-made features and a real BM25 segment; the background store is real SQLite; the engine parts
run the real packaged embedding model over real documents.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from llama_index.core.schema import NodeWithScore, TextNode
from sqlalchemy import text

from pipeline.retrieval.bm25 import SegmentView
from pipeline.retrieval.bm25_segments import Segment
from pipeline.retrieval.gate import ANSWER, REFUSE, WEAK, GateModel, decide
from pipeline.retrieval.gate_background import MIN_SIM_SCALE, Background, GateBackground, summarize
from pipeline.retrieval.gate_features import GateFeatures, measure
from pipeline.retrieval.lexical import TermWeights, content_bigrams, content_terms, coverage
from store.db import Database
from store.gate_stats import GateStatsStore
from tests.live import engine_with_texts
from tests.test_support import DOCS

# Marked slow: tests on the `engine` fixture — the packaged e5 model (real quality, minutes on 2 cores).

BG = Background(probes=64, sim_median=0.85, sim_scale=0.01, cov_median=0.1, cov_scale=0.1, sent_median=0.84)
# quick = -6 + 100·(sim − 0.85) + 5·coverage·phrase + 2·top_agreement;
# full  = -6 + 100·(sim − 0.85) + 100·(best sentence − 0.84) + 5·coverage·phrase + 2·top_agreement
MODEL = GateModel(coef=(1.0, 1.0, 5.0, 2.0), bias=-6.0, refuse_below=-2.0, answer_at=0.5,
                  quick_coef=(1.0, 5.0, 2.0), quick_bias=-6.0, quick_refuse_below=-2.5, quick_answer_at=0.0,
                  sure_refuse=-4.0, sure_answer=2.0)


def feats(sim: float, cov: float = 0.0, phrase: float = 0.0, top_agree: float = 0.0) -> GateFeatures:
    return GateFeatures(max_similarity=sim, similarity_gap=0.0, similarity_gap50=0.0, coverage=cov,
                        phrase_coverage=phrase, coverage_vector=cov, coverage_mass=0.0, unseen=0.0, agreement=0.0,
                        top_agreement=top_agree, bm25_top=0.0, n_terms=3)


class Sentence:
    """The sentence-evidence callback, counting its calls."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


# --- the decision ------------------------------------------------------------------------------------------------
def test_quick_score_decides_clear_cases_without_the_sentence_evidence():
    sent = Sentence(0.99)
    d = decide(feats(0.88, 0.9, 0.8, 1), BG, 0.5, model=MODEL, sentence=sent)  # quick -6+3+3.6+2 = 2.6 ≥ 2
    assert d.outcome == ANSWER and d.stage == "quick" and pytest.approx(d.score) == 2.6
    d = decide(feats(0.85, 0.1, 0.0), BG, 0.5, model=MODEL, sentence=sent)     # quick -6 < -4
    assert d.outcome == REFUSE and not d.hit and d.stage == "quick" and pytest.approx(d.score) == -6.0
    assert sent.calls == 0  # neither paid for embedding sentences
    assert d.trace()["stage"] == "quick" and d.trace()["best_sentence"] is None


def test_open_band_is_decided_by_the_full_model_with_the_sentence_evidence():
    f = feats(0.87, 0.6, 0.5, 1)  # quick -6+2+1.5+2 = -0.5: between sure_refuse and sure_answer
    for best, outcome, score in ((0.87, ANSWER, 2.5), (0.83, WEAK, -1.5), (0.80, REFUSE, -4.5)):
        sent = Sentence(best)
        d = decide(f, BG, 0.5, model=MODEL, sentence=sent)  # full = -0.5 + 100·(best − 0.84)
        assert (d.outcome, d.stage) == (outcome, "full") and pytest.approx(d.score) == score and sent.calls == 1
        t = d.trace()
        assert t["best_sentence"] == pytest.approx(best) and t["sentence_above"] == pytest.approx((best - 0.84) * 100)
    d = decide(feats(0.87, 0.6, 0.5, 1), BG, 0.5, model=MODEL, sentence=Sentence(0.83))
    assert d.weak and d.hit and d.reason == "资料相关度较低，请核对原文"


def test_without_sentence_evidence_the_quick_score_keeps_its_own_thresholds():
    f = feats(0.87, 0.6, 0.5, 1)  # quick -0.5: ≥ quick_refuse_below -2.5, < quick_answer_at 0 → weak
    assert decide(f, BG, 0.5, model=MODEL, sentence=Sentence(None)).outcome == WEAK
    assert decide(f, BG, 0.5, model=MODEL).stage == "quick"  # no callback (no embedding model)
    old_row = Background(probes=64, sim_median=0.85, sim_scale=0.01, cov_median=0.1, cov_scale=0.1)
    sent = Sentence(0.99)
    d = decide(f, old_row, 0.5, model=MODEL, sentence=sent)  # a background measured without sentence values
    assert d.outcome == WEAK and d.stage == "quick" and sent.calls == 0


def test_hard_floor_refuses_whatever_the_score():
    d = decide(feats(0.80, 1.0, 1.0), Background(64, 0.5, 0.01, 0.0, 0.1), 0.82, model=MODEL)
    assert d.outcome == REFUSE and d.score is None and "低于最低相似度" in d.reason


def test_adaptive_off_is_the_floor_alone():
    assert decide(feats(0.83), BG, 0.82, model=MODEL, adaptive=False).outcome == ANSWER
    assert decide(feats(0.81), BG, 0.82, model=MODEL, adaptive=False).outcome == REFUSE


def test_no_results_or_no_background():
    assert decide(feats(0.95, 1, 1), BG, 0.3, has_results=False, model=MODEL).outcome == REFUSE
    assert decide(feats(0.95), None, 0.3, model=MODEL).outcome == ANSWER  # nothing measured yet: floor only


def test_the_same_cosine_means_different_things_in_different_kbs():
    # a legal corpus: every question looks similar (background median 0.91); an encyclopedia: 0.85
    legal, wiki = Background(64, 0.91, 0.01, 0.1, 0.1), Background(64, 0.85, 0.01, 0.1, 0.1)
    f = feats(0.90, 0.6, 0.5, 1)
    assert decide(f, legal, 0.5, model=MODEL).outcome == REFUSE
    assert decide(f, wiki, 0.5, model=MODEL).outcome == ANSWER


def test_trace_payload_names_the_evidence():
    t = decide(feats(0.88, 0.9, 0.8, 1), BG, 0.5, model=MODEL).trace()
    assert t["outcome"] == "answer" and t["hit"] is True and t["weak"] is False and t["top_agreement"] == 1.0
    assert t["routes_agree"] is False  # hand-made features: the plain fact was not set
    assert t["similarity_z"] == 3.0 and t["background_median"] == 0.85 and t["coverage"] == 0.9
    assert 0.9 < t["confidence"] < 1


# --- background statistics ---------------------------------------------------------------------------------------
def test_summary_is_robust_to_a_few_on_topic_probes():
    probes = [feats(0.85 + 0.001 * (i % 5)) for i in range(60)] + [feats(0.97)] * 4  # 4 probes hit the KB
    bg = summarize(probes)
    assert bg.probes == 64 and abs(bg.sim_median - 0.852) < 0.002
    assert bg.sim_scale < 0.01  # the four outliers do not blow up the scale
    assert summarize([feats(0.9)] * 10).sim_scale == MIN_SIM_SCALE  # identical probes: the floor, not zero


def _db_with_chunks(tmp_path: Path, n: int) -> Database:
    db = Database(tmp_path / "app.db")
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO kb_document(file_name, file_type, file_size, content_md5, status, created_at)"
                          " VALUES ('a.txt', 'txt', 1, 'm', 'ready', 'now')"))
        for i in range(n):
            conn.execute(text("INSERT INTO kb_chunk(doc_id, chunk_index, text) VALUES (1, :i, 't')"), {"i": i})
    return db


def test_background_is_stored_and_refreshed_when_the_kb_changes(tmp_path):
    db = _db_with_chunks(tmp_path, 3)
    calls: list[str] = []
    snapshot = [object()]

    def probe(q: str) -> GateFeatures:
        calls.append(q)
        return feats(0.80 + 0.01 * (len(calls) % 3))

    bg = GateBackground(GateStatsStore(db), lambda: "model-a", probe, lambda: snapshot[0], probes=["甲", "乙", "丙"])
    first = bg.current()
    assert len(calls) == 3 and first.probes == 3
    row = sqlite3.connect(tmp_path / "app.db").execute(
        "SELECT fingerprint, stats FROM kb_gate_background WHERE kb_id = 1").fetchone()
    assert row[0] == "model-a|3|3|3|s" and '"sim_median"' in row[1]
    assert bg.current() is first and len(calls) == 3  # same snapshot: no probe is scored again
    # a restart over the same data: read from SQLite, not measured again
    again = GateBackground(GateStatsStore(db), lambda: "model-a", probe, lambda: snapshot[0], probes=["甲", "乙", "丙"])
    assert again.current() == first and len(calls) == 3
    # the KB changes (a new chunk, a new BM25 snapshot): measured again
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO kb_chunk(doc_id, chunk_index, text) VALUES (1, 9, 't')"))
    snapshot[0] = object()
    bg.current()
    assert len(calls) == 6
    # another embedding model: measured again
    other = GateBackground(GateStatsStore(db), lambda: "model-b", probe, lambda: snapshot[0], probes=["甲"])
    other.current()
    assert len(calls) == 7


def test_empty_kb_has_no_background(tmp_path):
    db = Database(tmp_path / "app.db")
    bg = GateBackground(GateStatsStore(db), lambda: "m", lambda q: pytest.fail("no probe on an empty KB"),
                        lambda: None, probes=["甲"])
    assert bg.current() is None


# --- lexical evidence --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from pipeline.models.tokenize_zh import ChineseTokenizer
    return ChineseTokenizer()


def test_idf_from_the_index_and_unseen_words(tokenizer):
    corpus = ["乙方逾期交货应支付违约金", "甲方逾期付款应支付违约金", "乙方保证货物质量"]
    seg = Segment.build("s", [(i, tokenizer(t)) for i, t in enumerate(corpus)])
    view = SegmentView((seg,), (np.ones(seg.size, dtype=bool),), 1.5, 0.75)
    w = view.weights()
    assert w is view.weights()  # one table per view (a change publishes a new one)
    assert w.idf("交货") > w.idf("违约金") > 0  # rarer word weighs more
    assert w.idf("梅西") == w.max_idf and w.df_of("梅西") == 0
    terms = content_terms(tokenizer("乙方逾期交货的违约金是多少？"))
    assert "的" not in terms and "多少" not in terms and "乙方" in terms
    assert coverage(terms, w, "乙方逾期交货应支付违约金") == 1.0
    assert 0 < coverage(terms, w, "甲方逾期付款应支付违约金") < 0.6
    assert w.unseen_share(["梅西", "乙方"]) > 0.5
    assert TermWeights.uniform().idf("任何词") == TermWeights.uniform().max_idf


def test_phrase_bigrams_follow_the_question_order(tokenizer):
    assert content_bigrams(tokenizer.segments("刘备三顾茅庐请的是谁？")) == ["刘备", "备三", "三顾", "顾茅", "茅庐"]
    assert content_bigrams(tokenizer.segments("是什么？")) == []


def _node(cid: str, text: str, score: float) -> NodeWithScore:
    return NodeWithScore(node=TextNode(id_=cid, text=text), score=score)


def test_features_of_one_retrieval(tokenizer):
    vec = [_node("1", "乙方逾期交货应支付违约金", 0.91)] + [_node(str(i), "无关", 0.86) for i in range(2, 12)]
    bm = [_node("1", "乙方逾期交货应支付违约金", 7.0), _node("3", "无关", 1.0)]
    q = "乙方逾期交货的违约金是多少？"
    f = measure(tokenizer(q), tokenizer.segments(q), TermWeights.uniform(), bm, vec, vec[:3])
    assert f.max_similarity == 0.91 and abs(f.similarity_gap - 0.05) < 1e-9
    assert f.coverage == 1.0 and f.coverage_vector == 1.0 and f.phrase_coverage > 0.5
    assert f.agreement == 0.4 and f.bm25_top == 7.0
    big = TermWeights({}, np.zeros(0, dtype=np.int64), 300)  # a knowledge base of 300 chunks
    f = measure(tokenizer(q), tokenizer.segments(q), big, bm, vec, vec[:3])
    assert f.top_agreement == pytest.approx(1.0, abs=1e-3)  # the fused top chunk "1" leads both routes
    other = measure(tokenizer(q), tokenizer.segments(q), big, bm, vec, [vec[5]])
    assert other.top_agreement == 0.0  # fused top outside BM25's top-3
    tiny = measure(tokenizer(q), tokenizer.segments(q), TermWeights({}, np.zeros(0, dtype=np.int64), 3), bm, vec,
                   vec[:3])
    assert tiny.top_agreement == 0.0 and tiny.routes_agree  # 3 chunks: every chunk is in both top-3s, says nothing
    empty = measure(tokenizer(q), tokenizer.segments(q), TermWeights.uniform(), [], [], [])
    assert empty.max_similarity == 0.0 and empty.coverage == 0.0


# --- through the engine (real embedding model, real documents) ---------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = engine_with_texts(tmp_path_factory.mktemp("gate"), DOCS)
    yield e
    e.close()


@pytest.mark.slow
def test_background_measured_at_ingest_and_stored(engine):
    gb = engine.components.gate_background.of(1)
    bg = gb.current()
    assert bg is not None and bg.probes == len(gb.probes) == len(bg.probe_sims)
    stored = engine.components.gate_stats.load(1)
    assert stored is not None and stored[0] == gb.fingerprint()


@pytest.mark.slow
def test_engine_answers_on_topic_and_refuses_off_topic(engine):
    on = engine.ask_sync("退货期限是几天？")
    gate = on["trace"]["gate"]
    assert gate["outcome"] in ("answer", "weak") and "7 天" in on["answer"]
    assert on["weak"] == (gate["outcome"] == "weak")
    assert gate["similarity_z"] is not None and gate["background_median"] is not None
    off = engine.ask_sync("梅西在哪一年获得了世界杯冠军？")
    assert off["trace"]["gate"]["outcome"] == "refuse" and off["sources"] == []
    assert off["answer"].startswith("根据现有资料无法回答")
    assert "gate" in off["trace"]["ms"]


@pytest.mark.slow
def test_gate_can_be_switched_to_the_floor_alone(engine):
    engine.update_settings({"adaptive_gate": False, "min_similarity": 0.0})
    try:
        r = engine.ask_sync("梅西在哪一年获得了世界杯冠军？")
        assert r["trace"]["gate"]["hit"] is True and r["trace"]["gate"].get("score") is None
    finally:
        engine.update_settings({"adaptive_gate": True, "min_similarity": engine.default_settings().min_similarity})


@pytest.mark.slow
def test_results_removed_before_the_fusion_for_gold_removed_negatives(engine):
    """tools/eval/gate_dataset's gold-removed negatives: hits dropped from both routes, then the app's own fusion."""
    rs, s = engine.components.retrieval, engine.settings
    _, plain, _ = rs.recall("退货期限是几天？", s, kb_ids=(1,))
    _, same, _ = rs.recall("退货期限是几天？", s, kb_ids=(1,), keep=lambda n: True)
    assert [n.node.node_id for n in same.fused] == [n.node.node_id for n in plain.fused]
    top = plain.fused[0].node.node_id
    _, cut, _ = rs.recall("退货期限是几天？", s, kb_ids=(1,), keep=lambda n: n.node.node_id != top)
    for lst in (cut.bm25, cut.vector, cut.fused):
        assert top not in [n.node.node_id for n in lst]
    # the rest is fused again (the order may change: min-max spans and the per-query weight see other lists)
    assert {n.node.node_id for n in cut.fused} == {n.node.node_id for n in plain.fused} - {top}


def test_gate_line_in_the_trace_names_route_agreement():
    from ui.render import render_gate

    agreed = decide(feats(0.88, 0.9, 0.8, 1), BG, 0.5, model=MODEL).trace() | {"routes_agree": True}
    assert "两路首选一致" in render_gate(agreed) and "不一致" not in render_gate(agreed)
    assert "两路首选不一致" in render_gate(agreed | {"routes_agree": False})
    assert "高出本库背景 3.0" in render_gate(agreed) and "最佳句子" not in render_gate(agreed)  # quick stage
    full = decide(feats(0.87, 0.6, 0.5, 1), BG, 0.5, model=MODEL, sentence=Sentence(0.83)).trace()
    assert "最佳句子相似度 0.830（高出背景 -1.0）" in render_gate(full)


# --- the second stage: sentence evidence -----------------------------------------------------------------------
class CountingEmbedder:
    """A deterministic stand-in for the embedding model that records what it was asked to embed."""

    def __init__(self):
        self.embedded: list[str] = []

    def get_text_embedding_batch(self, texts):
        self.embedded += texts
        return [[float(len(t)), float(t.count("退")), 1.0] for t in texts]


def test_sentence_evidence_is_the_best_sentence_and_embeds_each_sentence_once():
    from pipeline.models.vectors import TextVectors
    from pipeline.retrieval.sentence_evidence import SentenceEvidence

    emb = CountingEmbedder()
    ev = SentenceEvidence(TextVectors(emb, cache_size=3), top=2)
    nodes = [NodeWithScore(node=TextNode(text="商品七天内可退货。退款三日到账。"), score=0.9),
             NodeWithScore(node=TextNode(text="运费由买家承担。"), score=0.8),
             NodeWithScore(node=TextNode(text="第三块不读。"), score=0.7)]
    q = [0.0, 1.0, 0.0]  # points at sentences mentioning 退: cosine = count / norm
    best = ev.best(q, nodes)
    vecs = {s: np.array([len(s), s.count("退"), 1.0]) for s in ("商品七天内可退货。", "退款三日到账。", "运费由买家承担。")}
    assert best == pytest.approx(max(v[1] / np.linalg.norm(v) for v in vecs.values()), abs=1e-6)
    assert sorted(emb.embedded) == sorted(vecs)  # the top-2 chunks' sentences, the third chunk untouched
    assert ev.best(q, nodes) == pytest.approx(best) and len(emb.embedded) == 3  # cached: nothing embedded again
    ev.best(q, [NodeWithScore(node=TextNode(text="另一句。"), score=0.5)])
    assert len(ev.vectors._cache) == 3  # bounded: the oldest went
    assert ev.best(None, nodes) is None and ev.best(q, []) is None


@pytest.mark.slow
def test_engine_measures_the_sentence_evidence_in_the_open_band_only(engine):
    c = engine.components
    bg = c.gate_background.current()
    assert bg.sent_median is not None and len(bg.probe_sents) == bg.probes  # probes measured with it
    f = c.retrieval.measure_gate("退货期限是几天？", engine.settings)
    assert f.best_sentence is not None and f.best_sentence >= f.max_similarity - 0.05
    seen = []
    real = c.retrieval.sentences.best
    c.retrieval.sentences.best = lambda q, nodes: seen.append(1) or real(q, nodes)
    try:
        stages = []
        for q in ("退货期限是几天？", "梅西在哪一年获得了世界杯冠军？", "运费谁承担？", "发票怎么开？", "会员积分能换什么？"):
            gate = c.retrieval.retrieve(q, engine.settings).gate
            assert gate["stage"] in (None, "quick", "full")  # None: the hard floor decided before the model
            assert (gate["best_sentence"] is not None) == (gate["stage"] == "full")
            stages.append(gate["stage"])
        assert len(seen) == stages.count("full")  # embedded sentences only for the questions the quick score left open
        assert "quick" in stages and "full" in stages, stages  # both stages occur on these five
    finally:
        c.retrieval.sentences.best = real


def test_other_embedding_models_get_the_scale_free_one_stage_model():
    from pipeline.calibration import profile_for
    from pipeline.retrieval.gate import GateModel

    e5 = profile_for("packaged:multilingual-e5-small")
    assert e5.calibrated and GateModel.from_calibration(e5.profile.gate).two_stage
    other = profile_for("local:bge-small-zh")
    SCALE_FREE = GateModel.from_calibration(other.profile.gate)
    assert not other.calibrated and other.name == "generic" and not SCALE_FREE.two_stage
    sent = Sentence(0.99)
    wide = Background(probes=64, sim_median=0.30, sim_scale=0.08, cov_median=0.1, cov_scale=0.1, sent_median=0.3)
    d = decide(feats(0.62, 0.8, 0.8, 1), wide, 0.3, model=SCALE_FREE, sentence=sent)
    # z = (0.62 − 0.30) / 0.08 = 4: the score reads the z, not a difference on e5's scale (which would be 32)
    assert d.stage == "quick" and sent.calls == 0
    assert d.score == pytest.approx(-4.4710 + 1.1723 * 4 + 6.4433 * 0.64 + 0.8689)
