"""Structured ingest progress: the board's stages, places in line and ETAs (fake clock), then a long document
through the real app: the list API shows moving 向量化 n/m with an ETA while documents queued behind it show
their place, and the header badge shows the queue."""
from __future__ import annotations

import pytest

from pipeline.ingestion.progress import ProgressBoard, format_eta, stage_text
from tests.shared_data import NOVEL, needs
from tests.waiting import wait_until


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_board_places_stages_and_eta():
    clock = Clock()
    b = ProgressBoard(clock)
    for doc_id, size in ((1, 75_000), (2, 7_500), (3, 7_500)):
        b.queued(doc_id, size, "txt")
    assert [b.snapshot(i)["position"] for i in (1, 2, 3)] == [1, 2, 3]
    assert b.snapshot(3)["text"] == "排队 第 3 位"
    assert b.snapshot(1)["eta_s"] is None  # no rate measured yet: 估算中
    b.stage(1, "parse")
    assert b.snapshot(2)["position"] == 1 and b.queue_length == 2
    b.stage(1, "chunk")
    b.chunked(1, 100)  # 750 bytes per chunk learnt for txt
    b.stage(1, "embed", 0, 100)
    b.embedded(32, 3.2)  # 10 chunks/s
    clock.t += 3.2
    b.stage(1, "embed", 32, 100)
    snap = b.snapshot(1)
    assert (snap["stage"], snap["done"], snap["total"], snap["text"]) == ("embed", 32, 100, "向量化 32/100 块")
    assert snap["eta_s"] == pytest.approx(6.9, abs=0.2)  # 68 chunks at 10/s
    # doc 2 waits for doc 1, then needs its own ~10 chunks (7,500 bytes / 750)
    assert b.snapshot(2)["eta_s"] == pytest.approx(6.9 + 1.0, abs=0.3)
    assert b.snapshot(3)["eta_s"] > b.snapshot(2)["eta_s"]
    b.finish(1)
    assert b.snapshot(1) is None and b.snapshot(2)["position"] == 1


def test_board_ocr_pages_rate():
    clock = Clock()
    b = ProgressBoard(clock)
    b.queued(7, 2_000_000, "pdf")
    b.stage(7, "parse")
    b.stage(7, "ocr", 1, 8)
    clock.t += 4.0
    b.stage(7, "ocr", 2, 8)
    snap = b.snapshot(7)
    assert snap["text"] == "OCR 2/8 页" and snap["eta_s"] == pytest.approx(6 * 2.0, abs=0.1)
    clock.t += 12
    b.stage(7, "chunk")
    assert b.rates.ocr_s_per_page == pytest.approx(8.0)  # 16 s for the 2 pages seen


def test_texts():
    assert stage_text("write") == "写入" and stage_text("parse") == "解析"
    assert format_eta(None) == "估算中" and format_eta(42) == "约 42 秒" and format_eta(600) == "约 10 分钟"


