"""The fault proxy reads each request as the API server's authorizer would, and its rules pick by that."""

from __future__ import annotations

import pytest

from testbed.faultproxy import Fault, Request, Rule, parse_request

CR = "/apis/dtjob.io/v1alpha1/namespaces/ns/distributedtrainingjobs"


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "pods", "", "ns", None)),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "true"}, ("watch", "pods", "", "ns", None)),
        ("GET", "/api/v1/watch/namespaces/ns/pods", {}, ("watch", "pods", "", "ns", None)),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", {}, ("get", "pods", "log", "ns", "p")),
        ("POST", "/api/v1/namespaces/ns/pods", {}, ("create", "pods", "", "ns", None)),
        ("DELETE", "/api/v1/namespaces/ns/pods", {}, ("deletecollection", "pods", "", "ns", None)),
        ("PUT", "/api/v1/namespaces/ns/secrets/s", {}, ("update", "secrets", "", "ns", "s")),
        ("PATCH", f"{CR}/j/status", {}, ("patch", "distributedtrainingjobs", "status", "ns", "j")),
        ("GET", "/apis/batch/v1/namespaces/ns/jobs/j", {}, ("get", "jobs", "", "ns", "j")),
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "namespaces", "", None, "ns")),
        ("GET", "/api/v1/namespaces/ns/status", {}, ("get", "namespaces", "status", None, "ns")),
        ("GET", "/api/v1/nodes", {}, ("list", "nodes", "", None, None)),
        ("GET", "/readyz", {}, ("get", "", "", None, None)),
    ],
)
def test_requests_read_as_the_authorizer_reads_them(
    method: str, path: str, query: dict[str, str], expected: tuple[str, str, str, str | None, str | None]
) -> None:
    request = parse_request(method, path, query)
    assert (request.verb, request.resource, request.subresource, request.namespace, request.name) == expected


def test_rules_match_on_every_field_they_set() -> None:
    status_patch = parse_request("PATCH", f"{CR}/j/status", {})
    spec_patch = parse_request("PATCH", f"{CR}/j", {})
    rule = Rule(Fault.ERROR, status=409, verbs={"patch"}, subresource="status")
    assert rule.matches(status_patch) and not rule.matches(spec_patch)
    assert Rule(Fault.ERROR, subresource="").matches(spec_patch)
    assert not Rule(Fault.ERROR, namespace="other").matches(spec_patch)
    assert Rule(Fault.HANG).matches(Request("GET", "/version", "get"))


def test_every_nth_request_and_a_name() -> None:
    rule = Rule(Fault.ERROR, names={"j"}, every=2)
    assert rule.matches(parse_request("GET", f"{CR}/j", {}))
    assert not rule.matches(parse_request("GET", f"{CR}/k", {}))
