"""The one answer event stream (SRS §7.3–7.4): its event types, their payloads, and the builders of both.

`Engine.ask()` yields these; the Gradio chat and the HTTP SSE endpoint consume the very same objects.
Order: stage(recall) → stage(rerank) → trace → stage(generate) → delta* → [replace] → sources → done, or error at
any point. `replace` voids the text the deltas streamed so far and gives the answer in its place: an LLM that ends
its answer with the 「资料不足」 verdict (pipeline/generation/verdict.py) leaves the refusal, not the retracted text.
The trace and sources payloads are built here from a plain `RetrievalResult`, so a question flows down once:
engine → retrieval → generation → these builders.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from pipeline.retrieval.nodes import node_meta, node_text
from pipeline.retrieval.result import fused_row, fusion_info
from pipeline.retrieval.result import rounded as _r

if TYPE_CHECKING:
    from pipeline.retrieval.result import RetrievalResult

NO_ANSWER_TEXT = "根据现有资料无法回答该问题，请到知识库补充相关资料。"
NO_ANSWER_SHORT = "根据现有资料无法回答"
LLM_INSUFFICIENT_REASON = "大模型判定资料不足：资料没有涉及所问的具体事项，不以相近的一般规定代替回答"
EXTRACTIVE_LABEL = "未配置大模型，以下为知识库原文摘录"

TRACE_TOP = 10  # rows per route shown in 检索过程
SNIPPET = 120   # characters of each trace row's text


class EventType(str, Enum):
    STAGE = "stage"
    TRACE = "trace"
    DELTA = "delta"
    REPLACE = "replace"
    SOURCES = "sources"
    DONE = "done"
    ERROR = "error"


# --- payloads ----------------------------------------------------------------------------------------
class StagePayload(TypedDict):
    phase: Literal["recall", "rerank", "generate"]


class TraceRow(TypedDict):
    chunk_id: int
    doc_id: int | None
    kb_name: str | None
    doc_name: str | None
    page: int | None
    text: str  # a snippet


class BM25Row(TraceRow):
    rank: int
    score: float | None


class VectorRow(TraceRow):
    rank: int
    similarity: float | None


class FusedRow(TraceRow):
    rank: int
    fused_score: float | None  # the score of the fusion mode in use
    rrf_score: float | None    # the SRS's RRF score, shown beside it
    bm25_rank: int | None      # None: not in that route's list (its score below is still the real one)
    bm25_score: float | None
    vector_rank: int | None
    similarity: float | None
    length_prior: float | None  # the fragment prior's term in fused_score (None: off, or rrf mode)


class RerankRow(TraceRow):
    no: int
    rerank_score: float | None
    rrf_score: float | None
    similarity: float | None


class RerankStatus(TypedDict):
    status: Literal["ok", "skipped", "fallback"]
    msg: str


class GateInfo(TypedDict):
    hit: bool
    max_similarity: float | None
    min_similarity: float
    # the adaptive gate (pipeline/retrieval/gate.py GateDecision.trace)
    outcome: NotRequired[Literal["answer", "weak", "refuse"]]
    weak: NotRequired[bool]
    reason: NotRequired[str]
    similarity_z: NotRequired[float | None]
    similarity_above: NotRequired[float | None]     # best cosine above the KB's background median, ×100
    background_median: NotRequired[float | None]
    best_sentence: NotRequired[float | None]        # second stage only (stage == "full")
    sentence_above: NotRequired[float | None]
    stage: NotRequired[Literal["quick", "full"] | None]
    coverage: NotRequired[float]
    phrase_coverage: NotRequired[float]
    agreement: NotRequired[float]
    score: NotRequired[float | None]
    confidence: NotRequired[float | None]


class RouteInfo(TypedDict):  # pipeline.conversation.router.Route.to_dict()
    route: Literal["DIRECT", "LIGHT", "STRONG"]
    label: str
    reason: str
    kind: str | None


class ExpansionInfo(TypedDict):  # pipeline.conversation.multi_query.Expansion.to_dict()
    queries: list[str]   # the LLM's reformulations searched besides the query
    keywords: list[str]  # searched together as one more query
    method: Literal["llm", "llm_fallback"]
    note: str            # fall-back: why (timeout, failed call, unusable reply)
    ms: float            # the LLM call's wall time
    fallback: bool       # True: retrieval searched the query alone (the offline path)
    # the retrieval the sources come from: "expanded" (the query and its phrasings, after the gate let the query
    # through) or "original" (the fall-back: the gate's own retrieval). The gate outcome is always the query's own.
    sources: NotRequired[Literal["expanded", "original"]]


class QueryInfo(TypedDict):  # pipeline.conversation.rewrite.Rewrite.to_dict(): 「检索问题：…」
    original: str
    query: str
    changed: bool
    method: str
    kind: str | None
    note: str
    expansion: NotRequired[ExpansionInfo]  # with an LLM, the setting llm_multi_query on, the gate not refusing


class CalibrationInfo(TypedDict):  # pipeline.calibration.ActiveProfile.info()
    profile: str                # the profile's name: the model's slug, or "generic"
    calibrated: bool            # fitted for this embedding model (False: the generic profile stands in)
    embedding_model: str | None
    fitted_for: str | None
    date: str | None
    min_similarity: float       # the profile's floor (the setting min_similarity may differ)
    gate: Literal["two_stage", "one_stage"]
    note: str | None


class TracePayload(TypedDict):
    bm25: list[BM25Row]
    vector: list[VectorRow]
    fused: list[FusedRow]  # the fused list, whatever the fusion mode (RRF or convex)
    rerank: list[RerankRow]
    rerank_status: RerankStatus | dict
    fusion: dict[str, Any]
    gate: GateInfo
    ms: dict[str, float]
    route: NotRequired[RouteInfo]
    query: NotRequired[QueryInfo]
    calibration: NotRequired[CalibrationInfo | None]  # the profile the fusion and the gate ran on
    filter: NotRequired[dict]  # the document filter both routes applied (pipeline/retrieval/doc_filter.py)


class DirectTracePayload(TypedDict):
    """The trace of a DIRECT answer: nothing was retrieved."""
    route: RouteInfo
    query: QueryInfo


class DeltaPayload(TypedDict):
    text: str


class ReplacePayload(TypedDict):
    """The answer text shown so far is void: show `text` instead (the whole answer, not an addition)."""
    text: str
    reason: str


class RefusalInfo(TypedDict):
    """Who refused when the answer is a refusal that the gate did not decide (the gate's is in trace.gate): the
    LLM's 「资料不足」, or the extractive reader's 「资料中未找到…」 (no sentence of the sources answers, or the figure
    asked is in none of the articles it would quote)."""
    by: Literal["llm", "extractive"]
    reason: str


class Source(TypedDict):
    no: int  # the [n] of the citations: position in the rerank output, from 1
    chunk_id: int
    doc_id: int | None  # the version cited: an answer keeps pointing at it when a newer version replaces it
    doc_name: str | None
    version: int | None
    kb_id: int | None
    kb_name: str | None
    page: int | None
    source: str  # "text" | "ocr"
    context: str | None  # heading path / sheet name the chunk sits under
    text: str
    similarity: float | None
    rerank_score: float | None
    cited: bool
    verified: bool  # a verified Q&A entry (shown as 「已核实问答」)
    # citation support check of LLM answers (pipeline/generation/support.py); None when not cited / not checked
    support: NotRequired[dict | None]


class SourcesPayload(TypedDict):
    sources: list[Source]


class SupportSummary(TypedDict):
    checked: int       # citations checked
    unsupported: int   # of those, not backed by their source


class DonePayload(TypedDict):
    elapsed_ms: int
    no_answer: bool
    mode: NotRequired[Literal["llm", "extractive", "fixed"]]  # fixed: the offline reply of a DIRECT route
    rewritten_query: NotRequired[str | None]  # what retrieval saw, when a follow-up was rewritten
    weak: NotRequired[bool]                    # answered with the 「资料相关度较低，请核对原文」 banner, or an
    #                                            extractive answer that says its sources lack the figure asked
    #                                            or hand the matter to a document the KBs do not hold, or
    #                                            that match the question only on the words the KBs hold
    support: NotRequired[list[dict]]           # per answer sentence: text, cited, scores, supported, unsupported
    support_summary: NotRequired[SupportSummary]
    refusal: NotRequired[RefusalInfo]          # no_answer decided after retrieval (the LLM's 「资料不足」)
    # added by the conversation recorder (pipeline.conversation.service.TurnRecorder) before it is sent:
    conversation_id: NotRequired[str]
    turn_id: NotRequired[int]
    route: NotRequired[Literal["DIRECT", "LIGHT", "STRONG"]]


class ErrorPayload(TypedDict):
    code: int
    msg: str


@dataclass(frozen=True)
class Event:
    type: EventType
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        try:
            object.__setattr__(self, "type", EventType(self.type))
        except ValueError:
            raise ValueError(f"unknown event type {self.type!r}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.type.value, "data": self.data}

    def to_sse(self) -> str:
        """Serialize as one Server-Sent Event frame."""
        return f"event: {self.type.value}\ndata: {json.dumps(self.data, ensure_ascii=False)}\n\n"


# --- builders ----------------------------------------------------------------------------------------
def stage(phase: str) -> Event:
    return Event(EventType.STAGE, StagePayload(phase=phase))  # type: ignore[typeddict-item]


def delta(text: str) -> Event:
    return Event(EventType.DELTA, DeltaPayload(text=text))


def replace(text: str, reason: str) -> Event:
    return Event(EventType.REPLACE, ReplacePayload(text=text, reason=reason))


def error(code: int, msg: str) -> Event:
    return Event(EventType.ERROR, ErrorPayload(code=code, msg=msg))


def done(elapsed_ms: float, no_answer: bool, mode: str | None = None, rewritten_query: str | None = None, *,
         weak: bool = False, support: Any = None, refusal: RefusalInfo | None = None) -> Event:
    """`support`: a pipeline.generation.support.SupportReport (LLM answers), or None. `refusal`: who refused
    after retrieval (None: answered, or the gate refused — its reason is in the trace)."""
    payload = DonePayload(elapsed_ms=round(elapsed_ms), no_answer=no_answer, rewritten_query=rewritten_query,
                          weak=weak)
    if refusal is not None:
        payload["refusal"] = refusal
    if mode is not None:
        payload["mode"] = mode  # type: ignore[typeddict-item]
    if support is not None:
        payload["support"] = [s.to_dict() for s in support.sentences]
        payload["support_summary"] = SupportSummary(**support.summary())
    return Event(EventType.DONE, payload)


def trace_with_support(trace: dict | None, done_payload: dict) -> dict | None:
    """The trace with what `done` decided folded in — the citation check's `support` (the counts 检索过程 shows)
    and `support_sentences` (the per-sentence marks), the LLM's `refusal` — as the chat shows it live and a
    stored turn replays it."""
    if trace is None:
        return trace
    if "refusal" in done_payload:
        trace = {**trace, "refusal": done_payload["refusal"]}
    if "support_summary" not in done_payload:
        return trace
    return {**trace, "support": done_payload["support_summary"], "support_sentences": done_payload.get("support")}


def _row(n: Any) -> TraceRow:
    meta = node_meta(n)
    text = node_text(n).replace("\n", " ")
    return TraceRow(chunk_id=int(n.node.node_id), doc_id=meta.get("doc_id"), kb_name=meta.get("kb_name"),
                    doc_name=meta.get("doc_name"), page=meta.get("page"),
                    text=text[:SNIPPET] + ("…" if len(text) > SNIPPET else ""))


def trace_payload(res: "RetrievalResult") -> TracePayload:
    """检索过程 ①–④: each route's top rows, the fused list, the final sources, rerank status, gate, timings."""
    def meta(n, key):
        return n.node.metadata.get(key)

    return TracePayload(
        bm25=[BM25Row(**_row(n), rank=i, score=_r(n.score)) for i, n in enumerate(res.bm25[:TRACE_TOP], 1)],
        vector=[VectorRow(**_row(n), rank=i, similarity=_r(n.score))
                for i, n in enumerate(res.vector[:TRACE_TOP], 1)],
        fused=[FusedRow(**_row(n), rank=i, **fused_row(n)) for i, n in enumerate(res.fused[:TRACE_TOP], 1)],
        rerank=[RerankRow(**_row(n), no=i, rerank_score=_r(meta(n, "rerank_score")),
                          rrf_score=_r(meta(n, "rrf_score"), 6), similarity=_r(meta(n, "similarity_full")))
                for i, n in enumerate(res.final, 1)],
        rerank_status=res.rerank_status,
        fusion=fusion_info(res.fusion_mode, res.bm25_weight, res.fusion_features),
        gate=(GateInfo(**res.gate) if res.gate is not None  # type: ignore[typeddict-item]
              else GateInfo(hit=res.hit, max_similarity=_r(res.max_similarity), min_similarity=res.min_similarity)),
        ms={k: round(v, 1) for k, v in res.ms.items()},
        calibration=res.calibration,  # type: ignore[typeddict-item]
    )


def trace(res: "RetrievalResult", route: RouteInfo | None = None, query: QueryInfo | None = None) -> Event:
    payload = trace_payload(res)
    if res.doc_filter:
        payload["filter"] = res.doc_filter
    if route is not None:
        payload["route"] = route
    if query is not None:
        payload["query"] = query
    return Event(EventType.TRACE, payload)


def route_trace(route: RouteInfo, query: QueryInfo) -> Event:
    """DIRECT: the trace says which route was taken and why, and that nothing was retrieved."""
    return Event(EventType.TRACE, DirectTracePayload(route=route, query=query))


def source_list(res: "RetrievalResult", cited: set[int] | frozenset[int] = frozenset(),
                support: Any = None) -> list[Source]:
    """The final nodes as numbered sources (`no` = the [n] the answer cites); `support`: a SupportReport."""
    per_source = support.per_source() if support is not None else {}
    out: list[Source] = []
    for i, n in enumerate(res.final, start=1):
        m = n.node.metadata
        out.append(Source(no=i, chunk_id=int(n.node.node_id), doc_id=m.get("doc_id"), doc_name=m.get("doc_name"),
                          version=m.get("version"), kb_id=m.get("kb_id"), kb_name=m.get("kb_name"),
                          page=m.get("page"), source=m.get("source", "text"), context=m.get("context"),
                          text=node_text(n),
                          similarity=_r(m.get("similarity_full")), rerank_score=_r(m.get("rerank_score")),
                          cited=i in cited, verified=bool(m.get("verified"))))
        if support is not None:
            out[-1]["support"] = per_source.get(i)
    return out


def sources(items: list[Source]) -> Event:
    return Event(EventType.SOURCES, SourcesPayload(sources=items))
