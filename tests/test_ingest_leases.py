"""The ingest worker's lease heartbeat against its own finished documents."""
from __future__ import annotations

import logging
import time

from pipeline.ops.deployment import Deployment
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle

LEASE_S = 2.0  # the shortest lease a deployment takes: the heartbeat renews every LEASE_S / 3


def test_a_finished_document_is_not_reported_as_a_lease_another_worker_took(tmp_path, caplog):
    """A document whose job just ended (its row deleted) must not read as "lost" to the heartbeat: the warning
    names another worker where there is none. The callback after each 就绪 is slowed past a heartbeat, so a
    renewal runs while the group's first document is finished and the second is still being written."""
    engine = tiny_engine(tmp_path / "data", tiny_model(tmp_path / "tiny"), Deployment(ingest_lease_s=LEASE_S))
    try:
        ingest = engine.components.ingest
        seen = []

        def slow_generation(generation: int) -> None:
            seen.append(generation)
            time.sleep(LEASE_S / 3 * 1.5)  # at least one heartbeat runs meanwhile

        ingest.on_generation = slow_generation
        files = []
        for i in range(2):
            p = tmp_path / f"doc{i}.txt"
            p.write_text(f"第{i}份文件。报销需要在三十日内提交发票和审批单，编号 LEASE-{i}。", encoding="utf-8")
            files.append((p.name, p))
        with caplog.at_level(logging.WARNING, logger="pipeline.ingestion.service"):
            engine.upload(files)
            wait_idle(engine, 120)
        assert len(seen) == 2
        assert [d["status"] for d in engine.components.docs.all_docs()] == ["ready", "ready"]
        assert not [r for r in caplog.records if "leases lost" in r.getMessage()]
    finally:
        engine.close()
