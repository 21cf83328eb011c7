"""The engine facade: the one object ui/ and api/ are handed.

app.py builds exactly one Engine; tests build their own on a temp data dir. It holds no logic: the services
(pipeline/services/, built and wired in pipeline.components.build_services) do the work, and each public method
here *is* the service's method (`Engine.upload` → `DocumentService.upload`, same signature and docstring).
Callers may also use the services directly: `engine.documents`, `engine.answers`, `engine.kbs`, …
Nothing here imports gradio or fastapi.
"""
from __future__ import annotations

import threading
from pathlib import Path

from pipeline.components import build_services
from pipeline.errors import EngineError
from pipeline.ops.deployment import Deployment
from pipeline.settings import Settings

__all__ = ["Engine", "EngineError"]


class _To:
    """`name = _To("documents", "upload")` on Engine: engine.name is engine.documents.upload."""

    def __init__(self, service: str, method: str | None = None):
        self.service, self.method = service, method

    def __set_name__(self, owner, name: str) -> None:
        self.method = self.method or name

    def __get__(self, engine, owner=None):
        return self if engine is None else getattr(getattr(engine, self.service), self.method)


class Engine:
    def __init__(self, data_dir: Path | str = "data", project_root: Path | None = None,
                 models_dir: Path | None = None, load_async: bool = False, deployment: Deployment | None = None,
                 calibration_dir: Path | None = None):
        self.services = s = build_services(data_dir, project_root=project_root, models_dir=models_dir,
                                           deployment=deployment, calibration_dir=calibration_dir)
        self.components = s.components
        self.settings_service, self.lifecycle, self.kbs = s.settings, s.lifecycle, s.kbs
        self.documents, self.answers, self.conversations, self.ops = s.documents, s.answers, s.conversations, s.ops
        self.audit_log_service = s.audit  # (engine.audit is the consistency audit of the stores)
        self.api_keys, self.rate_limits, self.login_throttle = s.api_keys, s.rate_limits, s.login_throttle
        self.chunks, self.chunking, self.doc_tags = s.chunks, s.chunking, s.doc_tags
        self.web_sources, self.folder_sync = s.sources.web, s.sources.folders
        self.data_dir = s.components.data_dir
        if load_async:
            threading.Thread(target=s.lifecycle.load_guarded, name="engine-load", daemon=True).start()
        else:
            s.lifecycle.load()

    # ---- state that lives in the services
    @property
    def settings(self) -> Settings:
        """The current settings, after catching up with what other processes saved."""
        self.services.sync.catch_up()
        return self.settings_service.current

    @property
    def state(self) -> str:
        return self.lifecycle.state

    @state.setter
    def state(self, value: str) -> None:  # what a reload looks like to a client (tests set it)
        self.lifecycle.state = value

    last_reload_ms = property(lambda self: self.lifecycle.last_reload_ms)
    model_warning = property(lambda self: self.lifecycle.model_warning)
    retrieval_calls = property(lambda self: self.answers.retrieval_calls)

    # ---- settings and lifecycle
    default_settings = _To("settings_service")
    update_settings = _To("settings_service", "update")
    check_settings = _To("settings_service", "check")
    test_llm = _To("settings_service")
    load = _To("lifecycle")
    reload = _To("lifecycle")
    health = _To("kbs", "health")  # per-reader view over Lifecycle.health
    public_health = _To("kbs")

    # ---- knowledge bases
    list_kbs = _To("kbs", "list")
    get_kb = _To("kbs", "get")
    create_kb = _To("kbs", "create")
    update_kb = _To("kbs", "update")
    delete_kb = _To("kbs", "delete")
    kb_chunking = _To("chunking", "get")
    update_kb_chunking = _To("chunking", "update")
    preview_upload = _To("chunking", "preview")

    # ---- documents, versions, viewer, rebuild
    upload = _To("documents")
    wait_idle = _To("documents")
    list_documents = _To("documents", "list")
    get_document = _To("documents", "get")
    document_chunks = _To("documents", "chunks")
    delete_document = _To("documents", "delete")
    document_versions = _To("documents", "versions")
    restore_version = _To("documents")
    document_text = _To("documents", "text")
    page_image = _To("documents")
    chunk_document = _To("documents")
    document_file = _To("documents", "file")
    source_states = _To("documents")
    document_tags = _To("doc_tags", "get")  # tags / metadata (pipeline/services/doc_tags.py)
    set_document_tags = _To("doc_tags", "set")
    list_tags = _To("doc_tags", "tags")
    start_rebuild = _To("documents")
    rebuild_status = _To("documents")
    rebuild = _To("documents")
    wait_rebuild = _To("documents")

    # ---- chunks as first-class objects (pipeline.services.chunks)
    list_chunks = _To("chunks", "list")
    get_chunk = _To("chunks", "get")
    edit_chunk = _To("chunks", "edit")
    restore_chunk = _To("chunks", "restore")
    set_chunk_enabled = _To("chunks", "set_enabled")
    add_chunk = _To("chunks", "add")
    reparse_document = _To("chunks", "reparse")

    # ---- answers
    search = _To("answers")
    retrieve = _To("answers")
    ask = _To("answers")
    ask_sync = _To("answers")

    # ---- conversations, feedback, verified Q&A
    list_conversations = _To("conversations")
    get_conversation = _To("conversations")
    rename_conversation = _To("conversations")
    delete_conversation = _To("conversations")
    clear_conversations = _To("conversations")
    export_conversation = _To("conversations")
    give_feedback = _To("conversations")
    list_feedback = _To("conversations")
    get_feedback = _To("conversations")
    export_feedback = _To("conversations")
    create_verified = _To("conversations")
    list_verified = _To("conversations")
    delete_verified = _To("conversations")

    # ---- the audit log (admins)
    audit_log = _To("audit_log_service", "list")
    export_audit_log = _To("audit_log_service", "export")
    # ---- API keys
    create_api_key = _To("api_keys", "create")
    list_api_keys = _To("api_keys", "list")
    revoke_api_key = _To("api_keys", "revoke")

    # ---- web pages and the folder a knowledge base follows
    list_web_sources = _To("web_sources", "list")
    add_web_source = _To("web_sources", "add")
    refetch_web_source = _To("web_sources", "refetch")
    set_web_source_interval = _To("web_sources", "set_interval")
    remove_web_source = _To("web_sources", "remove")
    folder_source = _To("folder_sync", "get")
    set_folder_source = _To("folder_sync", "set_folder")
    remove_folder_source = _To("folder_sync", "remove")
    sync_folder = _To("folder_sync", "sync")

    # ---- operations
    audit = _To("ops")
    repair = _To("ops")
    backup = _To("ops")

    def close(self) -> None:
        self.services.close()
