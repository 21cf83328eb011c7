"""Team mode end to end: two real app processes (`python app.py`) on one real PostgreSQL and one real Chroma
server, a shared files dir, and a scripted OpenAI-compatible LLM on 127.0.0.1.

What one process does, the other sees: settings and 重载引擎, uploads (answered with citations by the other),
deletes (never cited again anywhere), retries (the stored retrieval is replayed by the other process), concurrent
duplicate uploads (one document per MD5), and a process killed with SIGKILL mid-document (the other takes the
job over once the lease runs out and finishes it: 就绪, chunk count = vector count, no orphans).
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import chromadb
import psycopg
import pytest
from chromadb.config import Settings as ChromaSettings

from store.vectors import parse_chroma_url
from tests.fake_llm import FakeLLMServer
from tests.live import AppProcess
from tests.servers import fresh_deployment
from tests.shared_data import DOCS, NOVEL, needs
from tests.waiting import holds_for, wait_until

pytestmark = [pytest.mark.slow, needs(NOVEL, DOCS / "chatchat/test.txt")]

LEASE_S = 4

KB_TEXT = ("蓝鲸物流公司的仓库位于宁波北仑港区，占地十二万平方米。"
           "蓝鲸物流公司的投诉电话是 400-600-7788，工作日 8 点到 20 点接听。\n"
           "蓝鲸物流公司创立于 2011 年。")
GONE_TEXT = "紫藤书院的院长是欧阳明远教授，书院藏书约八万册，开放时间为每周二至周日。"


class Team:
    def __init__(self, root: Path, deployment, llm: FakeLLMServer):
        self.root, self.dep, self.llm = root, deployment, llm
        self.args = ["--database-url", deployment.database_url, "--chroma-url", deployment.chroma_url,
                     "--files-dir", str(deployment.files_dir), "--ingest-lease", str(LEASE_S)]
        self.apps = {name: AppProcess(root / name / "data", *self.args, log_path=root / f"{name}.log")
                     for name in ("A", "B")}
        try:
            for app in self.apps.values():
                app.wait_ready()
        except BaseException:
            self.stop()  # never leave an app process behind when the other one fails to start
            raise

    @property
    def a(self) -> AppProcess:
        return self.apps["A"]

    @property
    def b(self) -> AppProcess:
        return self.apps["B"]

    def restart(self, name: str) -> AppProcess:
        self.apps[name].stop()
        self.apps[name] = AppProcess(self.root / name / "data", *self.args, log_path=self.root / f"{name}-2.log")
        return self.apps[name].wait_ready()

    def sql(self, query: str, params=()):
        with psycopg.connect(self.dep.database_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def collection(self):
        host, port, _, database = parse_chroma_url(self.dep.chroma_url)
        client = chromadb.HttpClient(host=host, port=port, database=database,
                                     settings=ChromaSettings(anonymized_telemetry=False))
        return client.get_collection("rag_docs")

    def stop(self):
        for app in self.apps.values():
            app.stop()


@pytest.fixture(scope="module")
def team(pg_server, chroma_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("team")
    llm = FakeLLMServer().start()
    t = Team(root, fresh_deployment(pg_server, chroma_server, root / "files", ingest_lease_s=LEASE_S), llm)
    try:
        yield t
    finally:
        t.stop()
        llm.stop()


def upload(app: AppProcess, name: str, data: bytes) -> dict:
    with app.http() as c:
        r = c.post("/api/kb/documents", files=[("file", (name, data))])
    assert r.status_code == 200, r.text
    return r.json()["data"][0]


def wait_ready(app: AppProcess, doc_id: int, timeout: float = 300) -> dict:
    with app.http() as c:
        def settled():
            d = c.get("/api/kb/documents", params={"size": 200}).json()["data"]["items"]
            doc = next((x for x in d if x["doc_id"] == doc_id), None)
            return doc if doc and doc["status"] in ("ready", "failed") else None

        return wait_until(settled, timeout, 0.3, f"doc {doc_id} to read ready or failed")


def ask(app: AppProcess, question: str, retry: bool = False) -> dict:
    with app.http() as c:
        return c.post("/api/qa/ask/sync", json={"question": question, "retry": retry}).json()


def test_settings_and_reload_reach_the_other_process(team):
    with team.a.http() as a:
        r = a.put("/api/config", json={"llm": {"llm_api_url": team.llm.base_url, "llm_model": "fake-model",
                                               "llm_api_key": "sk-team-0001"}}).json()
        assert r["code"] == 0
        assert a.post("/api/config/reload").json()["code"] == 0
    with team.b.http() as b:
        assert b.get("/api/config").json()["data"]["llm"]["llm_model"] == "fake-model"  # config version moved
        # B reloads its engine because A pressed 重载引擎
        wait_until(lambda: b.get("/api/health").json()["data"]["llm"] == "fake-model", 120, 0.3,
                   "B to reload its engine with the new LLM")


def test_upload_through_a_answer_through_b_with_citations(team):
    rec = upload(team.a, "蓝鲸物流.txt", KB_TEXT.encode())
    doc = wait_ready(team.b, rec["doc_id"])
    assert doc["status"] == "ready" and doc["chunk_count"] > 0
    team.llm.reply = "投诉电话是 400-600-7788[1]。"
    out = ask(team.b, "蓝鲸物流公司的投诉电话是多少？")
    assert out["code"] == 0, out
    assert "[1]" in out["data"]["answer"]
    src = out["data"]["sources"][0]
    assert src["cited"] and src["doc_name"] == "蓝鲸物流.txt" and "400-600-7788" in src["text"]
    with team.b.http() as b:  # B's BM25 was rebuilt from the stored tokens when the KB generation moved
        s = b.post("/api/kb/search", json={"query": "蓝鲸物流公司投诉电话", "top_k": 5}).json()["data"]
    assert s["bm25"] and s["bm25"][0]["doc_name"] == "蓝鲸物流.txt"


def test_retry_on_the_other_process_reuses_the_stored_retrieval(team):
    q = "蓝鲸物流公司的仓库在哪里？"
    team.llm.mode = "auth"
    try:
        with team.a.http() as a, a.stream("POST", "/api/qa/ask", json={"question": q}) as resp:
            lines = list(resp.iter_lines())
        assert any("2001" in ln for ln in lines if ln.startswith("data: "))
        failed_trace = next(ln for i, ln in enumerate(lines) if lines[i - 1:i] == ["event: trace"])
    finally:
        team.llm.mode = "normal"
    team.llm.reply = "仓库位于宁波北仑港区[1]。"
    with team.b.http() as b, b.stream("POST", "/api/qa/ask", json={"question": q, "retry": True}) as resp:
        lines = list(resp.iter_lines())
    retry_trace = next(ln for i, ln in enumerate(lines) if lines[i - 1:i] == ["event: trace"])
    # B replayed A's retrieval (timings included) instead of retrieving again
    assert retry_trace == failed_trace
    assert "宁波北仑港区" in "".join(ln for ln in lines if ln.startswith("data: "))
    assert "event: done" in lines


def test_delete_through_b_is_never_cited_by_a(team):
    rec = upload(team.a, "紫藤书院.txt", GONE_TEXT.encode())
    wait_ready(team.a, rec["doc_id"])
    team.llm.reply = "院长是欧阳明远教授[1]。"
    q = "紫藤书院的院长是谁？"
    before = ask(team.a, q)["data"]
    assert before["sources"] and before["sources"][0]["doc_name"] == "紫藤书院.txt"
    with team.b.http() as b:
        assert b.delete(f"/api/kb/documents/{rec['doc_id']}").json()["code"] == 0
    def never_cited_by_a() -> bool:
        for retry in (False, True):
            after = ask(team.a, q, retry=retry)["data"]
            assert all(s["doc_name"] != "紫藤书院.txt" for s in after["sources"]), after
        with team.a.http() as a:
            s = a.post("/api/kb/search", json={"query": "紫藤书院院长", "top_k": 10}).json()["data"]
        assert all(x["doc_name"] != "紫藤书院.txt" for g in ("bm25", "vector", "rrf") for x in s[g])
        return True

    # at once and for the next second and a half, answers, retries and searches on A never cite it
    holds_for(never_cited_by_a, 1.5, interval=0.5)
    assert team.collection().get(where={"doc_id": rec["doc_id"]}, include=[])["ids"] == []
    assert not (team.dep.files_dir / f"{hashlib.md5(GONE_TEXT.encode()).hexdigest()}.txt").exists()


def test_kb_deleted_through_a_is_gone_in_b(team):
    """B opened the knowledge base (a scoped question) before A deleted it: B's next question and upload into it
    answer 3002, B's list no longer has it (no restart)."""
    with team.a.http() as a:
        kb = a.post("/api/kbs", json={"name": "临时知识库"}).json()["data"]
        r = a.post("/api/kb/documents", params={"kb_id": kb["kb_id"]},
                   files=[("file", ("临时书院.txt", ("临时" + GONE_TEXT).encode()))]).json()["data"][0]
    with team.a.http() as a:
        wait_until(lambda: a.get("/api/kb/documents", params={"kb_id": kb["kb_id"]}).json()["data"]["items"][0][
            "status"] == "ready", 300, 0.3, "the upload into the new knowledge base to read ready")
    team.llm.reply = "院长是欧阳明远教授[1]。"
    with team.b.http() as b:
        res = b.post("/api/qa/ask/sync", json={"question": "紫藤书院的院长是谁？", "kb_id": kb["kb_id"]}).json()
        assert res["data"]["sources"][0]["doc_id"] == r["doc_id"]
    with team.a.http() as a:
        assert a.delete(f"/api/kbs/{kb['kb_id']}", params={"confirm": True}).json()["code"] == 0
    with team.b.http() as b:
        res = b.post("/api/qa/ask/sync", json={"question": "紫藤书院的院长是谁？", "kb_id": kb["kb_id"]}).json()
        assert res["code"] == 3002, res
        up = b.post("/api/kb/documents", params={"kb_id": kb["kb_id"]}, files=[("file", ("x.txt", b"abc"))]).json()
        assert up["code"] == 3002, up
        assert kb["kb_id"] not in [k["kb_id"] for k in b.get("/api/kbs").json()["data"]]


