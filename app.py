"""Entry point: build one engine, the HTTP API and the Gradio UI, serve them in one process.

    python app.py [--host 127.0.0.1] [--port 7860] [--data-dir data] [--share] [--auth USER:PASS ...]
                  [--admin USER ...] [--kb-admin USER ...]
                  [--database-url postgresql://…] [--chroma-url http://host:port] [--files-dir DIR]
    python app.py --mcp-stdio [--data-dir data] …    (MCP over stdin/stdout for a desktop assistant; no web server)
    python app.py --role web|worker --chroma-url … [--database-url …]   (roles: docs/deploy.md#roles)

Without the last three everything lives in the data dir (SQLite, embedded Chroma, uploads/): no server needed.
With them several app processes can serve one knowledge base (docs/deploy.md).
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

from pipeline.models.offline import enable_offline

# Offline by construction: no analytics, no hub look-ups, no telemetry (set before the libraries import).
enable_offline()


def parse_args(argv=None):
    from pipeline.ops.deployment import ROLES  # here, not above: the libraries import after enable_offline()

    p = argparse.ArgumentParser(description="中文知识库问答")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1 only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--data-dir", default="data", help="folder for app.db, chroma/, uploads/ (default data)")
    p.add_argument("--share", action="store_true", help="ask Gradio for a public link (requires --auth)")
    p.add_argument("--auth", action="append", metavar="USER:PASS", help="enable logins (repeatable)")
    p.add_argument("--admin", action="append", metavar="USER", help="user allowed to use the 配置 tab")
    p.add_argument("--kb-admin", action="append", metavar="USER", help="user allowed to manage the knowledge base")
    p.add_argument("--database-url", default=None, metavar="URL",
                   help="PostgreSQL for metadata, settings and the ingest queue (default: env DATABASE_URL, "
                        "else SQLite in the data dir)")
    p.add_argument("--chroma-url", default=None, metavar="URL",
                   help="Chroma server http://host:port[/database] (default: env CHROMA_URL, else embedded)")
    p.add_argument("--files-dir", default=None, metavar="DIR",
                   help="uploaded originals, shared by all app processes (default: env KBQA_FILES_DIR, "
                        "else <data-dir>/uploads)")
    p.add_argument("--ingest-lease", type=float, default=None, metavar="SECONDS",
                   help="how long a dead process keeps an ingest job before another takes it over (default 60)")
    p.add_argument("--ingest-group", type=int, default=None, metavar="N",
                   help="documents one ingest claim takes (default: env KBQA_INGEST_GROUP, else 16); several "
                        "workers: a small N (1–4) spreads the end of a batch over all of them")
    p.add_argument("--role", choices=ROLES, default=None,
                   help="both (default: UI + API + ingest worker), web (UI + API; uploads wait for a worker) or "
                        "worker (claims ingest jobs from the database queue; no UI, no port). Split roles need a "
                        "Chroma server (default: env KBQA_ROLE, else both)")
    p.add_argument("--mcp-stdio", action="store_true",
                   help="serve the knowledge base as an MCP server over stdin/stdout (desktop assistants) "
                        "instead of the web app; the caller is the local user")
    return p.parse_args(argv)


def build_app(engine, policy, bind_host: str = "127.0.0.1"):
    """FastAPI app with the REST API (and MCP at /mcp) and the Gradio Blocks mounted at /."""
    import gradio as gr

    from api.server import create_api
    from ui import build_ui, page_kwargs
    from ui.login import AUTH_MESSAGE, gradio_auth

    api = create_api(engine, policy, bind_host)
    blocks = build_ui(engine, policy)
    # Gradio 6: theme/css/head (the citation click script) are mount/launch arguments, not Blocks() ones.
    return gr.mount_gradio_app(api, blocks, path="/", auth=gradio_auth(policy, engine.login_throttle),
                               auth_message=AUTH_MESSAGE if policy.enabled else None,
                               max_file_size="20mb",  # the browser refuses bigger files before upload
                               **page_kwargs()), blocks



# On stop, open streams (an answer being written, the page's event stream, which Gradio keeps open with heartbeats)
# get this long to finish before uvicorn cancels them; without a bound, one open browser tab held the stop forever.
SHUTDOWN_GRACE_S = 5.0


def server_config(app, host: str, port: int, grace_s: float = SHUTDOWN_GRACE_S):
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace_s)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pipeline.access.policy import AccessPolicy
    from pipeline.components import DataDirBusy
    from pipeline.engine import Engine
    from pipeline.ops.deployment import Deployment

    try:
        policy = AccessPolicy.from_args(args.auth, args.admin, args.kb_admin)
        deployment = Deployment.from_sources(args.database_url, args.chroma_url, args.files_dir, args.ingest_lease,
                                             role=args.role, ingest_group=args.ingest_group)
    except ValueError as exc:
        print(f"参数错误：{exc}", file=sys.stderr)
        return 2
    if args.share and not policy.enabled:
        print("拒绝创建公网分享链接：未设置登录（--auth USER:PASS）时公开知识库会造成泄露。", file=sys.stderr)
        return 2

    if args.mcp_stdio:
        return serve_mcp_stdio(args.data_dir, deployment)
    if deployment.role == "worker":
        return run_worker(args.data_dir, deployment)
    try:
        engine = Engine(args.data_dir, load_async=True, deployment=deployment)
    except (ConnectionError, DataDirBusy) as exc:  # a server is unreachable / the dir is taken: say so, no traceback
        print(f"启动失败：{exc}", file=sys.stderr)
        return 2
    app, blocks = build_app(engine, policy, args.host)

    import uvicorn

    from ui.share import open_share_tunnel

    server = uvicorn.Server(server_config(app, args.host, args.port))
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{shown_host}:{args.port}/"

    def announce():  # print the address only once the socket really accepts connections
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if not server.started:
            return
        print(f"* 本地地址: {url}  (API 文档: {url}docs)", flush=True)
        if args.share:
            open_share_tunnel(blocks, args.host, args.port)

    threading.Thread(target=announce, name="announce", daemon=True).start()
    server.run()
    engine.close()
    return 0


def run_worker(data_dir: str, deployment, catch_up_s: float = 1.0) -> int:
    """`--role worker`: the ingest worker alone — no UI, no HTTP port. It claims jobs from the database queue
    until SIGTERM / SIGINT, and follows what the web processes change (settings, 重载引擎) by checking the shared
    counters every `catch_up_s` (nothing else would: no request ever reaches this process)."""
    import signal

    from pipeline.components import DataDirBusy
    from pipeline.engine import Engine
    from pipeline.errors import EngineError

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        engine = Engine(data_dir, deployment=deployment)
    except (ConnectionError, DataDirBusy, EngineError) as exc:  # unreachable server, dir taken, load failed
        print(f"启动失败：{exc}", file=sys.stderr)
        return 2
    ingest = engine.components.ingest
    print(f"* 入库进程已启动（--role worker，{ingest.owner}）：从数据库队列领取入库任务，无界面、无端口", flush=True)
    try:
        while not stop.wait(catch_up_s):
            engine.services.sync.catch_up()
    finally:
        engine.close()  # the job in hand keeps its lease until it runs out; another worker then takes it over
    print("* 入库进程已停止", flush=True)
    return 0


def serve_mcp_stdio(data_dir: str, deployment) -> int:
    """MCP over stdin/stdout: the protocol owns stdout, so everything the libraries print goes to stderr."""
    import contextlib

    from api.mcp_server import run_stdio
    from pipeline.access.callers import OPEN
    from pipeline.engine import Engine

    try:
        with contextlib.redirect_stdout(sys.stderr):
            engine = Engine(data_dir, deployment=deployment)
    except ConnectionError as exc:
        print(f"启动失败：{exc}", file=sys.stderr)
        return 2
    try:
        run_stdio(engine, OPEN)  # whoever started the process: the local tool's caller
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
