"""BM25 on Chinese, identifiers, RRF arithmetic and ties, chunker contract, rerank fallback."""
from __future__ import annotations

import numpy as np
import pytest
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.retrievers.bm25 import BM25Retriever

from pipeline.ingestion.chunking import split_text
from pipeline.models.tokenize_zh import ChineseTokenizer
from pipeline.retrieval.bm25 import BM25Index
from pipeline.retrieval.fusion import rrf_fuse
from pipeline.retrieval.rerank import SKIPPED_MSG, CrossEncoder, SafeRerank, rerank_status

CORPUS = {
    1: "北京是中华人民共和国的首都，也是全国的政治中心和文化中心。",
    2: "上海位于长江入海口，是中国最大的经济中心城市。",
    3: "今天天气很好，我们去公园散步吧。",
    4: "故障单 PPR-9087 记录了 v1.2.3 版本中 API_KEY 泄露的问题。",
    5: "参考文献著录格式遵循 GB/T 7714-2015 国家标准。",
}


@pytest.fixture(scope="module")
def tok():
    return ChineseTokenizer()


def _lookup(ids):
    return {i: {"chunk_id": i, "doc_id": i, "chunk_index": 0, "text": CORPUS[i], "page": None,
                "source": "text", "file_name": f"doc{i}.txt", "status": "ready"} for i in ids if i in CORPUS}


def _index(tok, tmp_path, k1=1.5, b=0.75):
    idx = BM25Index(tmp_path / "bm25", lambda ids: [(i, tok(t)) for i, t in CORPUS.items() if ids is None or i in ids])
    idx.rebuild(k1, b)
    return idx


def test_stock_bm25_scores_chinese_zero():
    """The problem we solve: LlamaIndex's default BM25 tokenizer is English, so Chinese scores 0."""
    nodes = [TextNode(id_=str(i), text=t) for i, t in CORPUS.items()]
    r = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=3)
    hits = r.retrieve("中国的首都是哪里")
    assert all((h.score or 0) == 0 for h in hits)


def test_jieba_bm25_ranks_right_chunk(tok, tmp_path):
    r = _index(tok, tmp_path).retriever(tok, _lookup, 5)
    hits = r.retrieve("中华人民共和国的首都在哪里")
    assert hits and hits[0].score > 0 and hits[0].node.node_id == "1"
    hits = r.retrieve("天气")  # search mode finds 天气 inside 今天天气
    assert hits[0].node.node_id == "3"


@pytest.mark.parametrize("ident,chunk", [("PPR-9087", "4"), ("v1.2.3", "4"), ("API_KEY", "4"),
                                         ("GB/T 7714-2015", "5")])
def test_identifiers_stay_whole(tok, tmp_path, ident, chunk):
    assert ident.lower() in tok(f"请查一下 {ident} 的情况")
    hits = _index(tok, tmp_path).retriever(tok, _lookup, 5).retrieve(ident)
    assert hits[0].node.node_id == chunk


def test_user_dictionary_is_loaded(tmp_path):
    d = tmp_path / "userdict.txt"
    d.write_text("量子纠缠态 10 n\n", encoding="utf-8")
    assert "量子纠缠态" in ChineseTokenizer(user_dict=d)("研究量子纠缠态的性质")


def test_bm25_soft_delete_and_persist(tok, tmp_path):
    idx = _index(tok, tmp_path)
    idx.soft_delete([1])
    hits = idx.retriever(tok, _lookup, 5).retrieve("首都")
    assert all(h.node.node_id != "1" for h in hits)
    # the segments on disk are opened by the next start; k1/b act at question time (nothing to rebuild)
    idx2 = BM25Index(tmp_path / "bm25", lambda ids: [(i, tok(t)) for i, t in CORPUS.items() if ids is None or i in ids])
    assert idx2.open(1.5, 0.75, set(CORPUS)) == "followed"
    assert idx2.retriever(tok, _lookup, 5).retrieve("首都")[0].node.node_id == "1"
    assert idx2.open(1.2, 0.75, set(CORPUS)) == "followed"


def test_bm25_k1_b_change_scores(tok, tmp_path):
    a = _index(tok, tmp_path, 1.5, 0.75).retriever(tok, _lookup, 5).retrieve("首都 中心")
    b = _index(tok, tmp_path, 0.5, 0.1).retriever(tok, _lookup, 5).retrieve("首都 中心")
    assert a[0].score != pytest.approx(b[0].score)


def test_empty_corpus_is_guarded(tok, tmp_path):
    idx = BM25Index(tmp_path / "e", lambda ids: [])
    idx.rebuild(1.5, 0.75)
    assert idx.retriever(tok, _lookup, 5) is None
    assert idx.open(1.5, 0.75, set()) == "followed" and idx.view.n == 0


def _nws(ids, scores=None):
    return [NodeWithScore(node=TextNode(id_=str(i), text=f"t{i}", metadata={}), score=(scores or {}).get(i, 1.0))
            for i in ids]


