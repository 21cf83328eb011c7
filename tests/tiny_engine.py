"""A real Engine on a real data dir whose embedding model is the tiny random BERT (fast ingest in tests).

The settings are written into the data dir's SQLite before the engine starts, exactly as a saved setting
would be; min_similarity 0 so the random model's answers are not gated away.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.engine import Engine
from pipeline.ops.deployment import Deployment
from store.config_store import ConfigStore
from store.db import Database
from tests.shared_data import RULES, require


def tiny_model(dir: Path) -> Path:
    from tests.tiny_models import make_tiny_bert_embedding

    return dir if (dir / "config.json").exists() else make_tiny_bert_embedding(dir)


def tiny_engine(data: Path, model_dir: Path, deployment: Deployment | None = None, **settings) -> Engine:
    db = Database(Path(data) / "app.db")
    ConfigStore(db).save({"embedding_model_path": str(model_dir), "min_similarity": 0.0, **settings})
    db.close()
    return Engine(data, deployment=deployment)


def real_paragraphs(path: Path = RULES, min_len: int = 40) -> list[str]:
    """Paragraphs of a real document in /work/shared/docs (text used in place, never copied into the repo)."""
    return [p.strip() for p in require(path).read_text(encoding="utf-8").split("\n") if len(p.strip()) >= min_len]


def wait_idle(engine: Engine, timeout: float = 300) -> None:
    assert engine.wait_idle(timeout), "ingest did not finish"
