"""Who may read /metrics when it is served securely: a caller whose bearer token the API server vouches for
(a TokenReview) and whose user may `get` the non-resource URL /metrics (a SubjectAccessReview), as the API
server decides for its own /metrics. /metrics names every namespace's jobs and their progress, so a
Prometheus needs a ClusterRole granting that URL (the chart's `<release>-metrics-reader`).

A verdict is remembered for a minute per token and path (under the token's hash, never the token), so a
scrape every 15 s costs the API server at most two reviews a minute per scraper; the memory holds at most
MAX_REMEMBERED verdicts, whatever tokens are sprayed at it. A review that could not be made (the API server
away) is answered 503 and not remembered. The reviews themselves are the caller's
(dtjob.kube.access_reviews.AccessReviews): this module only decides, so it is tested without a cluster.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from dtjob.kube.access_reviews import Identity
from dtjob.runtime.ttl_cache import TtlCache

REMEMBER_SECONDS = 60.0
MAX_REMEMBERED = 1024
METRICS_PATH = "/metrics"


class Verdict(Enum):
    ALLOWED = (200, "OK")
    UNAUTHENTICATED = (401, "Unauthorized")
    FORBIDDEN = (403, "Forbidden")
    UNAVAILABLE = (503, "Service Unavailable")

    @property
    def status_line(self) -> str:
        code, text = self.value
        return f"{code} {text}"


# A token -> its identity, or None when the API server does not accept it; raises when it cannot be asked.
Authenticate = Callable[[str], Identity | None]
# (identity, verb, path) -> may it; raises when it cannot be asked.
Authorize = Callable[[Identity, str, str], bool]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class MetricsGuard:
    def __init__(
        self,
        authenticate: Authenticate,
        authorize: Authorize,
        remember_s: float = REMEMBER_SECONDS,
        max_remembered: int = MAX_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._authenticate = authenticate
        self._authorize = authorize
        self._verdicts: TtlCache[tuple[str, str], Verdict] = TtlCache(remember_s, clock, max_remembered)

    def verdict(self, authorization: str | None, path: str) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict.UNAUTHENTICATED
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        remembered = self._verdicts.get(key)
        if remembered is not None:
            return remembered
        try:
            who = self._authenticate(token)
            found = Verdict.UNAUTHENTICATED if who is None else self._allowed(who, path)
        except Exception:  # the API server could not be asked: say so, and ask again next time
            return Verdict.UNAVAILABLE
        self._verdicts.put(key, found)
        return found

    def _allowed(self, who: Identity, path: str) -> Verdict:
        return Verdict.ALLOWED if self._authorize(who, "get", path) else Verdict.FORBIDDEN

    def remembered(self) -> int:
        return len(self._verdicts)

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """`app` behind the guard: a request it refuses gets 401 (with a Bearer challenge), 403 or 503."""

        def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            found = self.verdict(environ.get("HTTP_AUTHORIZATION"), environ.get("PATH_INFO") or "/")
            if found is Verdict.ALLOWED:
                return app(environ, start_response)
            headers = [("Content-Type", "text/plain; charset=utf-8")]
            if found is Verdict.UNAUTHENTICATED:
                headers.append(("WWW-Authenticate", 'Bearer realm="dtjob metrics"'))
            start_response(found.status_line, headers)
            return [f"{found.status_line}\n".encode()]

        return guarded
