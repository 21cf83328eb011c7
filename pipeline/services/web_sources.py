"""网页 sources of a knowledge base: add a URL, 重新抓取 on demand or on an interval per URL.

The URL is the document's identity: it names the document (`doc_name_for`), so each fetch goes in through the
ordinary upload path (DocumentService.upload) under that name — changed content becomes the next version of
the same document, unchanged content is 已存在 and makes no version. The stored original is the snapshot of the
extracted main text (web_fetch.Page.snapshot).

A fetch that fails (refused address, timeout, too large, redirect loop, HTTP 404 …) is a 失败 document carrying
the reason and nothing else: no file, no chunks, never indexed — the error page's text never becomes content.
A later failure of the same URL updates that one failed row instead of piling up new ones; the next good fetch
removes it. A page that fetched well before keeps its active version meanwhile.

Scheduled fetches are claimed through the table (store/sources.py claim_due: one process per due row), and
every fetch — scheduled or 重新抓取 — runs under the named lease `web_source:<id>` (store/leases.py), so two app
processes never fetch the same URL at once.
"""
from __future__ import annotations

import hashlib
import logging
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pipeline.errors import CODE_ENGINE, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.ingestion.web_fetch import FetchFailed, FetchLimits, check_url, fetch_page
from pipeline.services.audit_log import Actor
from pipeline.services.source_schedule import FollowedSources
from store.sources import WebSourceStore

if TYPE_CHECKING:
    from pipeline.settings import Settings

log = logging.getLogger(__name__)

LEASE_S = 600.0  # longer than any fetch can take (timeout × hops) plus the upload
MAX_INTERVAL_MIN = 60 * 24 * 30


def doc_name_for(url: str) -> str:
    """The document name a URL gets: host and path (slashes as ／, so the name is one path component) and a short
    hash of the whole URL (query included), so two URLs never share a document."""
    p = urlsplit(url)
    base = f"{p.hostname or ''}{p.path}".rstrip("/").replace("/", "／") or "网页"
    digest = hashlib.sha1(url.encode("utf-8")).hexdigest()[:8]
    return f"{base[:120]}-{digest}.md"


def check_interval(interval_min) -> int | None:
    if interval_min in (None, "", 0):
        return None
    try:
        v = int(interval_min)
    except (TypeError, ValueError):
        raise EngineError(CODE_VALIDATION, "抓取间隔必须是分钟数", "interval_min") from None
    if not 1 <= v <= MAX_INTERVAL_MIN:
        raise EngineError(CODE_VALIDATION, f"抓取间隔须在 1–{MAX_INTERVAL_MIN} 分钟之间（留空 = 只手动抓取）",
                          "interval_min")
    return v


def fetch_limits(s: Settings) -> FetchLimits:
    return FetchLimits(timeout_s=s.web_fetch_timeout_s, max_bytes=s.web_max_page_bytes,
                       max_redirects=s.web_max_redirects, allow_private=s.web_allow_private)


