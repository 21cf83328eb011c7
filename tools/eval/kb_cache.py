"""The cached knowledge bases of the dev sets (built once, reused by every evaluation run).

Building a dev-set knowledge base embeds thousands of chunks (minutes), so built data dirs are cached:

    <cache>/<name>/          an engine data dir (app.db, chroma/, bm25/, uploads/)
    <cache>/<name>/key_to_doc.json   document key of the loader → doc_id
    <cache>/<name>/READY     written last; a dir without it is not used

A builder holds `flock <cache>/<name>.lock` while it builds into <name>.tmp, then renames it. Readers copy the
cached dir (`cp -a`) to a temp dir and open the copy: the cached dir is never written after READY.
The cache root is `--kb-cache DIR` or $KBQA_KB_CACHE; the dev sets and their data are tools/eval/devsets.py.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools.eval.devsets import DEV_SETS, Corpus, DevSet, load_corpus


def cache_root(arg: str | None) -> Path | None:
    root = arg or os.environ.get("KBQA_KB_CACHE")
    return Path(root) if root else None


def ensure_built(root: Path, ds: DevSet, embedding_model: str = "") -> Path:
    """The cached data dir of `ds`, building it (under the lock) when no READY copy exists. `embedding_model`: the
    model folder to build it with (empty: the settings' default, the packaged e5) — one cache root per model."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / ds.name
    if (final / "READY").exists():
        return final
    with open(root / f"{ds.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder may be at it: wait, then look again
        if (final / "READY").exists():
            return final
        tmp = root / f"{ds.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _build_into(tmp, ds, embedding_model)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (final / "READY").write_text("ok\n")
    return final


def _suffix(key: str) -> str:
    """A document key that is a Markdown file name (a "folder" dev set) is uploaded as Markdown, as a user would
    upload it (its # headings become the chunks' context); every other key as plain text."""
    return ".md" if key.endswith(".md") else ".txt"


def build_kb(engine, corpus: Corpus, tmp: Path) -> dict[str, int]:
    """Ingest every document through the engine; returns key → doc_id (duplicates share a doc)."""
    key_to_doc: dict[str, int] = {}
    keys = list(corpus.docs)
    src = tmp / "src"
    src.mkdir()
    t0 = time.perf_counter()
    for i in range(0, len(keys), 10):
        batch = []
        for k in keys[i:i + 10]:
            p = src / f"{len(key_to_doc) + len(batch)}{_suffix(k)}"
            p.write_text(corpus.docs[k], encoding="utf-8")
            batch.append((k, p))
        res = engine.upload([(f"{k.removesuffix(_suffix(k))[:60]}{_suffix(k)}", p) for k, p in batch])
        for (k, p), r in zip(batch, res):
            if r.doc_id is None:
                raise RuntimeError(f"upload refused: {k}: {r.msg}")
            key_to_doc[k] = r.doc_id
            p.unlink()
    engine.wait_idle()
    engine.components.bm25.rebuild(engine.settings.bm25_k1, engine.settings.bm25_b)
    settle_gate_background(engine)  # stored with the KB: a cache built from now on keeps the right one
    c = engine.components.docs.counts()
    print(f"# knowledge base: {c['ready_docs']} docs ready, {c['chunks']} chunks, "
          f"ingest {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return key_to_doc


def _build_into(tmp: Path, ds: DevSet, embedding_model: str = "") -> None:
    from pipeline.engine import Engine  # heavy (llama-index, Chroma, the models): only when a KB is opened
    from store.config_store import ConfigStore
    from store.db import Database

    corpus = load_corpus(ds)
    if embedding_model:  # saved before the engine starts, as a saved setting would be; copies open with it
        db = Database(tmp / "app.db")
        ConfigStore(db).save({"embedding_model_path": str(embedding_model)})
        db.close()
    engine = Engine(tmp)
    try:
        key_to_doc = build_kb(engine, corpus, tmp)  # writes its upload files under tmp/src
    finally:
        engine.close()
    shutil.rmtree(tmp / "src", ignore_errors=True)
    (tmp / "key_to_doc.json").write_text(json.dumps(key_to_doc, ensure_ascii=False), encoding="utf-8")


def open_copy(root: Path, ds: DevSet, into: Path):
    """Copy the cached KB to `into` and open an Engine on the copy. Returns (engine, key_to_doc), the engine idle."""
    from pipeline.engine import Engine  # heavy (llama-index, Chroma, the models): only when a KB is opened

    cached = ensure_built(root, ds)
    subprocess.run(["cp", "-a", str(cached), str(into)], check=True)
    key_to_doc = json.loads((into / "key_to_doc.json").read_text(encoding="utf-8"))
    engine = Engine(into)
    settle_gate_background(engine)
    engine.wait_idle()
    return engine, key_to_doc


def settle_gate_background(engine) -> None:
    """Measure the gate background of every knowledge base of the copy as it stands, before any question. A build
    closes the engine right after its last ingest, before the debounced refresh runs, so the cached dir keeps a
    background measured on its first few chunks (2–16 of them); the copy would answer with that one, marked
    'previous', until a refresh that yields to every question finishes — at a moment that depends on the load
    (formal_eval: everyday off-topic refused .82 in one run, .94 in the next). An app that has been up a while
    has the background of its whole knowledge base: measure that one."""
    c = engine.components
    if c.gate_background is None:
        return
    for kb_id in c.kbs.ids():
        c.gate_background.of(kb_id).refresh_if_changed()


def main(argv=None) -> int:
    """python -m tools.eval.kb_cache --kb-cache DIR [NAME ...]: build the named (default: all) dev-set KBs."""
    ap = argparse.ArgumentParser(prog="python -m tools.eval.kb_cache", description=main.__doc__)
    ap.add_argument("--kb-cache", default=None)
    ap.add_argument("names", nargs="*", default=list(DEV_SETS))
    args = ap.parse_args(argv)
    root = cache_root(args.kb_cache)
    if root is None:
        ap.error("--kb-cache DIR (or $KBQA_KB_CACHE) is required")
    for name in args.names:
        if name not in DEV_SETS:
            ap.error(f"unknown set {name}; known: {', '.join(DEV_SETS)}")
        print(f"{name}: {ensure_built(root, DEV_SETS[name])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
