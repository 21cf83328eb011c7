"""The dev sets and their cached evaluation knowledge bases (built once, reused by every evaluation run).

Building a dev-set knowledge base embeds thousands of chunks (minutes), so built data dirs are cached:

    <cache>/<name>/          an engine data dir (app.db, chroma/, bm25/, uploads/)
    <cache>/<name>/key_to_doc.json   document key of the loader → doc_id
    <cache>/<name>/READY     written last; a dir without it is not used

A builder holds `flock <cache>/<name>.lock` while it builds into <name>.tmp, then renames it. Readers copy the
cached dir (`cp -a`) to a temp dir and open the copy: the cached dir is never written after READY.
The cache root is `--kb-cache DIR` or $KBQA_KB_CACHE; the dev data is $KBQA_SHARED_DATA or ../shared/data.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    env = os.environ.get("KBQA_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@dataclass(frozen=True)
class DevSet:
    name: str
    kind: str  # "squad" | "dureader"
    path: str  # relative to the shared data dir
    distractors: str | None = None
    style: str = ""  # what kind of questions, for the report


DEV_SETS: dict[str, DevSet] = {s.name: s for s in (
    DevSet("xquad_zh", "squad", "xquad/xquad.zh.json", style="annotator questions, Wikipedia passages"),
    DevSet("cmrc_trial", "squad", "cmrc2018/cmrc2018_trial.json", style="annotator questions, Wikipedia"),
    DevSet("dureader_dev", "dureader", "dureader2_demo/search.dev.json", style="real search questions, web"),
    DevSet("dureader_train", "dureader", "dureader2_demo/search.train.json", style="real search questions, web"),
    DevSet("cmrc_dev_news", "squad", "cmrc2018/cmrc2018_dev.json", "crud_rag_news/documents_dup_part_1_part_1",
           style="annotator questions, Wikipedia + news distractors"),
)}  # smallest first: a build run in this order has the quick sets ready early


def load_corpus(ds: DevSet, data: Path | None = None):
    """The set's documents and questions, exactly as `tools.evaluate` loads them (whole set, no limit)."""
    from tools.evaluate import add_distractors, load_dureader, load_squad

    data = data or shared_data_dir()
    if ds.kind == "dureader":
        corpus = load_dureader(data / ds.path, None)
    else:
        corpus = load_squad(data / ds.path, None)
    if ds.distractors:
        add_distractors(corpus, data / ds.distractors, None)
    return corpus


def cache_root(arg: str | None) -> Path | None:
    root = arg or os.environ.get("KBQA_KB_CACHE")
    return Path(root) if root else None


def is_ready(root: Path, name: str) -> bool:
    return (root / name / "READY").exists()


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


def _build_into(tmp: Path, ds: DevSet, embedding_model: str = "") -> None:
    from pipeline.engine import Engine
    from store.config_store import ConfigStore
    from store.db import Database
    from tools.evaluate import build_kb

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
    """Copy the cached KB to `into` and open an Engine on the copy. Returns (engine, key_to_doc)."""
    from pipeline.engine import Engine

    cached = ensure_built(root, ds)
    subprocess.run(["cp", "-a", str(cached), str(into)], check=True)
    key_to_doc = json.loads((into / "key_to_doc.json").read_text(encoding="utf-8"))
    return Engine(into), key_to_doc


def main(argv=None) -> int:
    """python -m tools.kb_cache --kb-cache DIR [NAME ...]: build the named (default: all) dev-set KBs."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tools.kb_cache", description=main.__doc__)
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
