"""网页导入 through the real engine, fetching from a real HTTP server on 127.0.0.1 (http.server in a thread): a normal
article (its main text searchable, the navigation not), a 404 (a failed document with the reason, nothing
indexed), a 10 MB page (refused by the size limit, quickly), redirect loops (bounded), a page that changes
between two fetches (a new version) and one that does not (no new version), the interval scheduler, the audit
log, and the REST doors (KB admins only).

127.0.0.1 is loopback, so the module's engine allows private addresses (the admin setting); the guard itself is
tested on the resolver's answer (socket.getaddrinfo monkeypatched) — no traffic is ever sent to those ranges.
"""
from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.access.policy import AccessPolicy
from pipeline.errors import EngineError
from pipeline.generation.llm_target import AddressRefused, fetch_addresses
from pipeline.ingestion import web_fetch
from pipeline.ingestion.web_fetch import FetchFailed, FetchLimits
from tests.live import LiveApp
from tests.shared_data import DOCS, RULES, needs
from tests.tiny_engine import real_paragraphs, tiny_engine, tiny_model, wait_idle

PORTAL = DOCS / "gbk" / "iconv-lite_gbkFile_baidu_html.txt"  # a real search portal's home page, GB2312
pytestmark = needs(RULES, PORTAL)

NAV_WORD = "鹦鹉螺导航菜单专栏"     # only in the page's navigation and footer: boilerplate
MISSING_WORD = "琥珀色迷路告示牌"   # only in the 404 page's body
OLD_WORD, NEW_WORD = "青铜版甲号条款", "白银版乙号条款"
HUGE = 10 * 1024 * 1024
ADMIN, KBA, BOB = ("root", "r-pw"), ("kba", "k-pw"), ("bob", "b-pw")


def article(paragraphs: list[str], extra: str = "") -> bytes:
    nav = "".join(f"<li><a href='/p{i}'>{NAV_WORD}{i}</a></li>" for i in range(8))
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>监督规则</title></head><body>"
            f"<header><nav><ul>{nav}</ul></nav></header><main><article><h1>行政诉讼监督规则</h1>{body}{extra}"
            f"</article></main><footer><p>{NAV_WORD} 版权所有 联系我们</p></footer></body></html>").encode()


class Site:
    """The pages, and what the server saw (hits per path, bytes of the huge page written)."""

    def __init__(self):
        paras = real_paragraphs()
        self.article = article(paras[:12])
        self.changing = article(paras[12:16], f"<p>本页当前条款标记为{OLD_WORD}，供核对修订前后差异之用。</p>")
        self.stable = article(paras[16:20])
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()

    def hit(self, path: str) -> None:
        with self.lock:
            self.hits[path] = self.hits.get(path, 0) + 1

    def count(self, path: str) -> int:
        with self.lock:
            return self.hits.get(path, 0)


def make_handler(site: Site):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8", **headers):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k.replace("_", "-"), v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            site.hit(self.path)
            p = self.path.split("?", 1)[0]  # a query string makes another URL (another document) of the same page
            if p == "/article":
                self._send(200, site.article)
            elif p == "/missing":
                self._send(404, article([f"抱歉，您访问的页面不存在。{MISSING_WORD}。请返回首页继续浏览其他栏目内容。"] * 3))
            elif p == "/huge-declared":
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(HUGE))
                self.end_headers()
                self._stream(HUGE)
            elif p == "/huge-streamed":  # no Content-Length: the limit must stop the read itself
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Connection", "close")
                self.end_headers()
                self._stream(HUGE)
            elif p == "/loop":
                self._send(302, b"", Location="/loop")
            elif p.startswith("/chain/"):
                self._send(302, b"", Location=f"/chain/{int(p.rsplit('/', 1)[1]) + 1}")
            elif p == "/to-metadata":
                self._send(302, b"", Location="http://cloud-metadata.test/latest/")
            elif p == "/changing":
                self._send(200, site.changing)
            elif p == "/stable":
                self._send(200, site.stable)
            elif p == "/gbk":  # charset only in the page's <meta>, bytes in GBK
                self._send(200, site.article.replace(b"charset='utf-8'", b"charset='gbk'").decode().encode("gbk"),
                           "text/html")
            elif p == "/portal":
                self._send(200, PORTAL.read_bytes(), "text/html")
            elif p == "/slow":
                time.sleep(3)
                self._send(200, site.article)
            elif p == "/image":
                self._send(200, b"\x89PNG....", "image/png")
            else:
                self._send(404, b"no")

        def _stream(self, n: int) -> None:
            block = b"<p>" + "填充内容".encode() * 5000 + b"</p>"
            sent = 0
            try:
                while sent < n:
                    self.wfile.write(block)
                    sent += len(block)
            except OSError:
                pass  # the client hung up: what the size limit is for

    return Handler


