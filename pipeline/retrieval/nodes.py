"""Chunk rows ↔ LlamaIndex nodes, shared by both routes, the answer builders and the event payloads.

A node's id is the chunk_id (as a string); its metadata holds doc_id, doc_name, chunk_index, page, source
("text" | "ocr"), context (heading path / sheet name, or None), kb_id / kb_name, version and verified (a verified
Q&A entry), all excluded from embedding and LLM text (they are shown, not scored).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.schema import MetadataMode, TextNode

from store.migrations import DEFAULT_KB_ID

# chunk_ids → {chunk_id: row dict} (store.documents.DocumentStore.get_chunks)
ChunkLookup = Callable[[list[int]], dict[int, dict]]


def retrievable(row: dict | None) -> bool:
    """A chunk row both routes may return: its document is 就绪 and the active version (store.documents), and a
    KB admin has not switched the chunk off (read per question: every process sees a disable at once)."""
    return (row is not None and row.get("status") == "ready" and row.get("active", 1) == 1
            and row.get("enabled", 1) == 1)


def node_from_row(row: dict) -> TextNode:
    meta = {"doc_id": row["doc_id"], "doc_name": row["file_name"], "chunk_index": row["chunk_index"],
            "page": row.get("page"), "source": row.get("source") or "text", "context": row.get("context"),
            "kb_id": row.get("kb_id"), "kb_name": row.get("kb_name"), "version": row.get("version"),
            "verified": row.get("file_type") == "qa"}  # a verified Q&A entry (pipeline.conversation.verified)
    return TextNode(id_=str(row["chunk_id"]), text=row["text"], metadata=meta,
                    excluded_embed_metadata_keys=list(meta), excluded_llm_metadata_keys=list(meta))


def node_text(nws: Any) -> str:
    """The chunk text of a node or NodeWithScore."""
    node = getattr(nws, "node", nws)
    try:
        return node.get_content()
    except TypeError:  # some node types want a metadata_mode argument
        return node.get_content(metadata_mode=MetadataMode.NONE)


def node_meta(nws: Any) -> dict:
    node = getattr(nws, "node", nws)
    return dict(getattr(node, "metadata", None) or {})


def kb_id_of(nws: Any) -> int:
    """The knowledge base a node comes from (a node without a kb_id is the default one's)."""
    return node_meta(nws).get("kb_id") or DEFAULT_KB_ID


def kb_ids_of(nodes: Any) -> list[int]:
    """The knowledge bases the nodes come from, sorted."""
    return sorted({kb_id_of(n) for n in nodes})


def page_of(meta: dict) -> Any:
    for key in ("page", "page_label", "page_number"):
        v = meta.get(key)
        if v not in (None, ""):
            return v
    return None
