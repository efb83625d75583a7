"""The CRD's storage fields (spec.dataset.stageFrom, spec.output) agree with dtjob.spec.storage, and their
patterns are RE2 (the API server's regex engine has no lookarounds or backreferences)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from dtjob.spec import storage as storage_spec
from dtjob.spec.reader import SpecError

CRD = Path(__file__).resolve().parents[2] / "crds" / "dtjob.io_distributedtrainingjobs.yaml"


@pytest.fixture(scope="module")
def fragment() -> dict[str, Any]:
    """The storage parts of the CRD's spec schema, keyed as `dataset` and `output`."""
    crd: dict[str, Any] = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return {"dataset": {"properties": {"stageFrom": spec["dataset"]["properties"]["stageFrom"]}},
            "output": spec["output"]}  # fmt: skip


def patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return found + [p for value in node.values() for p in patterns(value)]
    if isinstance(node, list):
        return [p for value in node for p in patterns(value)]
    return []


def test_patterns_are_re2_compatible(fragment: dict[str, Any]) -> None:
    found = patterns(fragment)
    assert len(found) >= 5
    for pattern in found:
        assert not re.search(r"\(\?[=!<]|\\[1-9]", pattern), f"lookaround or backreference in {pattern!r}"
        re.compile(pattern)


@pytest.mark.parametrize(
    "name", ["imagenet", "ab1", "a-b-c", "a" * 63, "ab", "a" * 64, "a--b", "-ab", "ab-", "Ab1", "a_b"]
)
def test_container_pattern_matches_the_parser(fragment: dict[str, Any], name: str) -> None:
    schema = fragment["dataset"]["properties"]["stageFrom"]["properties"]["container"]
    by_schema = (
        bool(re.match(schema["pattern"], name)) and schema["minLength"] <= len(name) <= schema["maxLength"]
    )
    raw = {"account": "acct1", "container": name, "credentials": {"authMode": "workloadIdentity"}}
    try:
        storage_spec.parse_stage_from(raw)
        by_parser = True
    except SpecError:
        by_parser = False
    assert by_schema == by_parser


def test_fragment_fields_are_the_parsers_fields(fragment: dict[str, Any]) -> None:
    stage = fragment["dataset"]["properties"]["stageFrom"]
    output = fragment["output"]
    assert set(stage["properties"]) == {
        "account", "endpoint", "container", "prefix", "destination", "concurrency", "sasLifetimeSeconds",
        "credentials", "podAnnotations",
    }  # fmt: skip
    assert set(output["properties"]) == set(stage["properties"]) - {
        "destination", "concurrency", "podAnnotations",
    } | {"uploadRetrySeconds"}  # fmt: skip
    retry = output["properties"]["uploadRetrySeconds"]
    assert (retry["minimum"], retry["maximum"]) == (0, storage_spec.MAX_UPLOAD_RETRY_SECONDS)
    creds = stage["properties"]["credentials"]
    assert creds["properties"]["authMode"]["enum"] == [m.value for m in storage_spec.AuthMode]
    lifetime = stage["properties"]["sasLifetimeSeconds"]
    assert (lifetime["minimum"], lifetime["maximum"]) == (
        storage_spec.MIN_SAS_LIFETIME_S,
        storage_spec.MAX_SAS_LIFETIME_S,
    )
    assert stage["properties"]["concurrency"]["maximum"] == storage_spec.MAX_CONCURRENCY
    assert stage["properties"]["account"]["pattern"] == storage_spec.ACCOUNT_RE.pattern


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://acct1.blob.core.windows.net",
        "https://acct1.blob.core.windows.net/",
        "https://acct1.blob.core.usgovcloudapi.net",
        "https://acct1.blob.core.chinacloudapi.cn",
        "https://acct1.z07.blob.storage.azure.net",
        "http://acct1.blob.core.windows.net",
        "https://acct1.dfs.core.windows.net",
        "https://attacker.example.com",
        "https://acct1.blob.core.windows.net.attacker.example",
        "https://ACCT1.blob.core.windows.net",
        "https://acct1.blob.core.windows.net:8443",
        "https://acct1.blob.core.windows.net?sv=1",
        "ftp://acct1.blob.core.windows.net",
        "http://127.0.0.1:10000/devstoreaccount1",
        "http://10.224.0.1:10000/devstoreaccount1",
        "http://azurite.storage.svc:10000/devstoreaccount1/",
        "http://127.0.0.1:10000",
        "http://127.0.0.1:10000/a/b",
        "http://user@127.0.0.1:10000/devstoreaccount1",
    ],
)
def test_endpoint_pattern_admits_what_some_install_of_the_operator_would(
    fragment: dict[str, Any], endpoint: str
) -> None:
    """The schema cannot know the installer's emulator hosts: it admits a path-style endpoint on any host, and
    the operator refuses a host that is neither loopback nor allowed. So the schema must agree with the parser
    when the endpoint's own host is an allowed emulator, and refuse everything else at apply."""
    schema = fragment["output"]["properties"]["endpoint"]
    assert schema["pattern"] == storage_spec.ENDPOINT_PATTERN
    by_schema = bool(re.match(schema["pattern"], endpoint))
    host = urlsplit(endpoint).hostname or ""
    raw = {"endpoint": endpoint, "container": "runs", "credentials": {"authMode": "workloadIdentity"}}
    try:
        storage_spec.parse_output(raw, emulator_hosts=frozenset({host}))
        by_parser = True
    except SpecError:
        by_parser = False
    assert by_schema == by_parser