@pytest.fixture(scope="module")
def site():
    s = Site()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(s))
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    s.base = f"http://127.0.0.1:{server.server_address[1]}"
    yield s
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web-sources")
    e = tiny_engine(tmp / "data", tiny_model(tmp / "tiny"), web_allow_private=True, web_fetch_timeout_s=5.0,
                    web_max_page_bytes=1_000_000, web_max_redirects=4)
    yield e
    e.close()


def bm25_texts(engine, query: str, kb_id: int = 1) -> list[str]:
    return [h["text"] for h in engine.search(query, 10, kb_ids=[kb_id])["bm25"]]


def doc_of(engine, src: dict) -> dict:
    return engine.get_document(src["last_doc_id"])


def limits(**kw) -> FetchLimits:
    base = {"timeout_s": 5.0, "max_bytes": 1_000_000, "max_redirects": 4, "allow_private": True}
    return FetchLimits(**{**base, **kw})


# --- the page kinds -------------------------------------------------------------------------------------------
def test_article_main_text_searchable_navigation_not(engine, site):
    src = engine.add_web_source(1, f"{site.base}/article")
    assert src["status"] == "ok", src
    wait_idle(engine)
    doc = doc_of(engine, src)
    assert doc["status"] == "ready" and doc["file_name"] == src["doc_name"] and doc["file_name"].endswith(".md")
    text = "\n".join(ch["text"] for ch in engine.document_chunks(doc["doc_id"]))
    first = real_paragraphs()[0]
    assert first[:30] in text
    assert NAV_WORD not in text and "版权所有" not in text
    hits = bm25_texts(engine, first[:40])
    assert any(first[:20] in h for h in hits), hits
    assert not any(NAV_WORD in h for h in bm25_texts(engine, NAV_WORD))
    # the snapshot is the stored original, and the source URL is recorded with it
    path, _ = engine.document_file(doc["doc_id"])
    assert f"来源：{site.base}/article" in path.read_text(encoding="utf-8")
    assert engine.list_web_sources(1)[0]["url"] == f"{site.base}/article"
    # the URL is the document's automatic `source` metadata: a filter on it finds the page
    assert engine.components.doc_tags.get(doc["doc_id"])["metadata"]["source"] == f"{site.base}/article"
    found = engine.search(first[:40], 5, [1], doc_filter={"metadata": {"source": f"{site.base}/article"}})
    assert found["fused"] and {h["doc_id"] for h in found["fused"]} == {doc["doc_id"]}, found


def test_404_is_a_failed_document_with_reason_nothing_indexed(engine, site):
    src = engine.add_web_source(1, f"{site.base}/missing")
    assert src["status"] == "failed" and "404" in src["message"]
    doc = doc_of(engine, src)
    assert doc["status"] == "failed" and "404" in doc["fail_reason"]
    assert engine.document_chunks(doc["doc_id"]) == []
    wait_idle(engine)
    assert not any(MISSING_WORD in h for h in bm25_texts(engine, MISSING_WORD))
    listed = {d["doc_id"]: d for d in engine.list_documents(1, 100, kb_id=1)["items"]}
    assert listed[doc["doc_id"]]["status"] == "failed"  # the admin sees it, with its reason
    # a second failure updates the same failed row instead of adding another
    again = engine.refetch_web_source(src["source_id"])
    assert again["last_doc_id"] == doc["doc_id"]
    assert len(engine.document_versions(doc["doc_id"])) == 1


@pytest.mark.parametrize("path", ["/huge-declared", "/huge-streamed"])
def test_10mb_page_refused_by_size_limit_quickly(engine, site, path):
    t0 = time.monotonic()
    src = engine.add_web_source(1, f"{site.base}{path}")
    elapsed = time.monotonic() - t0
    assert src["status"] == "failed" and "过大" in src["message"], src
    assert elapsed < 5, elapsed  # refused at the limit (1 MB here), not after reading 10 MB
    assert engine.document_chunks(src["last_doc_id"]) == []


