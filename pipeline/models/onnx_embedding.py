"""ONNX Runtime embedding for the packaged multilingual-e5-small (BERT encoder, mean pooling).

Why: embedding is the ingest bottleneck. On 2 cores plain torch fp32 manages ~9-10 chunks/s of
300-character Chinese text; this path runs the same weights through ONNX Runtime with fused
BERT kernels (Attention, SkipLayerNormalization, BiasGelu) and dynamic int8 (per-channel)
weights — about 2x the torch rate in the same run, retrieval top-1 unchanged
(docs/benchmarks.md, ``python -m tools.bench.bench_embed``).

Layout inside the model folder, built once by :func:`ensure_onnx_encoder` and cached:

    <model_dir>/onnx/model.onnx   encoder: (inputs_embeds, attention_mask) -> normalized mean-pooled vector
    <model_dir>/onnx/build.json   what was built from what (stale -> rebuilt)

The word-embedding table (384 MB of the 465 MB) stays out of the graph: rows are gathered from
``model.safetensors`` through a read-only memory map, so the ONNX file is ~22 MB.

Quantisation: ``quantize_dynamic(per_channel=True)``; the FFN output projection of layer 4 stays
fp32 (it carries most of the int8 error: mean cosine vs fp32 0.9978 -> 0.9986, and identical top-1
on 400 CMRC question/passage pairs). A self-check against the fp32 graph runs at build time on
this CPU (int8 kernels differ between CPUs: AVX2 without VNNI can saturate); if it fails the
fused fp32 graph is used instead. Building needs torch, onnx and onnxruntime; running needs only
onnxruntime, tokenizers and numpy.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import struct
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr  # noqa: E402

logger = logging.getLogger(__name__)

ONNX_SUBDIR = "onnx"
ONNX_FILE = "model.onnx"
BUILD_INFO = "build.json"
BUILDER_VERSION = 1
# (layer, module) pairs kept in fp32 when quantising; see module docstring.
FP32_MATMULS = (("4", "fo"),)
SELF_CHECK_MIN_COS = 0.99
SELF_CHECK_MEAN_COS = 0.995
_SELF_CHECK_TEXTS = [
    "passage: 长江是中国第一长河，全长约6300公里，流经青海、西藏、四川、湖北、江苏等省区，最后注入东海。",
    "passage: 光合作用是植物利用光能，把二氧化碳和水转化为有机物并释放氧气的过程。",
    "passage: 《红楼梦》是清代作家曹雪芹创作的章回体长篇小说，被列为中国古典四大名著之首。",
    "passage: The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "passage: 2023年第三季度，公司营业收入同比增长12.5%，净利润为3.2亿元。",
    "query: 长江最后流入哪里？",
    "query: 植物光合作用产生什么气体？",
    "query: 红楼梦的作者是谁",
    "query: when was the eiffel tower built",
    "query: 公司第三季度净利润多少",
]


class OnnxUnavailable(RuntimeError):
    """The ONNX encoder could not be built or loaded (caller falls back to torch)."""


# --------------------------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------------------------
def cpu_signature() -> str:
    """CPU features that change int8 kernels; a model built elsewhere is re-checked here."""
    wanted = {"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "i8mm"}
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("flags", "features")):
                    flags = set(line.split(":", 1)[1].split()) & wanted
                    break
    except OSError:
        pass
    return platform.machine() + ":" + ",".join(sorted(flags))


def _source_stamp(model_dir: Path) -> Any:
    marker = model_dir / ".packaged-source.json"
    if marker.is_file():
        try:
            return json.loads(marker.read_text(encoding="utf-8"))
        except ValueError:
            pass
    st = (model_dir / "model.safetensors").stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _wanted_info(model_dir: Path) -> dict:
    import onnxruntime

    return {"builder": BUILDER_VERSION, "source": _source_stamp(model_dir),
            "onnxruntime": onnxruntime.__version__, "cpu": cpu_signature()}


def read_build_info(model_dir: Path) -> dict | None:
    try:
        return json.loads((Path(model_dir) / ONNX_SUBDIR / BUILD_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def ensure_onnx_encoder(model_dir: Path, quantize: bool = True) -> tuple[Path, dict]:
    """Return (path of onnx/model.onnx, build info), building it when missing or stale.

    Raises :class:`OnnxUnavailable` when the toolchain is missing or the model is not a plain
    BERT with mean pooling.
    """
    model_dir = Path(model_dir)
    path = model_dir / ONNX_SUBDIR / ONNX_FILE
    try:
        wanted = _wanted_info(model_dir)
    except (ImportError, OSError) as exc:
        raise OnnxUnavailable(f"onnxruntime 不可用：{exc}") from exc
    wanted["quantize"] = bool(quantize)
    info = read_build_info(model_dir)
    if info and path.is_file() and all(info.get(k) == v for k, v in wanted.items()):
        return path, info
    try:
        info = _build(model_dir, wanted)
    except OnnxUnavailable:
        raise
    except Exception as exc:  # export/optimiser/quantiser failures: caller falls back to torch
        raise OnnxUnavailable(f"ONNX 导出失败：{type(exc).__name__}: {exc}") from exc
    return path, info


def _check_model_dir(model_dir: Path) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if cfg.get("model_type") != "bert" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise OnnxUnavailable("ONNX 路径只支持 BERT 结构的模型")
    pool = model_dir / "1_Pooling" / "config.json"
    if pool.is_file() and not json.loads(pool.read_text(encoding="utf-8")).get("pooling_mode_mean_tokens"):
        raise OnnxUnavailable("ONNX 路径只支持 mean pooling")
    return cfg


def _build_torch_encoder(model_dir: Path, cfg: dict):
    """A plain torch BERT encoder (embeddings-in, pooled-vector-out) with the folder's weights.

    Written out instead of tracing transformers' BertModel: the graph stays stable across
    transformers versions and matches onnxruntime's BERT fusion patterns.
    """
    import math

    import torch
    from safetensors import safe_open
    from torch import nn

    H, NH, FF = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    hd = H // NH
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise OnnxUnavailable(f"不支持的激活函数 {cfg.get('hidden_act')}")

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.ao = (nn.Linear(H, H) for _ in range(4))
            self.aln = nn.LayerNorm(H, eps=eps)
            self.fi, self.fo = nn.Linear(H, FF), nn.Linear(FF, H)
            self.oln = nn.LayerNorm(H, eps=eps)

        def forward(self, x, bias):
            b, s = x.shape[0], x.shape[1]
            q = self.q(x).view(b, s, NH, hd).transpose(1, 2)
            k = self.k(x).view(b, s, NH, hd).permute(0, 2, 3, 1)
            v = self.v(x).view(b, s, NH, hd).transpose(1, 2)
            att = torch.softmax(torch.matmul(q, k) / math.sqrt(hd) + bias, dim=-1)
            ctx = torch.matmul(att, v).transpose(1, 2).reshape(b, s, H)
            x = self.aln(x + self.ao(ctx))
            return self.oln(x + self.fo(nn.functional.gelu(self.fi(x))))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(cfg["max_position_embeddings"], H))
            self.typ = nn.Parameter(torch.zeros(H))
            self.ln = nn.LayerNorm(H, eps=eps)
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["num_hidden_layers"]))

        def forward(self, inputs_embeds, attention_mask):
            s = inputs_embeds.shape[1]
            x = self.ln(inputs_embeds + self.pos[:s] + self.typ)
            m = attention_mask.to(x.dtype)
            bias = (1.0 - m[:, None, None, :]) * -10000.0  # this form is what the Attention fusion matches
            for layer in self.layers:
                x = layer(x, bias)
            mm = m.unsqueeze(-1)
            pooled = (x * mm).sum(1) / mm.sum(1).clamp(min=1e-9)
            return nn.functional.normalize(pooled, dim=-1)

    enc = Encoder().eval()
    names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "aln": "attention.output.LayerNorm",
             "fi": "intermediate.dense", "fo": "output.dense", "oln": "output.LayerNorm"}
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        prefix = "bert." if "bert.embeddings.position_embeddings.weight" in keys else ""

        def t(name):
            return f.get_tensor(prefix + name).float()

        with torch.no_grad():
            enc.pos.copy_(t("embeddings.position_embeddings.weight"))
            enc.typ.copy_(t("embeddings.token_type_embeddings.weight")[0])
            enc.ln.weight.copy_(t("embeddings.LayerNorm.weight"))
            enc.ln.bias.copy_(t("embeddings.LayerNorm.bias"))
            for i, layer in enumerate(enc.layers):
                for attr, hf in names.items():
                    getattr(layer, attr).weight.copy_(t(f"encoder.layer.{i}.{hf}.weight"))
                    getattr(layer, attr).bias.copy_(t(f"encoder.layer.{i}.{hf}.bias"))
    return enc, prefix


def _build(model_dir: Path, wanted: dict) -> dict:
    try:
        import onnx  # noqa: F401  (needed by torch's exporter and the quantiser)
        import torch
    except ImportError as exc:
        raise OnnxUnavailable(f"缺少 ONNX 导出依赖：{exc}") from exc
    cfg = _check_model_dir(model_dir)
    out_dir = model_dir / ONNX_SUBDIR
    out_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out_dir) as tmpd:
        tmp = Path(tmpd)
        enc, _ = _build_torch_encoder(model_dir, cfg)
        H = cfg["hidden_size"]
        x = torch.randn(2, 7, H)
        mask = torch.ones(2, 7, dtype=torch.int64)
        mask[1, 5:] = 0
        raw = tmp / "raw.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                enc, (x, mask), str(raw), dynamo=False, opset_version=17,
                input_names=["inputs_embeds", "attention_mask"], output_names=["embedding"],
                dynamic_axes={"inputs_embeds": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                              "embedding": {0: "batch"}})
        fused = tmp / "fused.onnx"
        fusion = _fuse(raw, fused, cfg)
        chosen, variant, check = (fused if fusion else raw), "fp32", None
        if wanted["quantize"]:
            q8 = tmp / "int8.onnx"
            _quantize(chosen, q8)
            check = _self_check(model_dir, chosen, q8)
            if check["min_cos"] >= SELF_CHECK_MIN_COS and check["mean_cos"] >= SELF_CHECK_MEAN_COS:
                chosen, variant = q8, "int8"
            else:
                logger.warning("int8 ONNX self-check failed on this CPU (%s); using fp32 graph", check)
        info = {**wanted, "variant": variant, "fused": fusion, "self_check": check, "hidden_size": H,
                "max_length": min(int(cfg["max_position_embeddings"]), 512)}
        os.replace(chosen, out_dir / ONNX_FILE)
        tmp_info = tmp / BUILD_INFO
        tmp_info.write_text(json.dumps(info, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp_info, out_dir / BUILD_INFO)
    return info


def _fuse(src: Path, dst: Path, cfg: dict) -> dict | None:
    """onnxruntime's BERT fusions (Attention, SkipLayerNorm, BiasGelu). None when unavailable."""
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        quiet = logging.getLogger("onnxruntime.transformers")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            opt = optimize_model(str(src), model_type="bert", num_heads=cfg["num_attention_heads"],
                                 hidden_size=cfg["hidden_size"], opt_level=0)
        finally:
            quiet.setLevel(level)
        counts: dict[str, int] = {}
        for node in opt.model.graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        opt.save_model_to_file(str(dst))
        return {k: counts.get(k, 0) for k in ("Attention", "SkipLayerNormalization", "BiasGelu")}
    except Exception as exc:  # the plain export still works, just slower
        logger.warning("onnxruntime BERT fusion unavailable (%s); using the plain export", exc)
        return None


