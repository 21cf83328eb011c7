"""Answering: the one answer event stream every door uses (page, REST/SSE, and the doors built on them), the
synchronous form over it, and the dual-route debug search."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipeline import events as ev
from pipeline.access.kb_readers import Reader
from pipeline.conversation.direct import direct_reply
from pipeline.conversation.rewrite import Rewrite, previous_docs, previous_query
from pipeline.conversation.router import DIRECT, Route
from pipeline.conversation.service import HISTORY_TURNS, TurnRecorder
from pipeline.errors import CODE_ENGINE, CODE_LLM, CODE_VALIDATION, EngineError
from pipeline.retrieval.doc_filter import DocFilter, parse_filter
from pipeline.retrieval.lexical import content_terms, normalize
from pipeline.retrieval.result import RetrievalResult
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.services.knowledge_bases import KnowledgeBaseService
from pipeline.services.lifecycle import Lifecycle
from pipeline.services.retry_cache import StoredRetrievals
from pipeline.services.settings import SettingsService

if TYPE_CHECKING:
    from pipeline.components import Components
    from pipeline.settings import Settings

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 2000


@dataclass(frozen=True)
class Generation:
    """What a client may ask of the LLM for one answer (the OpenAI-compatible API's temperature / max_tokens);
    None = the settings. Extractive answers (no LLM) ignore both."""

    temperature: float | None = None
    max_tokens: int | None = None


class AnswerService:
    """`catch_up` brings this process in step with other processes before a question (one read of the shared
    counters); `recent` holds the retrieval behind each recent answer (重试)."""

    def __init__(self, c: Components, settings: SettingsService, lifecycle: Lifecycle, kbs: KnowledgeBaseService,
                 recent: StoredRetrievals, catch_up: Callable[[], None], audit: AuditLog):
        self.c = c
        self.audit = audit
        self.settings = settings
        self.lifecycle = lifecycle
        self.kbs = kbs
        self.recent = recent
        self.catch_up = catch_up
        self.retrieval_calls = 0

    def search(self, query: str, top_k: int = 10, kb_ids: Any = None, reader: Reader | None = None,
               doc_filter: Any = None) -> dict:
        """Dual-route debug search in the given knowledge bases (default: the default one); `doc_filter`: the
        documents both routes may return (pipeline/retrieval/doc_filter.py)."""
        self._validate_question(query, "query")
        flt = parse_filter(doc_filter)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 50:
            raise EngineError(CODE_VALIDATION, "top_k 必须是 1–50 的整数", "top_k")
        self.catch_up()
        scope = self.kbs.resolve(kb_ids, reader)
        self.lifecycle.require_ready()
        return self.c.retrieval.debug_search(query.strip(), top_k, self.settings.current, scope, flt)

    def retrieve(self, question: str, kb_ids: Any = None, reader: Reader | None = None,
                 doc_filter: Any = None) -> RetrievalResult:
        flt = parse_filter(doc_filter)
        self.catch_up()
        scope = self.kbs.resolve(kb_ids, reader)
        self.lifecycle.require_ready()
        self.retrieval_calls += 1
        return self.c.retrieval.retrieve(question, self.settings.current, scope, flt)

    @staticmethod
    def _validate_question(q: Any, field: str = "question") -> None:
        if not isinstance(q, str) or not q.strip():
            raise EngineError(CODE_VALIDATION, f"{field} 不能为空", field)
        if len(q) > MAX_QUESTION_CHARS:
            raise EngineError(CODE_VALIDATION, f"{field} 过长（最多 {MAX_QUESTION_CHARS} 字）", field)

    # ---- the answer stream; conversations, routing and query rewriting (pipeline/conversation/) ----
    def ask(self, question: str, retry: bool = False, conversation_id: str | None = None,
            user: str | None = None, use_kb: bool = True, kb_ids: Any = None,
            reader: Reader | None = None, history: Sequence[dict] | None = None,
            generation: Generation | None = None, actor: Actor | None = None,
            doc_filter: Any = None) -> Iterator[ev.Event]:
        """The one answer event stream (`_answer`), recorded in the audit log as asked by `actor` (default: `user`
        through no door, i.e. a script) whichever door consumes it. `doc_filter`: tags / metadata / upload dates
        the cited documents must match, applied inside both routes (pipeline/retrieval/doc_filter.py)."""
        searched: list[int] = []  # filled by _answer once it has resolved the scope (the log reads it at the end)
        asked = [int(k) for k in kb_ids if str(k).isdigit()] if isinstance(kb_ids, list | tuple) else None
        stream = self._answer(question, retry, conversation_id, user, use_kb, kb_ids, reader, history, generation,
                              searched, doc_filter)
        return self.audit.audited(stream, actor or Actor(user), searched, question if isinstance(question, str)
                                  else "", asked=asked)

    def _answer(self, question: str, retry: bool = False, conversation_id: str | None = None,
                user: str | None = None, use_kb: bool = True, kb_ids: Any = None,
                reader: Reader | None = None, history: Sequence[dict] | None = None,
                generation: Generation | None = None, searched: list[int] | None = None,
                doc_filter: Any = None) -> Iterator[ev.Event]:
        """The one answer event stream: stage → trace → stage → delta* → sources → done (or error).
        `kb_ids`: the knowledge bases to search (default: the default one); each must be readable by `reader`
        (4003 otherwise).

        `conversation_id` None starts a conversation (its id comes back in `done`); an unknown id is a 3002
        error, another user's a 4003. The router may answer DIRECT (chit-chat, or `use_kb=False`) without
        retrieval; follow-ups are rewritten before retrieval. The finished turn is stored before `done`.

        `history` instead of a conversation: the earlier turns as the client holds them ([{question, answer}],
        oldest first; the OpenAI-compatible API), rewritten against exactly like a stored conversation's; nothing
        is stored then (no conversation_id / turn_id in `done`). `generation`: temperature / max_tokens overrides.
        """
        t0 = time.perf_counter()
        c = self.c
        try:
            self._validate_question(question)
            flt = parse_filter(doc_filter)
            self.catch_up()
            scope = self.kbs.resolve(kb_ids, reader)
            if searched is not None:
                searched.extend(scope)
            self.lifecycle.require_ready()
            if history is not None and conversation_id is not None:
                raise EngineError(CODE_VALIDATION, "history 与 conversation_id 只能给一个", "history")
            conv = c.conversations.resolve(conversation_id, user) if conversation_id is not None else None
        except EngineError as exc:
            yield ev.error(exc.code, exc.msg)
            return
        question = question.strip()
        conv_id = conv["conv_id"] if conv else None
        stateless = history is not None
        history = (_client_history(history) if stateless else c.conversations.history(conv_id))
        gen = generation or Generation()
        route = c.router.route(question, use_kb=use_kb, has_history=bool(history),
                               rerank_available=c.models.cross_encoder is not None)
        recorder = TurnRecorder(c.conversations, conv_id, user, question)
        # a retry reuses the retrieval of the same scope and filter
        qkey = f"{question}\x00{','.join(map(str, scope))}" + (f"\x00{flt.to_dict()}" if flt else "")
        inner = (self._direct_answer(question, route, history, t0, gen) if route.route == DIRECT
                 else self._kb_answer(question, route, history, conv_id, retry, t0, scope, qkey, gen, flt))
        try:
            for e in inner:
                if stateless:  # nothing stored: done says the route itself
                    yield ev.Event(ev.EventType.DONE, {**e.data, "route": route.route}) if e.type is ev.EventType.DONE else e
                    continue
                if e.type is ev.EventType.DONE:
                    e = ev.Event(ev.EventType.DONE, recorder.finish(e.data, route.route))
                    if conv_id is None:  # 重试 in the conversation just made
                        self.recent.copy(("", qkey), (e.data["conversation_id"], qkey))
                recorder.see(e)
                yield e
        finally:
            inner.close()  # a consumer that hangs up closes the LLM stream now

    def _temperature(self, gen: Generation) -> float:
        return self.settings.current.llm_temperature if gen.temperature is None else gen.temperature

    def _direct_answer(self, question: str, route: Route, history: list[dict], t0: float,
                       gen: Generation) -> Iterator[ev.Event]:
        from pipeline.generation.llm_client import LLMError

        yield ev.route_trace(route.to_dict(), Rewrite(question, question, "none").to_dict())
        yield ev.stage("generate")
        try:
            mode = yield from direct_reply(question, route, history, self.c.models.llm, self._temperature(gen),
                                           max_tokens=gen.max_tokens)
        except LLMError as exc:
            yield ev.error(CODE_LLM, exc.msg)
            return
        yield ev.sources([])
        yield ev.done((time.perf_counter() - t0) * 1000, no_answer=False, mode=mode)

    def _recall(self, query: str, s: Settings, scope: list[int], flt: DocFilter | None,
                rw: Rewrite | None = None, history: Sequence[dict] = ()) -> RetrievalResult:
        """Retrieval and the gate on the question alone, then — only for a question the gate lets through — the
        LLM's multi-query and a retrieval with its phrasings. Privacy and cost: a question the gate refuses is
        answered with the fixed refusal and never reaches an LLM (README, the SRS's no-answer rule).
        A follow-up the gate refuses or finds only weak evidence for is searched again within the documents the
        last answer cited (`_within_cited`; a question that only may be a follow-up, naming no subject of its own,
        only when refused: Rewrite.searches_cited_after); its result replaces the first one only when it passes
        there."""
        res = self.c.retrieval.recall_stage(query, s, scope, flt)
        docs = (previous_docs(history) if rw is not None and s.follow_up_in_cited_docs
                and rw.searches_cited_after(res.hit, res.weak) else [])
        if docs:  # a follow-up after a refusal has no cited documents: nothing to search, nothing in the trace
            t0 = time.perf_counter()
            res = self._within_cited(rw, s, scope, flt, history, res, docs) or res
            res.ms.setdefault("within_cited_docs", (time.perf_counter() - t0) * 1000)  # tried, kept or not
        if res.hit and self.c.models.expander is not None and s.llm_multi_query:
            res = self._expanded(res, s, scope, flt)
        return res

    def _within_cited(self, rw: Rewrite, s: Settings, scope: list[int], flt: DocFilter | None,
                      history: Sequence[dict], first: RetrievalResult, docs: Sequence[int]) -> RetrievalResult | None:
        """A follow-up searched within the documents the last answer cited (`docs`): as rewritten, then (when the gate does
        not let that through) with the last turn's query in front of it; None (search everything, as for any
        question) unless the gate lets one through there and its sources hold at least one of the follow-up's own
        content words (when it has any). `first`: the search of the whole scope (weak: only strong evidence here
        replaces it; its query vector is reused for the same query).

        A follow-up asks about the document of the answer before far more often than not (「那组织的头目呢？」
        after a question on 《禁止传销条例》's fines), and alone, or rewritten by the rules, it shares too few words
        with anything for the gate. Within that document and with the last query's words, the article that
        answers it is found; the word check keeps a question the rules took for a follow-up but which is about
        something else (「拍照怎么构图好看」: no topic word the rules know) from being answered with the last
        document (docs/conversations.md)."""
        narrowed = replace(flt or DocFilter(), doc_ids=tuple(docs))
        own = content_terms(self.c.tokenizer(rw.original))
        res = None
        for query in dict.fromkeys((rw.query, f"{previous_query(history) or ''} {rw.query}".strip())):
            got = self.c.retrieval.recall_stage(query, s, scope, narrowed,
                                                query_embedding=first.query_embedding if query == first.query else None)
            texts = [normalize(n.node.get_content()) for n in got.fused[:s.final_top_k]]
            if got.hit and not (first.hit and got.weak) and (not own or any(w in t for w in own for t in texts)):
                res = got
                break
        if res is None:
            log.debug("follow-up not answered within the cited documents %s", docs)
            return None
        names = {n.node.metadata.get("doc_id"): n.node.metadata.get("doc_name") for n in res.fused}
        res.doc_filter = {**(res.doc_filter or {}), "doc_names": [names[d] for d in docs if names.get(d)]}
        return res

    def _expanded(self, first: RetrievalResult, s: Settings, scope: list[int],
                  flt: DocFilter | None) -> RetrievalResult:
        """The multi-query call, then retrieval with the question and its phrasings fused; the gate outcome stays
        `first`'s. A fall-back (timeout, failed call, unusable reply) keeps `first` as it is: no second retrieval
        would find anything the first did not."""
        exp = self.c.models.expander.expand(first.query, s.llm_multi_query_timeout)
        first.ms["multi_query"] = exp.ms  # the call's wall time, a fall-back's too (a timeout costs the question it)
        res = first if exp.fell_back else self.c.retrieval.expanded_stage(first, s, exp.searched, scope, flt)
        res.expansion = exp.to_dict()
        return res

    def _kb_answer(self, question: str, route: Route, history: list[dict], conv_id: str | None, retry: bool,
                   t0: float, scope: list[int], qkey: str, gen: Generation,
                   flt: DocFilter | None = None) -> Iterator[ev.Event]:
        from pipeline.generation.answer import stream_answer
        from pipeline.generation.llm_client import LLMError

        s, c = self.settings.current, self.c
        key = (conv_id or "", qkey)
        cached = self.recent.get(key) if retry else None
        if cached is None:
            self.retrieval_calls += 1
            try:
                yield ev.stage("recall")
                rw = c.models.rewriter.rewrite(question, history) if history else Rewrite(question, question, "none")
                res = self._recall(rw.query, s, scope, flt, rw, history)
                yield ev.stage("rerank")
                res = c.retrieval.rerank_stage(res, s)  # LIGHT has no reranker: the stage reports skipped
            except Exception as exc:
                log.exception("retrieval failed")
                yield ev.error(CODE_ENGINE, f"检索失败：{exc}")
                return
        else:
            rw, res = cached
        self.recent.put(key, (rw, res))
        query = rw.to_dict() | ({"expansion": res.expansion} if res.expansion else {})
        yield ev.trace(res, route=route.to_dict(), query=query)
        rewritten = rw.query if rw.changed else None
        if not res.hit:
            yield ev.delta(ev.NO_ANSWER_TEXT)
            yield ev.sources([])
            yield ev.done((time.perf_counter() - t0) * 1000, no_answer=True, rewritten_query=rewritten)
            return
        yield ev.stage("generate")
        llm = c.models.llm
        try:
            # an extractive answer is CPU work here (background work yields to it); an LLM's is a wait
            with c.questions.computing() if llm is None else nullcontext():
                result = yield from stream_answer(question, res.final, llm, self._temperature(gen),
                                                  history=history, retrieval_query=rw.query, picker=c.picker,
                                                  query_embedding=res.query_embedding, max_tokens=gen.max_tokens,
                                                  kb_ids=scope)
        except LLMError as exc:
            yield ev.error(CODE_LLM, exc.msg)
            return
        if result.insufficient:  # the LLM's 「资料不足」: the gate's refusal, said by the LLM
            yield (ev.replace(ev.NO_ANSWER_TEXT, ev.LLM_INSUFFICIENT_REASON) if result.shown
                   else ev.delta(ev.NO_ANSWER_TEXT))
            yield ev.sources([])
            yield ev.done((time.perf_counter() - t0) * 1000, no_answer=True, mode="llm", rewritten_query=rewritten,
                          refusal=ev.RefusalInfo(by="llm", reason=ev.LLM_INSUFFICIENT_REASON))
            return
        # LLM answers: is each [n] backed by source n? (extractive sentences are quotes of their source)
        support = c.support.check(result.text, res.final) if llm is not None and c.support else None
        yield ev.sources(ev.source_list(res, result.cited, support))
        # the reader's 「资料中未找到…」 is a refusal in every door (outcome "refuse"), its sources still the ones
        # it points at
        refusal = None if result.not_found is None else ev.RefusalInfo(by="extractive", reason=result.not_found)
        yield ev.done((time.perf_counter() - t0) * 1000, no_answer=refusal is not None,
                      mode="llm" if llm is not None else "extractive", rewritten_query=rewritten,
                      weak=(res.weak or result.weak) and refusal is None, support=support, refusal=refusal)

    def ask_sync(self, question: str, retry: bool = False, conversation_id: str | None = None,
                 user: str | None = None, use_kb: bool = True, kb_ids: Any = None,
                 reader: Reader | None = None, history: Sequence[dict] | None = None,
                 generation: Generation | None = None, actor: Actor | None = None, doc_filter: Any = None) -> dict:
        """The synchronous form over the same stream: {answer, sources, elapsed_ms, trace, weak, support,
        conversation_id, turn_id, route, rewritten_query, mode, no_answer} or EngineError."""
        parts: list[str] = []
        sources: list = []
        trace = None
        done: dict = {}
        with closing(self.ask(question, retry=retry, conversation_id=conversation_id, user=user, use_kb=use_kb,
                              kb_ids=kb_ids, reader=reader, history=history, generation=generation,
                              actor=actor, doc_filter=doc_filter)) as events:
            for e in events:
                if e.type is ev.EventType.DELTA:
                    parts.append(e.data["text"])
                elif e.type is ev.EventType.REPLACE:
                    parts = [e.data["text"]]
                elif e.type is ev.EventType.SOURCES:
                    sources = e.data["sources"]
                elif e.type is ev.EventType.TRACE:
                    trace = e.data
                elif e.type is ev.EventType.DONE:
                    done = e.data
                elif e.type is ev.EventType.ERROR:
                    raise EngineError(e.data["code"], e.data["msg"])
        trace = ev.trace_with_support(trace, done)  # 检索过程 counts unsupported citations
        return {"answer": "".join(parts), "sources": sources, "elapsed_ms": done.get("elapsed_ms"), "trace": trace,
                "weak": bool(done.get("weak")), "support": done.get("support"),
                **{k: done.get(k) for k in ("conversation_id", "turn_id", "route", "rewritten_query", "mode",
                                            "no_answer")}}


def _client_history(turns: Sequence[dict]) -> list[dict]:
    """A client's earlier turns in the shape the rewrite and the prompts read (the last HISTORY_TURNS, as a stored
    conversation's `recent_turns`): question, answer; nothing else is known of them."""
    out = []
    for t in list(turns)[-HISTORY_TURNS:]:
        out.append({"question": str(t.get("question") or ""), "answer": str(t.get("answer") or ""),
                    "rewritten": None, "route": None, "no_answer": 0})
    return out