def test_gbk_page_decoded_portal_without_main_text_failed(engine, site):
    page = web_fetch.fetch_page(f"{site.base}/gbk", limits())
    assert real_paragraphs()[0][:30] in page.text and NAV_WORD not in page.text
    src = engine.add_web_source(1, f"{site.base}/portal")  # only a search box and links: nothing to index
    assert src["status"] == "failed" and "没有可提取的正文" in src["message"]
    assert engine.document_chunks(src["last_doc_id"]) == []


def test_slow_server_times_out(site):
    t0 = time.monotonic()
    with pytest.raises(FetchFailed, match="超时"):
        web_fetch.fetch(f"{site.base}/slow", limits(timeout_s=1.0))
    assert time.monotonic() - t0 < 2.5


def test_redirect_loops_are_bounded(site):
    t0 = time.monotonic()
    with pytest.raises(FetchFailed, match="重定向循环"):
        web_fetch.fetch(f"{site.base}/loop", limits())
    before = site.count("/chain/5")
    with pytest.raises(FetchFailed, match="重定向次数超过 4"):
        web_fetch.fetch(f"{site.base}/chain/0", limits())
    assert site.count("/chain/4") >= 1 and site.count("/chain/5") == before  # the 5th hop is never requested
    assert time.monotonic() - t0 < 5


def test_changed_page_new_version_unchanged_page_none(engine, site):
    changing = engine.add_web_source(1, f"{site.base}/changing")
    stable = engine.add_web_source(1, f"{site.base}/stable")
    wait_idle(engine)
    assert changing["status"] == stable["status"] == "ok"
    assert any(OLD_WORD in h for h in bm25_texts(engine, OLD_WORD))

    site.changing = site.changing.replace(OLD_WORD.encode(), NEW_WORD.encode())
    again = engine.refetch_web_source(changing["source_id"])
    assert again["status"] == "ok" and again["last_doc_id"] != changing["last_doc_id"]
    wait_idle(engine)
    versions = engine.document_versions(again["last_doc_id"])
    assert [v["version"] for v in versions] == [2, 1] and versions[0]["active"] == 1
    assert any(NEW_WORD in h for h in bm25_texts(engine, NEW_WORD))
    assert not any(OLD_WORD in h for h in bm25_texts(engine, OLD_WORD))  # the old version left retrieval

    same = engine.refetch_web_source(stable["source_id"])
    assert same["status"] == "unchanged" and same["last_doc_id"] == stable["last_doc_id"]
    assert len(engine.document_versions(stable["last_doc_id"])) == 1


def test_interval_claims_due_urls_once(engine, site):
    src = engine.add_web_source(1, f"{site.base}/stable?interval", interval_min=5)
    assert src["status"] == "ok", src["message"]
    hits = site.count("/stable?interval")
    web = engine.web_sources
    now = time.time()
    assert web.run_due(now=now + 60) == 0  # not due yet
    assert web.run_due(now=now + 5 * 60 + 1) == 1
    assert site.count("/stable?interval") == hits + 1
    assert web.run_due(now=now + 5 * 60 + 1) == 0  # claimed: the next is due an interval later
    assert engine.set_web_source_interval(src["source_id"], None)["next_due"] is None
    assert web.run_due(now=now + 10**6) == 0


def test_audit_log_records_add_and_refetch(engine, site):
    # its own source: under `-n 2` the module's other tests may run in another worker
    before = len(engine.audit_log(1, 500, kind="admin")["items"])
    src = engine.add_web_source(1, f"{site.base}/stable?audit")
    engine.refetch_web_source(src["source_id"])
    items = engine.audit_log(1, 500, kind="admin")["items"]
    actions = [r["action"] for r in items]
    assert len(items) >= before + 2 and "web_source.add" in actions and "web_source.refetch" in actions


def test_other_kinds_and_bad_urls_refused(engine, site):
    src = engine.add_web_source(1, f"{site.base}/image")
    assert src["status"] == "failed" and "不支持的网页类型" in src["message"]
    for bad in ("file:///etc/passwd", "ftp://example.com/x", "javascript:alert(1)", "http://"):
        with pytest.raises(EngineError) as exc:
            engine.add_web_source(1, bad)
        assert exc.value.field == "url"
    url = f"{site.base}/article"
    if url not in {w["url"] for w in engine.list_web_sources(1)}:  # this test alone: nothing added it yet
        engine.add_web_source(1, url)
    with pytest.raises(EngineError, match="已在此知识库"):
        engine.add_web_source(1, url)