def _quantize(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    keep = [n.name for n in model.graph.node
            if n.op_type == "MatMul" and any(f"/layers.{i}/{mod}/" in n.name for i, mod in FP32_MATMULS)]
    del model
    root = logging.getLogger()
    hush = _DropMessages("Please consider to run pre-processing")  # quantize_dynamic's root-logger advice
    root.addFilter(hush)
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         nodes_to_exclude=keep, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.removeFilter(hush)


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def _self_check(model_dir: Path, ref_path: Path, q_path: Path) -> dict:
    runner_ref = _Runner(model_dir, ref_path)
    runner_q = _Runner(model_dir, q_path)
    a = runner_ref.embed(_SELF_CHECK_TEXTS)
    b = runner_q.embed(_SELF_CHECK_TEXTS)
    cos = (a * b).sum(1)
    return {"mean_cos": round(float(cos.mean()), 5), "min_cos": round(float(cos.min()), 5),
            "texts": len(_SELF_CHECK_TEXTS)}


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------
def _word_embedding_memmap(model_dir: Path) -> np.ndarray:
    """Read-only memory map of the word-embedding table inside model.safetensors."""
    path = model_dir / "model.safetensors"
    with open(path, "rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(hlen))
    for name in ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"):
        if name in header:
            meta = header[name]
            break
    else:
        raise OnnxUnavailable("model.safetensors 中没有 word_embeddings")
    if meta["dtype"] != "F32":
        raise OnnxUnavailable(f"word_embeddings 的类型 {meta['dtype']} 不受支持")
    start, _ = meta["data_offsets"]
    return np.memmap(path, dtype=np.float32, mode="r", offset=8 + hlen + start, shape=tuple(meta["shape"]))


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class _Runner:
    """Tokenizer + word-embedding gather + ORT session; embeds already-prefixed texts, one text per run.

    Why one text per run: the int8 graph quantises its activations dynamically with ONE scale per tensor, so
    in a batch a text's vector depended on the other texts in it (and on their padding): the same 64 chunks
    embedded in reverse order moved vectors by up to 0.01 (cosine down to 0.998). Run alone, a text's vector
    is a function of the text only (documents get the vector their text gets as a query would: alone), and
    there is no padding — length-sorted batches of 16 still carried ~20 % padding tokens on 300-character
    chunks; alone, the same chunks cost ~27 % less CPU (docs/benchmarks.md, tools.bench.bench_ingest).

    Why one thread per run and several runs at once (`lanes`, default: the cores this process may use): one short
    text split over two intra-op threads kept both cores busy (spinning included) for little speed-up, so eight
    questions at once shared the cores badly; run in parallel, texts use the cores fully, and each run happens in
    the thread that asked (threads of a lower-priority caller, such as the ingest, keep its priority).
    """

    def __init__(self, model_dir: Path, onnx_path: Path, num_threads: int | None = None,
                 max_length: int = 512):
        import onnxruntime as ort

        from pipeline.models.unigram_tokenizer import load_tokenizer

        # e5's Unigram: the lean search (−200 MB resident, same ids); any other tokenizer: tokenizers itself
        self.tokenizer = load_tokenizer(model_dir / "tokenizer.json")
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        self.word = _word_embedding_memmap(model_dir)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self.lanes = int(num_threads) if num_threads else available_cores()  # texts embedded at once
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.dim = int(self.word.shape[1])  # mean pooling keeps the hidden size

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        encs = self.tokenizer.encode_batch(list(texts)) if texts else []

        def run(row: int) -> None:
            ids = np.asarray(encs[row].ids, dtype=np.int64)[None, :]
            feeds = {"inputs_embeds": np.ascontiguousarray(self.word[ids]),
                     "attention_mask": np.ones_like(ids)}
            out[row] = self.session.run(None, feeds)[0][0]  # releases the GIL while it computes

        lanes = min(self.lanes, len(encs))
        if lanes <= 1:
            for row in range(len(encs)):
                run(row)
        else:  # threads made here inherit the caller's priority (Linux)
            with ThreadPoolExecutor(lanes, thread_name_prefix="embed") as pool:
                list(pool.map(run, range(len(encs))))
        return out


class OnnxEmbedding(BaseEmbedding):
    """LlamaIndex embedding backed by the cached ONNX encoder of a BERT sentence-transformers folder.

    Vectors are L2-normalised. ``query_instruction`` / ``text_instruction`` are prepended
    (multilingual-e5 needs "query: " / "passage: ").
    """

    query_instruction: str = Field(default="", description="Prefix for queries.")
    text_instruction: str = Field(default="", description="Prefix for documents.")
    model_dir: str = Field(default="", description="sentence-transformers folder.")
    variant: str = Field(default="", description="int8 or fp32 graph.")
    max_length: int = Field(default=512, description="Token limit (longer texts are truncated).")

    _runner: _Runner = PrivateAttr()

    def __init__(self, model_dir: str | Path, query_instruction: str = "", text_instruction: str = "",
                 embed_batch_size: int = 64, num_threads: int | None = None,
                 quantize: bool = True, model_name: str | None = None, **kwargs: Any):
        model_dir = Path(model_dir)
        onnx_path, info = ensure_onnx_encoder(model_dir, quantize=quantize)
        max_length = int(info.get("max_length", 512))
        super().__init__(model_name=model_name or model_dir.name, embed_batch_size=embed_batch_size,
                         query_instruction=query_instruction, text_instruction=text_instruction,
                         model_dir=str(model_dir), variant=info.get("variant", ""), max_length=max_length,
                         **kwargs)
        self._runner = _Runner(model_dir, onnx_path, num_threads=num_threads, max_length=max_length)

    @classmethod
    def class_name(cls) -> str:
        return "OnnxEmbedding"

    @property
    def dim(self) -> int:
        return self._runner.dim

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._runner.embed([self.query_instruction + query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._runner.embed([self.text_instruction + text])[0].tolist()

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._runner.embed([self.text_instruction + t for t in texts]).tolist()

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._get_text_embeddings(texts)  # one batched run, not one task per text