# --- through the app -----------------------------------------------------------------------------------------
@pytest.mark.slow
@needs(NOVEL)
def test_long_document_shows_moving_progress(tmp_path):
    from pipeline.engine import Engine
    from tests.live import LiveApp
    from ui.header import badge_html

    novel = NOVEL.read_bytes().decode("gb18030")
    long_doc = tmp_path / "三国演义节选.txt"
    long_doc.write_text(novel[:60_000], encoding="utf-8")
    small = []
    for i in range(3):
        p = tmp_path / f"small{i}.txt"
        p.write_text(novel[60_000 + i * 900: 60_000 + (i + 1) * 900], encoding="utf-8")
        small.append(p)
    engine = Engine(tmp_path / "data")
    live = LiveApp(engine)
    try:
        with live.http() as http:
            def post(paths):
                files = [("file", (p.name, p.read_bytes())) for p in paths]
                return {r["file_name"]: r["doc_id"] for r in http.post("/api/kb/documents", files=files).json()["data"]}

            ids = post([long_doc])
            long_id = ids[long_doc.name]
            seen, queued, badges, etas = [], {}, set(), []

            def look() -> bool:  # one look at the list and the badge; True once every document reads ready
                if len(ids) == 1 and seen and seen[-1][0] == "embed":  # the worker is busy: queue more behind it
                    ids.update(post(small))
                    return False
                items = {d["doc_id"]: d for d in http.get("/api/kb/documents", params={"size": 50}).json()["data"]["items"]}
                d = items[long_id]
                for key in ("stage", "done", "total", "eta_s"):
                    assert key in d
                if d["status"] == "processing":
                    seen.append((d["stage"], d["done"], d["total"]))
                    if d["stage"] == "embed" and d["eta_s"] is not None:
                        etas.append(d["eta_s"])
                for p in small:
                    if p.name not in ids:
                        continue
                    s = items[ids[p.name]]
                    if s["status"] == "processing" and s["stage"] == "queued" and s["position"]:
                        queued[p.name] = s["position"]
                badges.add(badge_html(engine))
                return len(ids) > 1 and all(items[i]["status"] == "ready" for i in ids.values())

            wait_until(look, 600, 0.15, "the long document and the ones queued behind it to read ready")
            final = engine.get_document(long_id)
            assert final["status"] == "ready", final
    finally:
        live.stop(close_engine=True)
    embed = [(done, total) for stage, done, total in seen if stage == "embed"]
    assert len({done for done, _ in embed}) >= 2, seen  # the counter moved while we watched
    assert {total for _, total in embed} == {final["chunk_count"]}
    assert [done for done, _ in embed] == sorted(done for done, _ in embed)  # never goes back
    assert etas and etas[-1] < etas[0], etas
    assert queued, "no document showed its place in line"  # small docs waited behind the long one
    assert any("排队" in b for b in badges)


def test_queue_progress_in_the_database(tmp_path):
    """What another process's document list reads (store.jobs.JobStore.progress over a real SQLite database):
    the holder's last written stage, and for jobs nobody holds their place in the claim order."""
    from sqlalchemy import text

    from pipeline.ingestion.progress import shared_snapshot
    from store.db import Database
    from store.documents import DocumentStore
    from store.jobs import JobStore
    from store.migrations import migrate

    db = Database(tmp_path / "app.db")
    migrate(db)
    docs, jobs = DocumentStore(db), JobStore(db)
    ids = []
    with db.transaction() as conn:
        for i in range(4):
            ids.append(conn.execute(text(
                "INSERT INTO kb_document(file_name, file_type, file_size, content_md5, status, created_at)"
                " VALUES (:name, 'txt', 10, :md5, 'processing', '2026-01-01') RETURNING doc_id"),
                {"name": f"d{i}.txt", "md5": f"m{i}"}).scalar_one())
    for d in ids:
        jobs.add(d)
    assert [j.doc_id for j in jobs.claim("worker-a", 60, 1)] == [ids[0]]
    jobs.set_stage(ids[0], "worker-a", "embed", 64, 230, 12.5)
    jobs.set_stage(ids[1], "worker-a", "embed", 1, 2, None)  # not its job: nothing written
    got = jobs.progress()
    assert got[ids[0]] == {"stage": "embed", "done": 64, "total": 230, "eta_s": 12.5, "position": None}
    assert [got[d]["position"] for d in ids[1:]] == [1, 2, 3] and got[ids[1]]["stage"] == "queued"
    snap = shared_snapshot(got[ids[0]])
    assert snap["stage_label"] == "向量化" and "64/230" in snap["progress"] and snap["eta_s"] == 12.5
    assert "排队" in shared_snapshot(got[ids[2]])["progress"] and shared_snapshot(got[ids[2]])["position"] == 2
    assert docs.get(ids[0])["status"] == "processing"
    db.close()