def test_loopback_refused_when_setting_off_no_traffic(engine, site):
    engine.update_settings({"web_allow_private": False})
    try:
        hits = site.count("/article?off")
        src = engine.add_web_source(1, f"{site.base}/article?off")
        assert src["status"] == "failed" and "不允许访问内网或本机地址" in src["message"]
        assert site.count("/article?off") == hits  # refused before any connection
    finally:
        engine.update_settings({"web_allow_private": True})


# --- the address guard, on the resolver's answer (nothing is sent to these ranges) ---------------------------
@pytest.fixture
def resolver(monkeypatch):
    """socket.getaddrinfo answering `answers[host]`; socket.create_connection recording (and refusing) any
    connection attempt, so a test proves none was made."""
    answers: dict[str, list[str]] = {}
    attempts: list = []

    def getaddrinfo(host, port, *a, **kw):
        fam = {True: socket.AF_INET6, False: socket.AF_INET}
        return [(fam[":" in a_], socket.SOCK_STREAM, 6, "", (a_, port or 0)) for a_ in answers[host]]

    def create_connection(address, *a, **kw):
        attempts.append(address)
        raise AssertionError(f"connection attempted to {address}")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return answers, attempts


@pytest.mark.parametrize("addr", ["10.1.2.3", "192.168.1.20", "169.254.169.254", "::1", "127.0.0.2", "172.16.5.4",
                                  "100.64.0.1", "fc00::1", "0.0.0.0"])
def test_guard_refuses_private_loopback_link_local(resolver, addr):
    answers, attempts = resolver
    answers["intranet.test"] = [addr]
    with pytest.raises(AddressRefused):
        fetch_addresses("intranet.test", allow_private=False)
    with pytest.raises(FetchFailed, match="不允许"):
        web_fetch.fetch("http://intranet.test/page", limits(allow_private=False))
    assert attempts == []


def test_guard_allow_setting_opens_private_not_link_local(resolver):
    answers, _ = resolver
    answers["intranet.test"] = ["10.1.2.3"]
    assert fetch_addresses("intranet.test", allow_private=True) == ["10.1.2.3"]
    answers["meta.test"] = ["169.254.169.254"]
    with pytest.raises(AddressRefused, match="链路本地"):
        fetch_addresses("meta.test", allow_private=True)
    answers["mixed.test"] = ["93.184.216.34", "192.168.0.9"]  # one bad answer is enough to refuse
    with pytest.raises(AddressRefused):
        fetch_addresses("mixed.test", allow_private=False)
    answers["public.test"] = ["93.184.216.34"]
    assert fetch_addresses("public.test", allow_private=False) == ["93.184.216.34"]


