"""Who may read /metrics when it is served securely: a caller whose bearer token the API server vouches for
(a TokenReview) and whose user may `get` the non-resource URL /metrics (a SubjectAccessReview), as the API
server decides for its own /metrics. /metrics names every namespace's jobs and their progress, so a
Prometheus needs a ClusterRole granting that URL (the chart's `<release>-metrics-reader`).

Only the path /metrics is served: any other path is answered 404 before any review, and the review always
asks about /metrics itself, never the path a caller sent (every authenticated user may get /version or
/healthz from the API server, so authorizing the caller's path would hand the page to anyone with a token).

A verdict is remembered for a minute per token (under the token's hash, never the token), so a scrape every
15 s costs the API server one review a minute per scraper; the memory holds at most MAX_REMEMBERED verdicts,
whatever tokens are sprayed at it. Tokens not remembered are reviewed at most REVIEWS_PER_SECOND a second
(bursts of REVIEW_BURST): a caller spraying made-up tokens gets 429 instead of making the operator flood the
API server, while scrapers whose verdict is remembered are served as before. A review that could not be made
(the API server away) is answered 503 and not remembered. The reviews themselves are the caller's
(dtjob.kube.access_reviews.AccessReviews): this module only decides, so it is tested without a cluster.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from dtjob.kube.access_reviews import Identity
from dtjob.runtime.ttl_cache import TtlCache

REMEMBER_SECONDS = 60.0
MAX_REMEMBERED = 1024
METRICS_PATH = "/metrics"
# A scraper's verdict is remembered for REMEMBER_SECONDS: a few scrapers need a review a minute each.
REVIEWS_PER_SECOND = 1.0
REVIEW_BURST = 10


class Verdict(Enum):
    ALLOWED = (200, "OK")
    UNAUTHENTICATED = (401, "Unauthorized")
    FORBIDDEN = (403, "Forbidden")
    NOT_FOUND = (404, "Not Found")
    NOT_ALLOWED = (405, "Method Not Allowed")
    THROTTLED = (429, "Too Many Requests")
    UNAVAILABLE = (503, "Service Unavailable")

    @property
    def status_line(self) -> str:
        code, text = self.value
        return f"{code} {text}"


# A token -> its identity, or None when the API server does not accept it; raises when it cannot be asked.
Authenticate = Callable[[str], Identity | None]
# (identity, verb, non-resource path) -> may it; raises when it cannot be asked.
Authorize = Callable[[Identity, str, str], bool]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class ReviewBudget:
    """A token bucket: `rate_per_s` reviews a second on average, `burst` at once. Thread-safe."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._left = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        """One review, if the budget has one now."""
        with self._lock:
            now = self._clock()
            self._left = min(self._burst, self._left + (now - self._at) * self._rate)
            self._at = now
            if self._left < 1:
                return False
            self._left -= 1
            return True


class MetricsGuard:
    def __init__(
        self,
        authenticate: Authenticate,
        authorize: Authorize,
        remember_s: float = REMEMBER_SECONDS,
        max_remembered: int = MAX_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
        reviews_per_s: float = REVIEWS_PER_SECOND,
        review_burst: int = REVIEW_BURST,
    ) -> None:
        self._authenticate = authenticate
        self._authorize = authorize
        self._verdicts: TtlCache[str, Verdict] = TtlCache(remember_s, clock, max_remembered)
        self._budget = ReviewBudget(reviews_per_s, review_burst, clock)

    def verdict(self, authorization: str | None) -> Verdict:
        """Whether the bearer of `authorization` may get /metrics."""
        token = bearer_token(authorization)
        if token is None:
            return Verdict.UNAUTHENTICATED
        key = hashlib.sha256(token.encode()).hexdigest()
        remembered = self._verdicts.get(key)
        if remembered is not None:
            return remembered
        if not self._budget.take():
            return Verdict.THROTTLED
        try:
            who = self._authenticate(token)
            found = Verdict.UNAUTHENTICATED if who is None else self._allowed(who)
        except Exception:  # the API server could not be asked: say so, and ask again next time
            return Verdict.UNAVAILABLE
        self._verdicts.put(key, found)
        return found

    def _allowed(self, who: Identity) -> Verdict:
        return Verdict.ALLOWED if self._authorize(who, "get", METRICS_PATH) else Verdict.FORBIDDEN

    def remembered(self) -> int:
        return len(self._verdicts)

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """`app` behind the guard, at /metrics only: another path gets 404 and another method 405 before any
        review; a request the guard refuses gets 401 (with a Bearer challenge), 403, 429 or 503."""

        def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            found = request_refusal(environ) or self.verdict(environ.get("HTTP_AUTHORIZATION"))
            if found is Verdict.ALLOWED:
                return app(environ, start_response)
            return refuse(found, start_response)

        return guarded


def request_refusal(environ: dict[str, Any]) -> Verdict | None:
    """404 for any path but /metrics, 405 for any method but GET and HEAD; None for a metrics request."""
    if environ.get("PATH_INFO") != METRICS_PATH:
        return Verdict.NOT_FOUND
    if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
        return Verdict.NOT_ALLOWED
    return None


def metrics_path_only(app: WsgiApp) -> WsgiApp:
    """`app` at /metrics only (the plain server: no review, but no page under any other path either)."""

    def routed(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        found = request_refusal(environ)
        return app(environ, start_response) if found is None else refuse(found, start_response)

    return routed


def refuse(found: Verdict, start_response: StartResponse) -> Iterable[bytes]:
    headers = [("Content-Type", "text/plain; charset=utf-8")]
    if found is Verdict.UNAUTHENTICATED:
        headers.append(("WWW-Authenticate", 'Bearer realm="dtjob metrics"'))
    if found is Verdict.THROTTLED:
        headers.append(("Retry-After", "1"))
    if found is Verdict.NOT_ALLOWED:
        headers.append(("Allow", "GET, HEAD"))
    start_response(found.status_line, headers)
    return [f"{found.status_line}\n".encode()]
