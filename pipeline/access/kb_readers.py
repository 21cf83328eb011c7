"""Per-KB read permission: which knowledge bases a reader (pipeline.access.Reader) may read, the one 4003
refusal, and what of a stored conversation a reader may see again.

A knowledge base's `readers` (store.knowledge_bases) is None = open to every logged-in user (the default, and
what every knowledge base of an older install is), or the list of users who may read it; KB admins and admins
read every one. The engine calls these wherever a knowledge base is read: the KB list, scope resolution of
questions / search, documents (list, chunks, text, file, page image, versions) and conversation replay.
"""
from __future__ import annotations

from typing import Any

from pipeline.access.policy import EVERYONE, Reader
from pipeline.errors import CODE_FORBIDDEN, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.retrieval.kb_indexes import KnowledgeBases
from store.migrations import DEFAULT_KB_ID

RESTRICTED_TEXT = "（无权查看：该来源所在的知识库只对指定用户开放）"


DENIED_KB_TEXT = "无权访问该知识库：它只对指定用户开放，请联系知识库管理员"


def denied(name: str | None = None) -> EngineError:
    """The one refusal. It never names the knowledge base: ids could be enumerated into names (issue 27)."""
    return EngineError(CODE_FORBIDDEN, DENIED_KB_TEXT, "kb_id")


def widens(source: dict, target: dict) -> bool:
    """Whether copying text of knowledge base `source` into `target` shows it to someone who may not read
    `source`: target open to all while source is restricted, or a target reader missing from source's list."""
    src, dst = source.get("readers"), target.get("readers")
    if src is None:
        return False
    return dst is None or not set(dst) <= set(src)


class KBAccess:
    def __init__(self, kbs: KnowledgeBases):
        self.kbs = kbs

    def readable(self, reader: Reader | None) -> list[dict]:
        """The knowledge base rows the reader may read (with counts), in kb_id order."""
        reader = reader or EVERYONE
        return [kb for kb in self.kbs.store.list() if reader.may_read(kb)]

    def check(self, kb_id: Any, reader: Reader | None) -> int:
        """kb_id checked to exist (3002) and to be readable (4003)."""
        kb_id = self.kbs.check(kb_id, fresh=True)  # deleted by another process: 3002 here too
        reader = reader or EVERYONE
        if not reader.unrestricted:
            kb = self.kbs.store.get(kb_id)
            if kb is not None and reader.kb_ids is not None and kb_id not in reader.kb_ids:
                raise denied()
            if kb is not None and not reader.may_read(kb):
                raise denied()
        return kb_id

    def document(self, doc_id: Any, reader: Reader | None, field: str | None = "doc_id") -> dict:
        """The document row (3002 when missing) if the reader may read its knowledge base (else 4003)."""
        d = self.kbs.docs.get(doc_id)
        if d is None:
            raise EngineError(CODE_NO_DOC, f"文档不存在：{doc_id}", field)
        self.check(d.get("kb_id") or DEFAULT_KB_ID, reader)
        return d

    def scope(self, kb_ids: Any, reader: Reader | None) -> list[int]:
        """The knowledge bases a question searches. Given ids: each must be readable (4003 names the first that
        is not). None: the default knowledge base (SRS §7 clients), or — when the reader may not read it — every
        knowledge base the reader may read."""
        if kb_ids is None or kb_ids == []:
            try:
                return [self.check(DEFAULT_KB_ID, reader)]
            except EngineError:
                ids = [kb["kb_id"] for kb in self.readable(reader)]
                if not ids:
                    raise EngineError(CODE_FORBIDDEN, "没有可以访问的知识库：请联系知识库管理员开通", "kb_id") from None
                return ids
        if isinstance(kb_ids, (int, str)):
            kb_ids = [kb_ids]
        return sorted({self.check(k, reader) for k in kb_ids})

    def readable_ids(self, reader: Reader | None) -> set[int] | None:
        """The ids the reader may read; None = all (a privileged reader, or no logins)."""
        reader = reader or EVERYONE
        return None if reader.privileged else {kb["kb_id"] for kb in self.readable(reader)}

    def redact_progress(self, st: dict, reader: Reader | None) -> dict:
        """Rebuild / ingest progress as a reader may see it: the current file's name and stage only when its
        knowledge base is readable to them (counts of a one-KB rebuild likewise)."""
        ids = self.readable_ids(reader)
        if ids is None:
            return st
        st = dict(st)
        if st.get("current") and st.get("current_kb_id") not in ids:
            st["current"] = ""
            st.pop("current_stage", None)
        if st.get("kb_id") is not None and st["kb_id"] not in ids:
            st.update(done=None, total=None, eta_s=None)
        return st

    def place_copy(self, source_kb_ids: set[int], target: int | None) -> int:
        """Where content drawn from `source_kb_ids` may be stored (a verified Q&A entry): `target` if given,
        else the one knowledge base the sources share (the default one when there are none). Refused (4003)
        when the target's readers include someone who may not read one of the sources."""
        if target is None:
            if len(source_kb_ids) > 1:
                raise EngineError(CODE_VALIDATION, "来源分属多个知识库：请指定要保存到的知识库（kb_id）", "kb_id")
            target = next(iter(source_kb_ids), DEFAULT_KB_ID)
        target = self.kbs.check(target, fresh=True)
        dst = self.kbs.store.get(target)
        for sid in sorted(source_kb_ids):
            src = self.kbs.store.get(sid)
            if src is not None and widens(src, dst):
                raise EngineError(CODE_FORBIDDEN, f"不能保存到「{dst['name']}」：来源所在的知识库只对部分用户开放，"
                                                  "保存后会被无权查看来源的用户检索到；请保存到来源所在的知识库",
                                  "kb_id")
        return target

    def redact_conversation(self, conv: dict, reader: Reader | None) -> dict:
        """A replayed conversation: sources from knowledge bases the reader may no longer read lose their text
        (marked `restricted`), and such a turn's retrieval trace is dropped (it quotes the same chunks)."""
        reader = reader or EVERYONE
        if reader.unrestricted:
            return conv
        closed = {kb["kb_id"] for kb in self.kbs.store.list() if not reader.may_read(kb)}
        if not closed:
            return conv
        turns = []
        for t in conv.get("turns") or []:
            sources = t.get("sources") or []
            if any((s.get("kb_id") or DEFAULT_KB_ID) in closed for s in sources):  # no kb_id: before KBs existed
                sources = [({**s, "text": RESTRICTED_TEXT, "context": None, "restricted": True}
                            if (s.get("kb_id") or DEFAULT_KB_ID) in closed else s) for s in sources]
                t = {**t, "sources": sources, "trace": None}
            turns.append(t)
        return {**conv, "turns": turns}