def test_every_redirect_hop_is_vetted(site, monkeypatch):
    """The first hop (the local server) is allowed; its redirect to a name resolving to the metadata address is
    refused before any connection there."""
    real = socket.getaddrinfo
    connections: list = []
    real_connect = socket.create_connection

    def getaddrinfo(host, port, *a, **kw):
        if host == "cloud-metadata.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port or 0))]
        return real(host, port, *a, **kw)

    def create_connection(address, *a, **kw):
        connections.append(address[0])
        return real_connect(address, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    with pytest.raises(FetchFailed, match="链路本地或云主机元数据"):
        web_fetch.fetch(f"{site.base}/to-metadata", limits())
    assert connections == ["127.0.0.1"]


# --- REST: KB admins only -------------------------------------------------------------------------------------
@pytest.mark.slow  # the real app (REST + Gradio page) started in a thread
def test_rest_web_sources_kb_admin_only(engine, site):
    policy = AccessPolicy.from_args([":".join(ADMIN), ":".join(KBA), ":".join(BOB)], [ADMIN[0]], [KBA[0]])
    app = LiveApp(engine, policy)
    try:
        with app.http(auth=BOB) as http:
            r = http.post("/api/kbs/1/web-sources", json={"url": f"{site.base}/stable?rest"})
            assert r.status_code == 403 and r.json()["code"] == 4003
            assert http.get("/api/kbs/1/web-sources").json()["code"] == 4003
        with app.http(auth=KBA) as http:
            r = http.post("/api/kbs/1/web-sources", json={"url": f"{site.base}/stable?rest", "interval_min": 60})
            body = r.json()
            assert body["code"] == 0 and body["data"]["status"] == "ok", body["data"]["message"]
            assert body["data"]["interval_min"] == 60
            sid = body["data"]["source_id"]
            assert any(s["source_id"] == sid for s in http.get("/api/kbs/1/web-sources").json()["data"])
            assert http.post(f"/api/web-sources/{sid}/refetch").json()["data"]["status"] == "unchanged"
            assert http.put(f"/api/web-sources/{sid}", json={"interval_min": None}).json()["data"]["interval_min"] is None
            assert http.delete(f"/api/web-sources/{sid}").json()["data"]["removed"] is True
        rows = engine.audit_log(1, 50, kind="admin")["items"]
        assert any(r["action"] == "web_source.refetch" and r["actor"] == "kba" and r["door"] == "rest" for r in rows)

        # a KB-admin API key limited to another knowledge base reaches none of this one's sources
        other = engine.create_kb("别的库")["kb_id"]
        key = engine.create_api_key("web-other", "kb-admin", [other])["secret"]
        target = engine.add_web_source(1, f"{site.base}/stable?key-target")["source_id"]
        with app.http(headers={"Authorization": f"Bearer {key}"}) as http:
            assert http.get("/api/kbs/1/web-sources").json()["code"] == 4003
            r = http.post("/api/kbs/1/web-sources", json={"url": f"{site.base}/stable?key"})
            assert r.json()["code"] == 4003
            assert http.post(f"/api/web-sources/{target}/refetch").json()["code"] == 4003
            assert http.get(f"/api/kbs/{other}/web-sources").json() == {"code": 0, "msg": "ok", "data": []}
        assert not any(s["url"].endswith("?key") for s in engine.list_web_sources(1))

        # the page (知识库 → 网页与文件夹同步): add, list with status, 重新抓取; a plain user is refused
        page = app.client(auth=KBA)
        msg, table, _ = page.predict(f"{site.base}/stable?page", None, 1, api_name="/src_add_url")
        assert "已添加" in msg and f"{site.base}/stable?page" in table and "已导入" in table
        sid = next(s["source_id"] for s in engine.list_web_sources(1) if s["url"].endswith("?page"))
        msg, table, _ = page.predict(sid, 1, api_name="/src_refetch")
        assert "未变化" in msg and f'data-source="{sid}"' in table
        msg, _, _ = page.predict(f"{site.base}/missing?page", None, 1, api_name="/src_add_url")
        assert "失败" in msg and "404" in msg
        with pytest.raises(Exception, match="无权限"):
            app.client(auth=BOB).predict(f"{site.base}/stable?bob", None, 1, api_name="/src_add_url")
        assert not any(s["url"].endswith("?bob") for s in engine.list_web_sources(1))
        assert any(r["action"] == "web_source.add" and r["door"] == "page" and r["actor"] == "kba"
                   for r in engine.audit_log(1, 50, kind="admin")["items"])
    finally:
        app.stop(close_engine=False)


# --- the stores on both dialects: each due source claimed by one process only ---------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])  # a PostgreSQL server: slow
def target(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "app.db"
    return request.getfixturevalue("pg_server").create_database()


def test_due_sources_claimed_once_across_processes(target):
    from store.db import Database
    from store.knowledge_bases import KBStore
    from store.sources import FolderSourceStore, WebSourceStore

    dbs = [Database(target) for _ in range(3)]  # three app processes on one database
    try:
        kb = KBStore(dbs[0]).create("来源", "")["kb_id"]
        stores = [WebSourceStore(d) for d in dbs]
        now = 1_000_000.0
        ids = {stores[0].add(kb, f"https://example.org/{i}", f"n{i}.md", 5, "t", now)["source_id"] for i in range(20)}
        got: list[list[int]] = [[] for _ in stores]
        threads = [threading.Thread(target=lambda i=i: got[i].extend(stores[i].claim_due(now + 301)))
                   for i in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        every = [s for mine in got for s in mine]
        assert sorted(every) == sorted(ids)  # each exactly once
        assert all(stores[1].get(s)["next_due"] == now + 301 + 300 for s in ids)

        folders = FolderSourceStore(dbs[1])
        src = folders.set(kb, "/srv/a", None, "t", now)
        folders.put_file(src["source_id"], "x/y.txt", doc_name="x／y.txt", size=1, mtime=2.5, md5="a" * 32,
                         lineage_id=None, state="ok")
        folders.put_file(src["source_id"], "x/y.txt", doc_name="x／y.txt", size=3, mtime=4.5, md5="b" * 32,
                         lineage_id=7, state="flagged")  # the upsert
        assert folders.files(src["source_id"])["x/y.txt"]["md5"] == "b" * 32
        rid = folders.add_report(src["source_id"], kb, {"started_at": now, "finished_at": now + 1, "cause": "manual",
                                                        "added": ["a"], "updated": [], "removed": [], "failed": [],
                                                        "unchanged": ["b", "c"]})
        rep = folders.reports(src["source_id"])[0]
        assert rep["report_id"] == rid and (rep["added"], rep["unchanged"]) == (1, 2) and rep["detail"]["added"] == ["a"]
        KBStore(dbs[2]).delete(kb)  # the sources go with their knowledge base
        assert stores[2].list(kb) == [] and folders.of_kb(kb) is None
    finally:
        for d in dbs:
            d.close()


def test_refetch_refused_while_another_process_fetches(engine, site):
    src = engine.add_web_source(1, f"{site.base}/stable?lease", interval_min=1)
    leases = engine.components.leases
    assert leases.acquire(f"web_source:{src['source_id']}", "other-host:1:x", 60)
    try:
        hits = site.count("/stable?lease")
        with pytest.raises(EngineError, match="正在抓取"):
            engine.refetch_web_source(src["source_id"])
        assert engine.web_sources.run_due(now=time.time() + 61) >= 1  # claimed, but the lease says: skip
        assert site.count("/stable?lease") == hits
    finally:
        leases.release(f"web_source:{src['source_id']}", "other-host:1:x")


def test_extraction_makes_no_network_use(site, monkeypatch):
    """trafilatura only parses the bytes it is handed: with every socket connection refused (and names
    unresolvable), extracting a fetched page still works."""
    fetched = web_fetch.fetch(f"{site.base}/article", limits())

    def refused(*a, **kw):
        raise AssertionError(f"network use during extraction: {a!r}")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)
    monkeypatch.setattr(socket, "getaddrinfo", refused)
    page = web_fetch.extract(fetched)
    assert real_paragraphs()[0][:30] in page.text


def test_failed_fetch_survives_rebuild_and_audit(engine, site):
    """A failed fetch has a reason and no original: 全量重建 leaves it as it is (never re-parsed into content) and
    the consistency audit does not call it a lost file."""
    src = engine.add_web_source(1, f"{site.base}/missing?rebuild")
    doc_id = src["last_doc_id"]
    wait_idle(engine)
    assert engine.rebuild(timeout=600, kb_id=1)["error"] is None
    doc = engine.get_document(doc_id)
    assert doc["status"] == "failed" and "404" in doc["fail_reason"]
    assert engine.document_chunks(doc_id) == []
    report = engine.audit(check_tokens=False)
    missing = [i for f in report["findings"] if f["check"] == "missing_files" for i in f["items"]]
    assert not any(i["doc_id"] == doc_id for i in missing), missing


@pytest.mark.slow  # PostgreSQL + Chroma servers and two engines
def test_team_mode_two_processes_fetch_a_due_url_once(team_deployment, site, tmp_path):
    """Two engines on one PostgreSQL + Chroma (what two app processes share): a due URL is fetched by one of
    them only, and 重新抓取 on one is refused while the other holds the URL."""
    from pipeline.engine import Engine
    from store.config_store import ConfigStore
    from store.db import Database

    model = tiny_model(tmp_path / "tiny")
    db = Database(team_deployment.database_url)
    ConfigStore(db).save({"embedding_model_path": str(model), "min_similarity": 0.0, "web_allow_private": True})
    db.close()
    a = Engine(tmp_path / "a", deployment=team_deployment)
    b = Engine(tmp_path / "b", deployment=team_deployment)
    try:
        src = a.add_web_source(1, f"{site.base}/stable?team", interval_min=1)
        assert src["status"] == "ok", src["message"]
        assert any(s["source_id"] == src["source_id"] for s in b.list_web_sources(1))
        hits = site.count("/stable?team")
        due = time.time() + 61
        claimed: list[int] = []
        threads = [threading.Thread(target=lambda e=e: claimed.append(e.web_sources.run_due(now=due))) for e in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(claimed) == [0, 1] and site.count("/stable?team") == hits + 1
        assert b.list_web_sources(1)[0]["status"] == "unchanged"

        lease = f"web_source:{src['source_id']}"
        assert a.components.leases.acquire(lease, a.components.ingest.owner, 60)
        try:
            with pytest.raises(EngineError, match="正在抓取"):
                b.refetch_web_source(src["source_id"])
        finally:
            a.components.leases.release(lease, a.components.ingest.owner)
        assert b.refetch_web_source(src["source_id"])["status"] == "unchanged"
    finally:
        b.close()
        a.close()
