"""The operator's health endpoint: liveness at the URL given (`/healthz`) and readiness beside it (`/readyz`).

kopf's own liveness server answers one path only, so the operator serves both itself, on the same event loop
(aiohttp, which kopf already runs on): a loop that stops answering fails the liveness probe either way.
Liveness reports the work queue (depth, reconciles done, keys a standby dropped); readiness answers 200 or
503 with the replica's leadership in the body. A standby is ready as long as it knows who leads: made
unready, it would count against a PodDisruptionBudget and block node drains while doing exactly its job.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)
Json = dict[str, Any]
READINESS_PATH = "/readyz"


async def serve(url: str, live: Callable[[], Json], ready: Callable[[], tuple[bool, Json]]) -> web.AppRunner:
    """Start serving at `url` (http://HOST:PORT/PATH: liveness at PATH, readiness at /readyz); the caller
    stops it with `await runner.cleanup()`."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.port is None:
        raise ValueError(f"the health endpoint must be http://HOST:PORT/PATH, got {url!r}")

    async def liveness(_: web.Request) -> web.Response:
        return web.json_response(live())

    async def readiness(_: web.Request) -> web.Response:
        ok, body = ready()
        return web.json_response({"ready": ok, **body}, status=200 if ok else 503)

    app = web.Application()
    app.add_routes([web.get(parts.path or "/healthz", liveness), web.get(READINESS_PATH, readiness)])
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname or "localhost", parts.port).start()
    log.debug("serving liveness at %s and readiness at %s", parts.path, READINESS_PATH)
    return runner