def test_rrf_arithmetic_exact():
    bm25 = _nws([10, 20, 30], {10: 9.0, 20: 5.0, 30: 1.0})
    vec = _nws([20, 40], {20: 0.9, 40: 0.8})
    fused = rrf_fuse(bm25, vec, rrf_k=60)
    got = {n.node.node_id: n for n in fused}
    assert got["20"].score == pytest.approx(1 / 62 + 1 / 61)
    assert got["10"].score == pytest.approx(1 / 61)
    assert got["40"].score == pytest.approx(1 / 62)
    assert got["30"].score == pytest.approx(1 / 63)
    assert [n.node.node_id for n in fused] == ["20", "10", "40", "30"]
    m = got["20"].node.metadata
    assert (m["bm25_rank"], m["vector_rank"], m["bm25_score"], m["similarity"]) == (2, 1, 5.0, 0.9)
    assert got["40"].node.metadata["bm25_rank"] is None
    assert got["10"].node.metadata["vector_rank"] is None
    assert m["rrf_score"] == pytest.approx(1 / 62 + 1 / 61)


def test_rrf_weights():
    fused = rrf_fuse(_nws([1]), _nws([2]), rrf_k=60, bm25_weight=0.5, vector_weight=1.0)
    assert [n.node.node_id for n in fused] == ["2", "1"]
    assert fused[1].score == pytest.approx(0.5 / 61)


def test_rrf_ties_are_deterministic():
    # 7 and 3 both get 1/61: tie broken by chunk_id ascending, whatever the input order.
    a = rrf_fuse(_nws([7]), _nws([3]))
    b = rrf_fuse(_nws([3]), _nws([7]))
    assert [n.node.node_id for n in a] == [n.node.node_id for n in b] == ["3", "7"]


def test_rerank_skipped_and_fallback():
    nodes = _nws([1, 2, 3, 4])
    out = SafeRerank(None, top_n=2).postprocess_nodes(nodes, query_str="q")
    status = rerank_status(out)
    assert [n.node.node_id for n in out] == ["1", "2"] and status == {"status": "skipped", "msg": SKIPPED_MSG}

    class Broken:
        top_n = 2

        def postprocess_nodes(self, *a, **k):
            raise RuntimeError("boom")

    out = SafeRerank(CrossEncoder(Broken(), "x"), top_n=3).postprocess_nodes(nodes, query_str="q")
    status = rerank_status(out)
    assert [n.node.node_id for n in out] == ["1", "2", "3"] and status["status"] == "fallback"
    assert "boom" in status["msg"]


def test_tiny_cross_encoder_reranks(tmp_path):
    from pipeline.retrieval.rerank import load_cross_encoder
    from tests.tiny_models import make_tiny_cross_encoder

    d = make_tiny_cross_encoder(tmp_path / "ce")
    r = SafeRerank(load_cross_encoder(d, 2), top_n=2)
    out = r.postprocess_nodes(_nws([1, 2, 3]), query_str="问题")
    status = rerank_status(out)
    assert status["status"] == "ok" and len(out) == 2
    assert all(isinstance(n.score, float) for n in out)
    # scores are the cross-encoder's, sorted descending
    assert out[0].score >= out[1].score


def test_chunker_limits_overlap_and_determinism():
    text = "".join(f"这是第{i}句话，内容用于测试切块的效果。" for i in range(200))
    spans = split_text(text, 100, 20)
    assert all(e - s <= 100 for s, e in spans)
    assert spans == split_text(text, 100, 20)
    for (_, e1), (s2, _) in zip(spans, spans[1:]):
        assert 0 <= e1 - s2 <= 20  # overlap never exceeds chunk_overlap
        assert text[e1 - 1] in "。"  # cut at a sentence end
    # full coverage: every character is in some chunk
    covered = np.zeros(len(text), bool)
    for s, e in spans:
        covered[s:e] = True
    assert covered.all()


def test_chunker_hard_cut_without_punctuation_and_surrogates():
    text = "😀" * 500 + "字" * 333
    spans = split_text(text, 120, 10)
    assert all(e - s <= 120 for s, e in spans)
    assert "".join(text[s:e] for s, e in spans).count("😀") >= 500


def test_adaptive_bm25_weight():
    from pipeline.calibration import profile_for
    from pipeline.models.paths import PACKAGED_MODEL_ID
    from pipeline.retrieval.fusion import adaptive_bm25_weight

    rule = profile_for(PACKAGED_MODEL_ID).profile.fusion.adaptive_rrf  # slope and floor of the calibration profile
    ADAPTIVE_SLOPE, ADAPTIVE_FLOOR = rule.slope, rule.floor
    w = lambda top, cap: adaptive_bm25_weight(top, cap, ADAPTIVE_SLOPE, ADAPTIVE_FLOOR)  # noqa: E731

    assert w([3.0, 1.0], 1.0) == 1.0  # decisive BM25: full weight
    assert w([1.5, 1.0], 1.0) == pytest.approx(0.5 * ADAPTIVE_SLOPE)
    assert w([1.05, 1.0], 1.0) == ADAPTIVE_FLOOR  # flat: floor
    assert w([2.0], 0.7) == 0.7  # single lexical hit
    assert w([3.0, 1.0], 0.0) == 0.0  # the setting caps it