class WebSources(FollowedSources):
    store_type = WebSourceStore
    kind = "web source"

    # ---- reading
    def list(self, kb_id: int) -> list[dict]:
        """The knowledge base's URLs: url, doc_name, status (pending / ok / unchanged / failed), message,
        last_fetch_at, interval_min, next_due, last_doc_id."""
        self.c.kbs.check(kb_id)
        return self.store.list(kb_id)

    def get(self, source_id: int) -> dict:
        src = self.store.get(source_id)
        if src is None:
            raise EngineError(CODE_NO_DOC, f"网页来源不存在：{source_id}")
        return src

    # ---- changes
    def add(self, kb_id: int, url: str, interval_min: int | None = None, actor: Actor | None = None,
            fetch_now: bool = True) -> dict:
        """Follow `url` in the knowledge base and fetch it now (the reply is the source after the fetch)."""
        kb_id = self.c.kbs.check(kb_id, fresh=True)
        try:
            url = check_url(url)
        except FetchFailed as exc:
            raise EngineError(CODE_VALIDATION, exc.reason, "url") from None
        interval = check_interval(interval_min)
        if self.store.find(kb_id, url) is not None:
            raise EngineError(CODE_VALIDATION, "该网址已在此知识库中，请用「重新抓取」", "url")
        try:
            src = self.store.add(kb_id, url, doc_name_for(url), interval, actor.name if actor else None, self.clock())
        except Exception:  # a concurrent add of the same URL won the UNIQUE(kb_id, url) race
            if self.store.find(kb_id, url) is not None:
                raise EngineError(CODE_VALIDATION, "该网址已在此知识库中，请用「重新抓取」", "url") from None
            raise
        self.audit.admin(actor, "web_source.add", {"url": url, "interval_min": interval}, [kb_id])
        return self._fetch(src) if fetch_now else src

    def refetch(self, source_id: int, actor: Actor | None = None) -> dict:
        """重新抓取 now. Refused while another process fetches this URL."""
        src = self.get(source_id)
        self.audit.admin(actor, "web_source.refetch", {"url": src["url"], "source_id": src["source_id"]},
                         [src["kb_id"]])
        return self._fetch(src, refuse_busy=True)

    def set_interval(self, source_id: int, interval_min: int | None, actor: Actor | None = None) -> dict:
        src = self.get(source_id)
        interval = check_interval(interval_min)
        self.store.set_interval(source_id, interval, self.clock())
        self.audit.admin(actor, "web_source.interval", {"url": src["url"], "interval_min": interval}, [src["kb_id"]])
        return self.get(source_id)

    def remove(self, source_id: int, actor: Actor | None = None) -> dict:
        """Stop following the URL; its document stays (delete it in the document list)."""
        src = self.get(source_id)
        self.store.delete(source_id)
        self.audit.admin(actor, "web_source.remove", {"url": src["url"]}, [src["kb_id"]])
        return {"source_id": source_id, "removed": True}

    def _run_due_one(self, src: dict) -> None:
        self._fetch(src)

    # ---- the fetch
    def _fetch(self, src: dict, refuse_busy: bool = False) -> dict:
        lease, owner = f"web_source:{src['source_id']}", self.c.ingest.owner
        if not self.c.leases.acquire(lease, owner, LEASE_S):
            if refuse_busy:
                raise EngineError(CODE_ENGINE, "该网页正在抓取中，请稍后再试")
            return src
        try:
            self.store.record(src["source_id"], status="fetching")
            try:
                page = fetch_page(src["url"], fetch_limits(self.settings()))
            except FetchFailed as exc:
                self._failed(src, exc.reason)
            except Exception as exc:  # an extractor crash on a strange page: a failure like any other
                log.exception("fetching %s crashed", src["url"])
                self._failed(src, f"抓取出错：{type(exc).__name__}")
            else:
                self._ingest(src, page.snapshot(src["url"]))
        finally:
            self.c.leases.release(lease, owner)
        return self.get(src["source_id"])

    def _ingest(self, src: dict, snapshot: str) -> None:
        body = snapshot.encode("utf-8")
        self._drop_failed_row(src)  # before the upload: the new version is numbered after the good ones
        with tempfile.TemporaryDirectory(prefix="kbqa-web-") as tmp:
            path = Path(tmp) / "page.md"
            path.write_bytes(body)
            try:
                result = self.documents.upload([(src["doc_name"], path)], src["kb_id"])[0]
            except EngineError as exc:  # uploads refused right now (全量重建): try again next time
                self.store.record(src["source_id"], status="failed" if src["status"] == "pending" else src["status"],
                                  message=f"暂未导入：{exc.msg}", last_fetch_at=self.clock())
                return
        md5 = hashlib.md5(body).hexdigest()
        if not result.ok:
            self._failed({**src, "last_doc_id": None}, result.msg)
            return
        if not result.existed and result.doc_id is not None and self.c.doc_tags is not None:
            self.c.doc_tags.put(result.doc_id, "source", src["url"])  # automatic metadata: where it came from
        status = "unchanged" if result.existed else "ok"
        msg = "内容未变化，未产生新版本" if result.existed else result.msg
        self.store.record(src["source_id"], status=status, message=msg, last_fetch_at=self.clock(),
                          last_doc_id=result.doc_id, content_md5=md5)

    def _drop_failed_row(self, src: dict) -> None:
        """A good fetch after failed ones: the failed row (reason only, no content) has done its job."""
        doc = self.c.docs.get(src["last_doc_id"]) if src.get("last_doc_id") else None
        if doc is not None and doc["status"] == "failed" and not doc.get("stored_name"):
            self.c.docs.delete(doc["doc_id"])

    def _failed(self, src: dict, reason: str) -> None:
        """The failure as a 失败 document with its reason — a row without file, chunks or vectors."""
        docs = self.c.docs
        prev = docs.get(src["last_doc_id"]) if src.get("last_doc_id") else None
        if prev is not None and prev["status"] == "failed" and not prev.get("stored_name"):
            docs.set_status(prev["doc_id"], "failed", reason)
            doc_id = prev["doc_id"]
        else:
            current = docs.find_active_by_name(src["kb_id"], src["doc_name"])
            lineage = current["lineage_id"] if current else None
            version = docs.next_version(lineage) if lineage else 1
            # content_md5 is unique per knowledge base: a failed fetch has no content, so a random marker
            doc = docs.create(src["doc_name"], "md", 0, uuid.uuid4().hex, None, src["kb_id"], lineage, version)
            docs.set_status(doc["doc_id"], "failed", reason)
            doc_id = doc["doc_id"]
        self.store.record(src["source_id"], status="failed", message=reason, last_fetch_at=self.clock(),
                          last_doc_id=doc_id)
        log.info("web source %s failed: %s", src["url"], reason)
