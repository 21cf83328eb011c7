"""The knowledge base as an MCP server, on the official `mcp` SDK (MCPServer): four tools over the same services
and permissions as the REST API — list_knowledge_bases, search, ask, read_document.

Two transports: streamable HTTP at /mcp of the app (`mount_mcp`, stateless so any process of a team deployment can
take any request; the caller is resolved from the HTTP request's credentials exactly as on /api), and stdio for
desktop assistants (`python app.py --mcp-stdio --data-dir DIR`, `run_stdio`), where the caller is whoever started
the process.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.routing import Route

from api.doc_tags import DocFilterBody, as_filter
from pipeline.access.callers import Caller
from pipeline.engine import Engine
from pipeline.errors import EngineError
from pipeline.services.audit_log import Actor

CONTEXT_CHARS = 400  # read_document: text kept on each side of the chunk
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class CallerRefused(Exception):
    """Raised by a caller resolver: the request's credentials are missing or wrong, or its rate limit is spent;
    `response` is the answer to send (the API's own error shape)."""

    def __init__(self, response):
        super().__init__("caller refused")
        self.response = response


INSTRUCTIONS = (
    "中文知识库问答。先用 list_knowledge_bases 看可读的知识库，用 search 找原文段落，用 ask 得到带 [n] 引用的回答，"
    "用 read_document 读某段原文及其上下文。资料里没有答案时 ask 如实拒答（outcome=refuse）。 / A Chinese knowledge "
    "base: list_knowledge_bases, then search for passages, ask for an answer whose [n] cite the sources, "
    "read_document for a passage in its context. ask refuses honestly (outcome=refuse) when the materials do not "
    "hold the answer."
)

class KnowledgeBase(BaseModel):
    kb_id: int
    name: str
    description: str
    documents: int
    chunks: int


class Chunk(BaseModel):
    """A passage of a document: where it is and its text."""

    chunk_id: int
    doc_id: int | None
    document: str | None
    kb_id: int | None
    kb_name: str | None
    page: int | None
    text: str


class Passage(Chunk):
    scores: dict[str, float | None] = Field(description="fused, bm25 (BM25 score), similarity (cosine)")


class Source(Chunk):
    n: int = Field(description="the [n] of the answer's citations")
    cited: bool


class Answer(BaseModel):
    answer: str = Field(description="the answer; [n] cites sources[n-1]")
    outcome: str = Field(description="answer | weak (low relevance, check the sources) | refuse (not in the materials)")
    sources: list[Source]


class DocumentPassage(BaseModel):
    doc_id: int
    document: str
    kb_id: int | None
    kb_name: str | None
    version: int | None
    page: int | None
    context: str | None = Field(description="heading path / sheet the chunk sits under")
    chunk_id: int | None
    text: str = Field(description="the chunk (or the document's beginning)")
    before: str = Field(description="the text just before it")
    after: str = Field(description="the text just after it")
    part: int
    parts: int


KbIds = Annotated[list[int] | None, Field(
    description="要检索的知识库 id（list_knowledge_bases 给出；省略 = 默认知识库） / knowledge base ids to search "
                "(from list_knowledge_bases; omitted = the default one)")]


DocFilterArg = Annotated[DocFilterBody | None, Field(
    description="只检索符合条件的文档：tags_any（任一标签）、tags_all（全部标签）、metadata（键 = 值）、date_from / date_to"
                "（上传日期 YYYY-MM-DD）；省略 = 不过滤 / only documents matching: tags_any, tags_all, metadata "
                "(key = value), date_from / date_to (upload date); omitted = no filter")]


def build_mcp(engine: Engine, caller_of: Callable[[Context], Caller]) -> MCPServer:
    """The MCP server over `engine`; `caller_of(ctx)` says who calls (its Reader decides every KB it sees)."""
    mcp = MCPServer("kbqa", title="中文知识库问答", instructions=INSTRUCTIONS)

    def run(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except EngineError as exc:  # 4003 / 3002 / 1001 … as the tool's error text, the code kept
            raise ToolError(f"{exc.msg} (code {exc.code})") from None

    @mcp.tool(description="列出你可以读取的知识库（id、名称、说明、文档数）。 / The knowledge bases you may read: id, "
                          "name, description, document and chunk counts.")
    def list_knowledge_bases(ctx: Context) -> list[KnowledgeBase]:
        reader = caller_of(ctx).reader
        return [KnowledgeBase(kb_id=kb["kb_id"], name=kb["name"], description=kb.get("description") or "",
                              documents=kb.get("docs") or 0, chunks=kb.get("chunks") or 0)
                for kb in run(lambda: engine.list_kbs(reader=reader))]

    @mcp.tool(description="在知识库中检索与查询最相关的原文段落（关键词 + 向量双路融合），返回文档、页码、块 id 和分数。 / "
                          "Search passages (keyword + vector fusion): document, page, chunk id and scores.")
    def search(ctx: Context,
               query: Annotated[str, Field(description="检索词或问题 / the query or question")],
               kb_ids: KbIds = None,
               top_k: Annotated[int, Field(ge=1, le=50, description="返回段落数 / passages returned")] = 8,
               filter: DocFilterArg = None,
               ) -> list[Passage]:
        reader = caller_of(ctx).reader
        found = run(lambda: engine.search(query, top_k=top_k, kb_ids=kb_ids, reader=reader,
                                          doc_filter=as_filter(filter)))
        return [Passage(chunk_id=r["chunk_id"], doc_id=r["doc_id"], document=r["doc_name"], kb_id=r["kb_id"],
                        kb_name=r["kb_name"], page=r.get("page"), text=r["text"],
                        scores={"fused": r.get("fused_score"), "bm25": r.get("bm25_score"),
                                "similarity": r.get("similarity")})
                for r in found["fused"]]

    @mcp.tool(description="就知识库回答问题：回答中的 [n] 对应 sources 的第 n 条；资料不足时 outcome=refuse，相关度低时 "
                          "outcome=weak。 / Answer from the knowledge base: each [n] in the answer is sources[n]; "
                          "outcome is answer, weak (low relevance) or refuse (not in the materials).")
    def ask(ctx: Context,
            question: Annotated[str, Field(description="问题 / the question")],
            kb_ids: KbIds = None, filter: DocFilterArg = None) -> Answer:
        who = caller_of(ctx)
        res = run(lambda: engine.ask_sync(question, kb_ids=kb_ids, user=who.user, reader=who.reader,
                                          actor=Actor(who.label, "mcp"), doc_filter=as_filter(filter)))
        return Answer(answer=res["answer"], outcome=outcome_of(res), sources=[source_row(s) for s in res["sources"]])

    @mcp.tool(description="读取文档原文：给出 chunk_id 时返回该段及其前后文，否则返回文档开头。 / Read a document: with "
                          "chunk_id the passage and the text around it, else the document's beginning.")
    def read_document(ctx: Context,
                      doc_id: Annotated[int, Field(ge=1, description="文档 id（search / ask 的结果中） / document id")],
                      chunk_id: Annotated[int | None, Field(ge=1, description="块 id / chunk id")] = None,
                      ) -> DocumentPassage:
        reader = caller_of(ctx).reader
        view = run(lambda: engine.document_text(doc_id, chunk_id=chunk_id, reader=reader))
        return passage_of(view)

    return mcp


def outcome_of(res: dict) -> str:
    return "refuse" if res.get("no_answer") else "weak" if res.get("weak") else "answer"


def source_row(s: dict) -> Source:
    return Source(n=s["no"], chunk_id=s["chunk_id"], doc_id=s["doc_id"], document=s["doc_name"], kb_id=s["kb_id"],
                  kb_name=s["kb_name"], page=s["page"], text=s["text"], cited=s["cited"])


def passage_of(view: dict) -> DocumentPassage:
    """The highlighted chunk of a document view with up to CONTEXT_CHARS of its part's text on each side."""
    text, spans = view["text"], {c["chunk_id"]: c for c in view["chunks"]}
    span = spans.get(view["highlight"])
    start, end = (span["start"], span["end"]) if span else (0, min(len(text), 2 * CONTEXT_CHARS))
    return DocumentPassage(doc_id=view["doc_id"], document=view["file_name"], kb_id=view["kb_id"],
                           kb_name=view["kb_name"], version=view["version"], page=view["page"],
                           context=view["context"], chunk_id=view["highlight"], text=text[start:end],
                           before=text[max(0, start - CONTEXT_CHARS):start], after=text[end:end + CONTEXT_CHARS],
                           part=view["part"], parts=view["parts"])


# ---- streamable HTTP at /mcp of the app
def http_caller(ctx: Context) -> Caller:
    """The caller `mount_mcp`'s gate resolved for this HTTP request (kept in the request's state)."""
    request = ctx.request_context.request
    caller = getattr(getattr(request, "state", None), "kbqa_caller", None)
    if caller is None:  # never reached through the gate: refuse rather than guess
        raise ToolError("未认证的请求 / unauthenticated request")
    return caller


class _Gate:
    """ASGI wrapper of the MCP endpoint: resolves the caller before the MCP transport reads the request."""

    def __init__(self, inner, resolve: Callable[[Request], Caller]):
        self.inner, self.resolve = inner, resolve

    async def __call__(self, scope, receive, send):
        try:
            caller = self.resolve(Request(scope))
        except CallerRefused as exc:
            await exc.response(scope, receive, send)
            return
        scope.setdefault("state", {})["kbqa_caller"] = caller
        await self.inner(scope, receive, send)


def mount_mcp(app, engine: Engine, resolve: Callable[[Request], Caller], bind_host: str = "127.0.0.1") -> MCPServer:
    """Serve the MCP server at /mcp of the FastAPI `app` and run its session manager in the app's lifespan.
    DNS-rebinding protection (Host/Origin checks) is on when the app listens on loopback only."""
    mcp = build_mcp(engine, http_caller)
    security = (TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                          allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                                          allowed_origins=["http://127.0.0.1:*", "http://localhost:*",
                                                           "http://[::1]:*"])
                if bind_host in LOOPBACK else TransportSecuritySettings(enable_dns_rebinding_protection=False))
    mcp.streamable_http_app(stateless_http=True, transport_security=security)  # builds mcp.session_manager
    endpoint = _Gate(StreamableHTTPASGIApp(mcp.session_manager), resolve)
    app.router.routes.append(Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    outer = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        async with outer(a) as state, mcp.session_manager.run():
            yield state

    app.router.lifespan_context = lifespan
    return mcp


# ---- stdio, for desktop assistants
def run_stdio(engine: Engine, caller: Caller) -> None:
    """Serve MCP over this process's stdin/stdout until the client closes it (the SDK keeps stray prints of the
    libraries off the protocol's stdout)."""
    build_mcp(engine, lambda ctx: caller).run("stdio")

