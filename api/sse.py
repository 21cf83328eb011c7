"""An answer event generator served as Server-Sent Events: one pull loop for /api/qa/ask and /v1/chat/completions."""
from __future__ import annotations

import threading

from fastapi import Request
from starlette.concurrency import run_in_threadpool


def sse_frames(gen, request: Request, frame):
    """An answer event generator as an async stream of SSE frames (`frame(event)` → text or None): pulled in a
    worker thread, stopped when the client disconnects."""
    sentinel = object()
    pulling = threading.Lock()  # a generator may not be closed while a `next` on it runs in another thread

    def pull():
        with pulling:
            return next(gen, sentinel)

    def close():
        with pulling:  # after the `next` in flight returns
            gen.close()  # GeneratorExit reaches the LLM stream and closes it

    async def stream():
        try:
            while True:
                if await request.is_disconnected():
                    break
                event = await run_in_threadpool(pull)
                if event is sentinel:
                    break
                text = frame(event)
                if text:
                    yield text
        finally:
            # A client that hangs up cancels this task, and an await here would be cancelled with it (the
            # generator, and so the LLM stream, would never be closed): close it from a thread of its own.
            threading.Thread(target=close, name="sse-close", daemon=True).start()

    return stream()

