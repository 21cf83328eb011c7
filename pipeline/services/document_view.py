"""The document viewer's data: a document's parsed text in parts, with where each chunk sits in it.

The text is what ingestion parsed (kb_section: one section per PDF page / sheet / whole text file), so offsets
of chunks (char_start/char_end, relative to their section) point into it exactly. A document ingested before
sections were kept (a migrated data dir) gets its text rebuilt from its chunks: overlapping chunks agree on the
overlap, the whitespace trimmed between them becomes a line break — close to the original and marked as such.
Long sections are cut into parts of at most PART_CHARS characters at line ends, so a page of the API is small.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.generation.instructions import flagged_sentences
from store.documents import DocumentStore

PART_CHARS = 20_000


@dataclass(frozen=True)
class Part:
    section: int  # index into the sections
    start: int  # offsets in the section's text
    end: int


def rebuild_sections(chunks: list[dict]) -> list[dict]:
    """Sections from chunks alone (one per page), for documents ingested before kb_section existed."""
    by_page: dict = {}
    for ch in chunks:
        by_page.setdefault((ch.get("section") or 0, ch.get("page")), []).append(ch)
    out = []
    for i, ((_, page), group) in enumerate(sorted(by_page.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))):
        size = max(int(ch.get("char_end") or 0) for ch in group)
        buf = ["\n"] * size
        for ch in group:
            s, e = int(ch.get("char_start") or 0), int(ch.get("char_end") or 0)
            text = ch["text"]
            if e - s == len(text):  # a table chunk repeats its header: its text is not its span
                buf[s:e] = list(text)
        out.append({"section": i, "page": page, "source": group[0].get("source") or "text",
                    "context": None, "text": "".join(buf)})
        for ch in group:
            ch["section"] = i
    return out


def split_parts(sections: list[dict], limit: int = PART_CHARS) -> list[Part]:
    parts = []
    for k, sec in enumerate(sections):
        text = sec["text"]
        start = 0
        while True:
            if len(text) - start <= limit:
                parts.append(Part(k, start, len(text)))
                break
            cut = text.rfind("\n", start + limit // 2, start + limit)
            end = cut + 1 if cut != -1 else start + limit
            parts.append(Part(k, start, end))
            start = end
    return parts or [Part(0, 0, 0)]


def document_view(docs: DocumentStore, doc: dict, kb_name: str | None, part: int | None = None,
                  chunk_id: int | None = None) -> dict:
    """One part of the document's text with the spans of its chunks (part from 1; or the part holding
    `chunk_id`, which is then the `highlight`)."""
    doc_id = doc["doc_id"]
    chunks = docs.chunks_of(doc_id)
    sections = docs.sections_of(doc_id)
    rebuilt = not sections and bool(chunks)
    if rebuilt:
        sections = rebuild_sections(chunks)
    parts = split_parts(sections)
    highlight = None
    if chunk_id is not None:
        target = next((c for c in chunks if c["chunk_id"] == int(chunk_id)), None)
        if target is None:
            raise EngineError(CODE_NO_DOC, f"块 {chunk_id} 不属于文档 {doc_id}", "chunk_id")
        sec, pos = int(target.get("section") or 0), int(target.get("char_start") or 0)
        mine = [i for i, p in enumerate(parts, 1) if p.section == sec]
        part = next((i for i in mine if parts[i - 1].start <= pos < parts[i - 1].end), mine[-1] if mine else 1)
        highlight = target["chunk_id"]
    part = 1 if part is None else int(part)
    if not 1 <= part <= len(parts):
        raise EngineError(CODE_VALIDATION, f"part 必须在 1–{len(parts)} 之间", "part")
    p = parts[part - 1]
    sec = sections[p.section] if sections else {"page": None, "source": "text", "context": None, "text": ""}
    spans = []
    for c in chunks:
        if int(c.get("section") or 0) != p.section:
            continue
        s, e = int(c.get("char_start") or 0), int(c.get("char_end") or 0)
        if e <= p.start or s >= p.end:
            continue
        spans.append({"chunk_id": c["chunk_id"], "chunk_index": c["chunk_index"], "start": max(s, p.start) - p.start,
                      "end": min(e, p.end) - p.start, "context": c.get("context")})
    return {
        "doc_id": doc_id, "file_name": doc["file_name"], "file_type": doc["file_type"], "kb_id": doc.get("kb_id"),
        "kb_name": kb_name, "version": doc.get("version"), "active": doc.get("active"), "status": doc["status"],
        "part": part, "parts": len(parts), "section": p.section, "sections": len(sections),
        "page": sec.get("page"), "source": sec.get("source") or "text", "context": sec.get("context"),
        "offset": p.start, "text": sec["text"][p.start:p.end], "chunks": spans, "highlight": highlight,
        "rebuilt_from_chunks": rebuilt,
        # the instruction-like sentences of the whole document (its note counts them at ingest)
        "instruction_flags": [f for c in chunks for f in flagged_sentences(c.get("text") or "")][:50],
    }