def test_progress_of_a_document_shows_in_both_processes(team):
    """Whichever process ingests it, both lists show the long document's stage and moving counts (the holder
    from its board, the other from the job row the holder writes about once a second)."""
    text = NOVEL.read_bytes().decode("gb18030")[:50_000]
    rec = upload(team.a, "三国演义节选-进度.txt", text.encode("utf-8"))
    seen: dict[str, set] = {"A": set(), "B": set()}

    def look() -> bool:  # one look through each process; True once either no longer reads 处理中
        done = False
        for name, app in team.apps.items():
            with app.http() as c:
                items = c.get("/api/kb/documents", params={"size": 200}).json()["data"]["items"]
            doc = next(x for x in items if x["doc_id"] == rec["doc_id"])
            if doc["status"] != "processing":
                done = True
            elif doc["stage"] not in (None, "queued"):
                seen[name].add((doc["stage"], doc["done"], doc["total"]))
        return done

    wait_until(look, 600, 0.2, "the long document to finish")
    for name in ("A", "B"):
        assert len(seen[name]) >= 2, seen  # at least two different progress values in each process
        assert any(st == "embed" and total > 100 for st, _, total in seen[name]), seen


def test_concurrent_uploads_through_both_never_duplicate(team):
    files = [(f"并发{i}.txt", f"并发上传测试文档 {i}：编号 {i * 7919} 的设备保修期为 {i + 1} 年。".encode())
             for i in range(6)]
    results: list[tuple[str, dict]] = []
    lock = threading.Lock()

    def send(app, name, data):
        r = upload(app, name, data)
        with lock:
            results.append((name, r))

    threads = [threading.Thread(target=send, args=(app, n, d)) for n, d in files for app in (team.a, team.b)
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_name: dict[str, set[int]] = {}
    for name, r in results:
        assert r["ok"], r
        by_name.setdefault(name, set()).add(r["doc_id"])
    assert all(len(ids) == 1 for ids in by_name.values()), by_name  # both processes agree on one document
    assert sum(not r["existed"] for _, r in results) == len(files)  # exactly one upload created each
    dups = team.sql("SELECT content_md5, COUNT(*) FROM kb_document GROUP BY content_md5 HAVING COUNT(*) > 1")
    assert dups == []
    for ids in by_name.values():
        doc = wait_ready(team.a, next(iter(ids)))
        assert doc["status"] == "ready"
        assert len(team.collection().get(where={"doc_id": doc["doc_id"]}, include=[])["ids"]) == doc["chunk_count"]


def test_kill9_mid_ingest_the_other_process_finishes(team):
    with team.a.http() as a:  # small chunks → hundreds of chunks, several Chroma writes
        assert a.put("/api/config", json={"chunking": {"chunk_size": 100, "chunk_overlap": 10}}).json()["code"] == 0
    src = DOCS / "chatchat/test.txt"
    rec = upload(team.a, src.name, src.read_bytes())
    doc_id = rec["doc_id"]
    col = team.collection()
    def holder_mid_document():  # the owner once some vectors are written but the document is not done
        rows = team.sql("SELECT owner FROM ingest_job WHERE doc_id = %s", (doc_id,))
        written = len(col.get(where={"doc_id": doc_id}, include=[])["ids"])
        status = team.sql("SELECT status, chunk_count FROM kb_document WHERE doc_id = %s", (doc_id,))[0]
        assert status[0] == "processing", "ingest finished before the kill: make the document longer"
        return rows[0][0] if rows and rows[0][0] and written > 0 else None

    holder = wait_until(holder_mid_document, 300, 0.05, "a worker to start the document and write vectors")
    pid = int(holder.split(":")[1])
    victim = next(name for name, app in team.apps.items() if app.proc.pid == pid)
    survivor = team.apps["B" if victim == "A" else "A"]
    team.apps[victim].kill9()  # mid-document: chunk rows and some vectors written, status 处理中
    chunks_before = team.sql("SELECT COUNT(*) FROM kb_chunk WHERE doc_id = %s", (doc_id,))[0][0]
    assert chunks_before > 0 and team.sql("SELECT status FROM kb_document WHERE doc_id = %s",
                                          (doc_id,))[0][0] == "processing"

    # the survivor takes the job over once the victim's LEASE_S lease runs out.  TODO(clock): this lease runs in
    # another process, on the wall clock; an in-process db.clock cannot move it — keep waiting here.
    doc = wait_ready(survivor, doc_id, timeout=600)
    assert doc["status"] == "ready", doc
    chunk_ids = {r[0] for r in team.sql("SELECT chunk_id FROM kb_chunk WHERE doc_id = %s", (doc_id,))}
    vector_ids = {int(i) for i in col.get(where={"doc_id": doc_id}, include=[])["ids"]}
    assert len(chunk_ids) == doc["chunk_count"] == len(vector_ids) and chunk_ids == vector_ids
    indexes = [r[0] for r in team.sql("SELECT chunk_index FROM kb_chunk WHERE doc_id = %s ORDER BY 1", (doc_id,))]
    assert indexes == list(range(doc["chunk_count"]))  # done once: no chunk twice
    all_chunks = {r[0] for r in team.sql("SELECT chunk_id FROM kb_chunk")}
    all_vectors = {int(i) for i in col.get(include=[])["ids"]}
    assert all_vectors == all_chunks  # no orphan vectors anywhere
    assert team.sql("SELECT COUNT(*) FROM ingest_job")[0][0] == 0
    with survivor.http() as c:
        s = c.post("/api/kb/search", json={"query": "ChatGPT", "top_k": 3}).json()["data"]
    assert s["bm25"] and s["bm25"][0]["doc_name"] == src.name
    team.restart(victim)  # the killed process comes back on the same data dir and joins in


def test_rebuild_in_one_process_refuses_uploads_in_the_other(team):
    with team.a.http() as a:
        assert a.post("/api/kb/rebuild").json()["code"] == 0
        try:
            with team.b.http() as b:
                r = b.post("/api/kb/documents", files=[("file", ("重建中.txt", "重建期间上传。".encode()))]).json()
                assert r["code"] == 2002 and "全量重建" in r["msg"], r
                assert b.post("/api/kb/rebuild").json()["code"] == 2002  # one rebuild at a time, across processes
        finally:
            wait_until(lambda: not a.get("/api/kb/rebuild").json()["data"]["running"], 600, 0.3, "the rebuild to end")
        assert a.get("/api/kb/rebuild").json()["data"]["error"] is None
    rec = upload(team.b, "重建后.txt", "重建结束后上传的文档。".encode())
    assert rec["ok"] and wait_ready(team.a, rec["doc_id"])["status"] == "ready"


def keyword_hits(app: AppProcess, query: str) -> list[str]:
    """The document names the keyword route (BM25 alone) returns for `query` on that process."""
    with app.http() as c:
        s = c.post("/api/kb/search", json={"query": query, "top_k": 10}).json()["data"]
    return [x["doc_name"] for x in s["bm25"]]


def until(condition, what: str):
    return wait_until(condition, 20, 0.2, what)


def test_restore_through_a_is_found_by_keyword_through_b(team):
    """Restoring an old version changes what is searchable: the other process's BM25 must follow (the change
    hook bumps the KB generation; restore used to rebuild only the local index)."""
    v1 = upload(team.a, "海棠章程.txt", "海棠俱乐部的会费为每年三百元，由理事会收取。".encode())
    wait_ready(team.a, v1["doc_id"])
    v2 = upload(team.a, "海棠章程.txt", "海棠俱乐部改为免收会费，活动经费由赞助商承担。".encode())
    assert v2["doc_id"] != v1["doc_id"]
    wait_ready(team.a, v2["doc_id"])
    until(lambda: "海棠章程.txt" in keyword_hits(team.b, "赞助商"), "B finds version 2 by keyword")
    assert "海棠章程.txt" not in keyword_hits(team.b, "理事会收取")  # version 1 is inactive everywhere
    with team.a.http() as a:
        r = a.post(f"/api/kb/documents/{v1['doc_id']}/restore").json()
    assert r["code"] == 0 and r["data"]["changed"], r
    until(lambda: "海棠章程.txt" in keyword_hits(team.b, "理事会收取"), "B finds the restored version")
    until(lambda: "海棠章程.txt" not in keyword_hits(team.b, "赞助商"), "B drops the replaced version")


def test_verified_entry_deleted_through_a_leaves_b(team):
    """A verified entry joins both routes in every process, and deleting it removes it from B's keyword route."""
    with team.a.http() as a:
        r = a.post("/api/verified", json={"question": "青檀馆的闭馆日是哪天？",
                                          "answer": "青檀馆每周一闭馆，节假日照常开放。"}).json()
    assert r["code"] == 0, r
    qa_id = r["data"]["qa_id"]
    until(lambda: keyword_hits(team.b, "青檀馆闭馆"), "B finds the verified entry by keyword")
    with team.a.http() as a:
        assert a.delete(f"/api/verified/{qa_id}").json()["code"] == 0
    until(lambda: not keyword_hits(team.b, "青檀馆闭馆"), "B no longer finds the deleted entry")
