"""Embedding layout check (issue 16): the old batched int8 runner vs one text per ONNX run.

    python -m tools.bench_embed_layout [--pairs 400]

For N CMRC question → passage pairs (tools.bench_embed.load_pairs): each layout's passage vectors against torch
fp32 (cosine mean / min), acc@1 of the questions over the passages, and how far the two layouts' vectors are apart.
The old layout is rebuilt here (length-sorted calls of 32, batches of 16 padded to the longest) because the runner
no longer has it: with int8 activations quantised per tensor, a text's vector depended on its batch neighbours.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.models.e5_convert import PASSAGE_PREFIX, QUERY_PREFIX
from pipeline.models.embeddings import _hf_embedding, load_embedding
from tools.bench_embed import load_pairs

REPO = Path(__file__).resolve().parents[1]


def batched(runner, texts: list[str], batch: int = 16) -> np.ndarray:
    """The runner's layout before issue 16: length-sorted batches padded to their longest text."""
    out = np.zeros((len(texts), runner.dim), dtype=np.float32)
    encs = runner.tokenizer.encode_batch(list(texts))
    lengths = np.array([len(e.ids) for e in encs])
    order = np.argsort(lengths, kind="stable")
    pad = runner.tokenizer.token_to_id("<pad>")
    for s in range(0, len(texts), batch):
        idx = order[s:s + batch]
        w = int(lengths[idx].max())
        ids = np.full((len(idx), w), pad, dtype=np.int64)
        mask = np.zeros((len(idx), w), dtype=np.int64)
        for row, j in enumerate(idx):
            ids[row, :lengths[j]] = encs[j].ids
            mask[row, :lengths[j]] = 1
        feed = {"inputs_embeds": np.ascontiguousarray(runner.word[ids]), "attention_mask": mask}
        out[idx] = runner.session.run(None, feed)[0]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=400)
    args = ap.parse_args(argv)
    n = args.pairs
    qs, ps = load_pairs(n)
    emb = load_embedding("", REPO, REPO / "models")
    runner = emb.embed_model._runner  # the ONNX runner itself: the old layout is rebuilt over its session
    passages = [PASSAGE_PREFIX + p for p in ps]
    old = np.concatenate([batched(runner, passages[i:i + 32]) for i in range(0, n, 32)])
    new = runner.embed(passages)
    q = runner.embed([QUERY_PREFIX + x for x in qs])
    hf = _hf_embedding(REPO / "models" / "multilingual-e5-small", QUERY_PREFIX, PASSAGE_PREFIX, 32)
    ref = np.array(hf.get_text_embedding_batch(ps))
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    qref = np.array([hf.get_query_embedding(x) for x in qs])
    qref /= np.linalg.norm(qref, axis=1, keepdims=True)
    for name, v in (("old batched int8", old), ("one text per run int8", new)):
        cos = (v * ref).sum(1)
        acc = float(((q @ v.T).argmax(1) == np.arange(n)).mean())
        print(f"{name}: cosine to fp32 mean {cos.mean():.5f} min {cos.min():.5f}; acc@1 {acc:.4f}")
    print(f"fp32 acc@1 {float(((qref @ ref.T).argmax(1) == np.arange(n)).mean()):.4f}")
    print(f"old vs new: max abs {float(np.abs(old - new).max()):.4f}, min cosine {float((old * new).sum(1).min()):.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
