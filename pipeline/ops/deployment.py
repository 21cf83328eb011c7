"""Where the shared state lives: embedded in the data dir (default) or on servers several app processes share.

    Deployment()                                             # SQLite app.db, embedded Chroma, uploads/ in data dir
    Deployment(database_url="postgresql://…", chroma_url="http://127.0.0.1:8000", files_dir=Path("/srv/kbqa"))

Command-line flags win over the environment (DATABASE_URL, CHROMA_URL, KBQA_FILES_DIR, KBQA_INGEST_LEASE_S,
KBQA_ROLE, KBQA_INGEST_GROUP).
With a database URL several app processes may serve the same knowledge base; they then need the same Chroma
server and the same files dir (docs/deploy.md).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from store.db import is_postgres_url
from store.vectors import parse_chroma_url

DEFAULT_LEASE_S = 60.0
DEFAULT_GROUP = 16  # documents one ingest claim takes (pipeline.ingestion.service.GROUP_DOCS)
# What one app process runs (app.py --role, docs/deploy.md#roles): "both" the UI + API and an ingest worker,
# "web" the UI + API only (uploads wait in the database queue), "worker" the ingest worker only (no UI, no port).
ROLES = ("both", "web", "worker")


@dataclass(frozen=True)
class Deployment:
    database_url: str | None = None   # None → SQLite <data>/app.db (one process)
    chroma_url: str | None = None     # None → embedded Chroma <data>/chroma
    files_dir: Path | None = None     # None → <data>/uploads
    ingest_lease_s: float = DEFAULT_LEASE_S  # a dead process's ingest job is taken over after this long
    role: str = "both"                # what this process runs (ROLES)
    ingest_group: int = DEFAULT_GROUP  # documents per ingest claim (several workers: smaller spreads the tail)

    def __post_init__(self):
        if not 1 <= int(self.ingest_group) <= 64:
            raise ValueError(f"每次领取的入库文档数应在 1–64 之间，收到 {self.ingest_group}")
        if self.role not in ROLES:
            raise ValueError(f"进程角色无效：{self.role}（应为 both、web 或 worker）")
        if self.role != "both" and not self.chroma_url:
            # the embedded Chroma keeps its HNSW index in the memory of the one process that opened it: a second
            # process would neither see the other's vectors nor write beside it safely
            raise ValueError(f"--role {self.role} 需要 Chroma 服务（--chroma-url）：嵌入式向量库只能由一个进程打开，"
                             f"单进程部署请用默认的 --role both")
        if self.database_url and not is_postgres_url(self.database_url):
            raise ValueError(f"数据库地址无效：{self.database_url}（应为 postgresql://用户@主机:端口/库名）")
        if self.chroma_url:
            parse_chroma_url(self.chroma_url)
        if not 2 <= float(self.ingest_lease_s) <= 3600:
            raise ValueError(f"入库租约时长应在 2–3600 秒之间，收到 {self.ingest_lease_s}")

    @property
    def serves(self) -> bool:
        """This process answers questions (UI / API): it keeps BM25 indexes and the gate's background."""
        return self.role != "worker"

    @property
    def ingests(self) -> bool:
        """This process claims ingest jobs from the database queue."""
        return self.role != "web"

    @property
    def shared(self) -> bool:
        """Several app processes may run against this state."""
        return bool(self.database_url)

    @classmethod
    def from_sources(cls, database_url: str | None = None, chroma_url: str | None = None,
                     files_dir: str | Path | None = None, ingest_lease_s: float | None = None,
                     env: Mapping[str, str] | None = None, role: str | None = None,
                     ingest_group: int | None = None) -> "Deployment":
        env = os.environ if env is None else env
        lease = ingest_lease_s if ingest_lease_s is not None else env.get("KBQA_INGEST_LEASE_S")
        files = files_dir or env.get("KBQA_FILES_DIR")
        return cls(database_url=database_url or env.get("DATABASE_URL") or None,
                   chroma_url=chroma_url or env.get("CHROMA_URL") or None,
                   files_dir=Path(files).resolve() if files else None,
                   ingest_lease_s=float(lease) if lease else DEFAULT_LEASE_S,
                   role=role or env.get("KBQA_ROLE") or "both",
                   ingest_group=int(ingest_group or env.get("KBQA_INGEST_GROUP") or DEFAULT_GROUP))
