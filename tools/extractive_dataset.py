"""Per-question extractive candidates on the dev-set knowledge bases, dumped for offline calibration.

    python -m tools.extractive_dataset --kb-cache /work/cache/kb --out /work/cache/extractive [--per-set 400]

For each dev set writes OUT/<name>.jsonl, one line per question: kind ("answerable", or "gold_removed" as in
tools/gate_dataset.py), top1 (the top-1 source holds a gold answer: the ceiling of answer-hit) and every
candidate sentence of the top sources as the app scores it (source, coverage, phrase, cosine) with
has_answer (holds_answer: it contains a gold answer string, or is a sentence of a longer one; DuReader: it shares
≥ ANSWER_OVERLAP characters in a row with a gold answer span, or lies inside one).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tools.gate_dataset import SEED, _remover, features_for

ANSWER_OVERLAP = 12


def dureader_spans(path: Path) -> dict[str, list[str]]:
    """question → its gold answer spans (DuReader's fake_answers: spans of the most related paragraph)."""
    out: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out[d["question"]] = [a for a in d.get("fake_answers") or [] if a.strip()]
    return out


_EDGE = " \t\n。！？；，、：.!?;,:"


def holds_answer(text: str, answers: list[str], spans: list[str]) -> bool:
    """Does this answer sentence hold a gold answer? It contains one (CMRC trial's answers are whole sentences
    with their full stop, so edge punctuation is ignored), or — for gold answers longer than a sentence — it is
    one of the gold answer's sentences (≥ 8 characters of it)."""
    for a in answers:
        a = a.strip(_EDGE)
        if a and (a in text or (len(a) > len(text) >= 8 and text.strip(_EDGE) in a)):
            return True
    for s in spans:
        if text in s and len(text) >= 6:
            return True
        if any(text[i:i + ANSWER_OVERLAP] in s for i in range(0, max(len(text) - ANSWER_OVERLAP + 1, 0))):
            return True
    return False


def dump_set(name: str, root: Path, out: Path, per_set: int) -> None:
    from pipeline.generation.extractive import ExtractivePicker
    from pipeline.retrieval.lexical import weights_for
    from tools.kb_cache import DEV_SETS, load_corpus, shared_data_dir

    ds = DEV_SETS[name]
    corpus = load_corpus(ds)
    spans = dureader_spans(shared_data_dir() / ds.path) if ds.kind == "dureader" else {}
    rnd = random.Random(SEED)
    sample = rnd.sample(corpus.questions, min(per_set, len(corpus.questions)))
    removed = rnd.sample(corpus.questions, min(per_set * 3 // 8, len(corpus.questions)))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kbqa-ext-") as tmp:
        from tools.kb_cache import open_copy

        engine, key_to_doc = open_copy(root, ds, Path(tmp) / name)
        k = engine.settings.final_top_k
        engine.wait_idle()
        bg_median = engine.components.gate_background.current().sim_median
        picker = ExtractivePicker(engine.components.tokenizer, engine.components.models.embedding.embed_model,
                                  lambda: weights_for(engine.components.bm25.snapshot.bm25))
        with open(out / f"{name}.jsonl.tmp", "w", encoding="utf-8") as f:
            for kind, questions in (("answerable", sample), ("gold_removed", removed)):
                for q in questions:
                    exclude = _remover(q, key_to_doc) if kind == "gold_removed" else None
                    _, fused = features_for(engine, q.text, exclude)
                    final = fused[:k]
                    sp = spans.get(q.text, [])
                    cands = picker.candidates(q.text, final)
                    top1 = bool(final) and holds_answer(final[0].node.get_content(), q.answers, sp)
                    f.write(json.dumps({
                        "set": name, "kind": kind, "q": q.text, "top1": top1, "n_sources": len(final),
                        "bg_median": bg_median,
                        "cands": [{"text": c.piece.text, "punct": c.piece.punct, "source": c.source, "position": c.piece.position, "coverage": round(c.coverage, 4),
                                   "phrase": round(c.phrase, 4), "context": round(c.context, 4), "focus": c.focus, "cosine": round(c.cosine, 5),
                                   "has_answer": holds_answer(c.piece.text, q.answers, sp)} for c in cands],
                    }, ensure_ascii=False) + "\n")
        engine.close()
    (out / f"{name}.jsonl.tmp").rename(out / f"{name}.jsonl")
    print(f"{name}: {len(sample)} answerable, {len(removed)} gold removed ({time.perf_counter() - t0:.0f} s)",
          file=sys.stderr)


def main(argv=None) -> int:
    from tools.cli import add_kb_cache, kb_cache_root
    from tools.kb_cache import DEV_SETS

    ap = argparse.ArgumentParser(prog="python -m tools.extractive_dataset", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_kb_cache(ap)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-set", type=int, default=400)
    ap.add_argument("names", nargs="*", default=list(DEV_SETS))
    args = ap.parse_args(argv)
    root = kb_cache_root(ap, args)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        dump_set(name, root, args.out, args.per_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
