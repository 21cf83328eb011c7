"""Chunking per knowledge base: each KB may set its own chunk size / overlap / structure mode; the global settings
(pipeline/settings.py, group "chunking") are the default for every field a KB does not set.

The fields are not declared again here: a KB's values are validated by building a `Settings` with them on top of
the global ones, so the bounds, the overlap < size rule and the Chinese messages are those of the settings tab.
The overrides live in `sys_config` under `kb_chunking:<kb_id>` (JSON {field: value}, only the fields the KB sets):
no migration, every app process reads the same row when it ingests, and a backup carries it with the settings.
`chunk_document` is the one chunking step of ingest and of the upload preview (so a preview shows exactly the
chunks the ingest will store).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.ingestion.parsing import ParsedPage
from pipeline.ingestion.structured_chunking import Piece, chunk_page
from pipeline.settings import GROUPS, Settings, SettingsError, validate_settings
from store.config_store import ConfigStore

log = logging.getLogger(__name__)

FIELDS: tuple[str, ...] = tuple(GROUPS["chunking"])  # chunk_size, chunk_overlap, chunk_structure


def key_of(kb_id: int) -> str:
    return f"kb_chunking:{int(kb_id)}"


@dataclass(frozen=True)
class Chunking:
    chunk_size: int
    chunk_overlap: int
    chunk_structure: bool = True

    @classmethod
    def of(cls, s: Settings) -> Chunking:
        return cls(**{f: getattr(s, f) for f in FIELDS})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def merged(s: Settings, overrides: dict[str, Any]) -> Chunking:
    """The global chunking of `s` with `overrides` on top (None = follow the global value); SettingsError naming
    the field when a value is out of its bounds or the overlap is not below the size."""
    unknown = [k for k in overrides if k not in FIELDS]
    if unknown:
        raise SettingsError({k: f"未知切块参数 {k}（可用：{'、'.join(FIELDS)}）" for k in unknown})
    values = {k: v for k, v in overrides.items() if v is not None}
    return Chunking.of(validate_settings({**s.model_dump(), **values}))


def chunk_document(pages: list[ParsedPage], ck: Chunking, qa: bool = False,
                   ) -> tuple[list[ParsedPage], list[tuple[int, ParsedPage, Piece]]]:
    """(pages, [(section index, page, piece)]) of a parsed document. A verified Q&A entry (`qa`) is one chunk."""
    if qa:
        page = ParsedPage("\n".join(p.text for p in pages).strip(), None)
        return [page], [(0, page, Piece(page.text, 0, len(page.text)))]
    return pages, [(k, page, pc) for k, page in enumerate(pages)
                   for pc in chunk_page(page, ck.chunk_size, ck.chunk_overlap, ck.chunk_structure)]


class KBChunking:
    """The stored overrides of each knowledge base and the chunking they give under the current settings."""

    def __init__(self, config: ConfigStore, settings: Callable[[], Settings]):
        self.config = config
        self.settings = settings

    def overrides(self, kb_id: int) -> dict[str, Any]:
        stored = self.config.get(key_of(kb_id)) or {}
        return {k: v for k, v in stored.items() if k in FIELDS and v is not None} if isinstance(stored, dict) else {}

    def effective(self, kb_id: int, s: Settings | None = None) -> Chunking:
        s = s or self.settings()
        ov = self.overrides(kb_id)
        try:
            return merged(s, ov)
        except SettingsError as exc:
            # Valid when saved, but the global values moved since (e.g. a global overlap now above this KB's
            # size): keep the KB's size, and an overlap that fits under it.
            log.warning("chunking of knowledge base %s no longer valid (%s): overlap clamped", kb_id, exc)
            base = Chunking.of(s)
            size = int(ov.get("chunk_size", base.chunk_size))
            overlap = min(int(ov.get("chunk_overlap", base.chunk_overlap)), size - 1)
            return Chunking(size, overlap, bool(ov.get("chunk_structure", base.chunk_structure)))

    def save(self, kb_id: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """Store the fields the KB sets (validated by the caller through `merged`); none left = follow the global."""
        ov = {k: overrides[k] for k in FIELDS if overrides.get(k) is not None}
        if ov:
            self.config.save({key_of(kb_id): ov})
        else:
            self.config.delete(key_of(kb_id))
        return ov

    def forget(self, kb_id: int) -> None:
        self.config.delete(key_of(kb_id))
