"""The secure /metrics guard's decisions, the API server's reviews played by functions: who gets 401, 403,
503 or the page, what it remembers and for how long, and that its memory stays bounded."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dtjob.kube.access_reviews import Identity
from dtjob.runtime.metrics_access import MetricsGuard, Verdict, bearer_token, metrics_path_only

READER = Identity("system:serviceaccount:monitoring:prometheus", "u-1", ("system:serviceaccounts",))


class Reviews:
    def __init__(self) -> None:
        self.tokens = {"good": READER, "other": Identity("alice")}
        self.readers = {READER.user}
        self.asked: list[str] = []
        self.paths: list[str] = []  # the non-resource paths the guard asked about
        self.down = False

    def authenticate(self, token: str) -> Identity | None:
        self.asked.append(token)
        if self.down:
            raise ConnectionError("API server away")
        return self.tokens.get(token)

    def may(self, who: Identity, verb: str, path: str) -> bool:
        self.paths.append(path)
        return verb == "get" and who.user in self.readers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bearer_tokens_are_read_from_the_header_only() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_who_gets_what() -> None:
    reviews = Reviews()
    guard = MetricsGuard(reviews.authenticate, reviews.may)
    assert guard.verdict(None) is Verdict.UNAUTHENTICATED
    assert guard.verdict("Bearer forged") is Verdict.UNAUTHENTICATED
    assert guard.verdict("Bearer other") is Verdict.FORBIDDEN
    assert guard.verdict("Bearer good") is Verdict.ALLOWED


def test_a_verdict_is_remembered_for_a_minute_under_the_tokens_hash() -> None:
    reviews, clock = Reviews(), Clock()
    guard = MetricsGuard(reviews.authenticate, reviews.may, clock=clock)
    for _ in range(4):
        assert guard.verdict("Bearer good") is Verdict.ALLOWED
    assert reviews.asked == ["good"], "one review for four scrapes"
    reviews.readers.clear()  # the role binding is removed
    clock.now += 59
    assert guard.verdict("Bearer good") is Verdict.ALLOWED
    clock.now += 2
    assert guard.verdict("Bearer good") is Verdict.FORBIDDEN, "asked again after a minute"
    assert all("good" not in repr(key) for key in guard._verdicts), "tokens are never kept"


def test_an_api_server_that_cannot_be_asked_gets_503_and_is_asked_again() -> None:
    reviews = Reviews()
    guard = MetricsGuard(reviews.authenticate, reviews.may)
    reviews.down = True
    assert guard.verdict("Bearer good") is Verdict.UNAVAILABLE
    reviews.down = False
    assert guard.verdict("Bearer good") is Verdict.ALLOWED
    assert reviews.asked == ["good", "good"]


def test_sprayed_tokens_cannot_grow_the_memory() -> None:
    reviews = Reviews()
    guard = MetricsGuard(
        reviews.authenticate, reviews.may, max_remembered=16, reviews_per_s=1e9, review_burst=10**6
    )
    for i in range(1000):
        guard.verdict(f"Bearer t{i}")
    assert guard.remembered() == 16
    assert guard.verdict("Bearer good") is Verdict.ALLOWED


def test_the_wsgi_wrapper_answers_refusals_itself_and_passes_the_rest() -> None:
    reviews = Reviews()
    guard = MetricsGuard(reviews.authenticate, reviews.may)
    served: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        served.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"dtjob_jobs 1\n"]

    answers: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answers.append((status, headers))

    guarded = guard.wrap(app)
    body = b"".join(guarded({"PATH_INFO": "/metrics"}, start_response))
    assert (
        answers[-1][0] == "401 Unauthorized"
        and ("WWW-Authenticate", 'Bearer realm="dtjob metrics"') in answers[-1][1]
    )
    assert b"dtjob_" not in body and not served
    body = b"".join(guarded({"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer other"}, start_response))
    assert answers[-1][0] == "403 Forbidden" and not served
    body = b"".join(guarded({"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer good"}, start_response))
    assert answers[-1][0] == "200 OK" and body == b"dtjob_jobs 1\n" and served == ["/metrics"]


def call(app: Any, environ: dict[str, Any]) -> tuple[str, dict[str, str], bytes]:
    answers: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(app(environ, lambda status, headers: answers.append((status, headers))))
    return answers[-1][0], dict(answers[-1][1]), body


def page(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [])
    return [b"dtjob_jobs 1\n"]


def test_only_the_metrics_path_is_served_and_only_it_is_reviewed() -> None:
    """Every authenticated user may get /version from the API server: a guard that reviewed the caller's own
    path would serve the page there to any token. Any other path is 404 before a review is made."""
    reviews = Reviews()
    guarded = MetricsGuard(reviews.authenticate, reviews.may).wrap(page)
    for path in ("/version", "/healthz", "/", "/metrics/", "//metrics", "/metrics/x", "/METRICS"):
        status, _, body = call(guarded, {"PATH_INFO": path, "HTTP_AUTHORIZATION": "Bearer good"})
        assert status == "404 Not Found" and b"dtjob_" not in body, path
    assert reviews.asked == [] and reviews.paths == [], "no review for a path that is not served"
    status, headers, _ = call(
        guarded, {"PATH_INFO": "/metrics", "REQUEST_METHOD": "POST", "HTTP_AUTHORIZATION": "Bearer good"}
    )
    assert status == "405 Method Not Allowed" and headers["Allow"] == "GET, HEAD"
    status, _, body = call(guarded, {"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer good"})
    assert status == "200 OK" and body == b"dtjob_jobs 1\n"
    assert reviews.paths == ["/metrics"]


def test_the_plain_server_serves_the_metrics_path_only() -> None:
    routed = metrics_path_only(page)
    assert call(routed, {"PATH_INFO": "/version"})[0] == "404 Not Found"
    assert call(routed, {"PATH_INFO": "/metrics"})[0] == "200 OK"


def test_reviews_of_unknown_tokens_are_bounded_and_remembered_scrapers_go_on() -> None:
    reviews, clock = Reviews(), Clock()
    guard = MetricsGuard(reviews.authenticate, reviews.may, clock=clock, reviews_per_s=2, review_burst=5)
    assert guard.verdict("Bearer good") is Verdict.ALLOWED  # remembered from here on
    verdicts = [guard.verdict(f"Bearer sprayed-{i}") for i in range(100)]
    assert len(reviews.asked) == 5, "the burst, then nothing: 1 + 4 sprayed tokens reviewed"
    assert verdicts[:4] == [Verdict.UNAUTHENTICATED] * 4
    assert set(verdicts[4:]) == {Verdict.THROTTLED}
    assert guard.verdict("Bearer good") is Verdict.ALLOWED, "a remembered scraper is served during a flood"
    clock.now += 1
    assert guard.verdict("Bearer sprayed-200") is Verdict.UNAUTHENTICATED, "the budget refills: 2 a second"
    assert guard.verdict("Bearer sprayed-201") is Verdict.UNAUTHENTICATED
    assert guard.verdict("Bearer sprayed-202") is Verdict.THROTTLED
    status, headers, _ = call(guard.wrap(page), {"PATH_INFO": "/metrics", "HTTP_AUTHORIZATION": "Bearer x"})
    assert status == "429 Too Many Requests" and headers["Retry-After"] == "1"
