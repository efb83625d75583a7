"""spec.dataset.stageFrom and spec.output: defaults and errors that name the field."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from dtjob.spec.reader import SpecError
from dtjob.spec.storage import (
    AuthMode,
    SecretKeyRef,
    is_loopback_host,
    parse_output,
    parse_stage_from,
    resolve_destination,
)

KEY_CREDS = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
WI_CREDS = {"authMode": "workloadIdentity", "clientId": "0b7f7c3e-1d2a-4c5b-9e8f-123456789abc"}


def stage(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"account": "mystorage", "container": "imagenet", "credentials": KEY_CREDS}
    raw.update(overrides)
    return {k: v for k, v in raw.items() if v is not None}


def error_of(raw: Any, parse: Any = parse_stage_from) -> SpecError:
    with pytest.raises(SpecError) as err:
        parse(raw)
    return err.value


def test_public_account_defaults() -> None:
    parsed = parse_stage_from(stage(prefix="/ilsvrc2012/train/"))
    assert parsed is not None
    src = parsed.source
    assert src.endpoint == "https://mystorage.blob.core.windows.net"
    assert src.container_url == "https://mystorage.blob.core.windows.net/imagenet"
    assert src.account_name == "mystorage"
    assert src.prefix == "ilsvrc2012/train"
    assert src.credentials.auth_mode is AuthMode.ACCOUNT_KEY
    assert src.credentials.secret_ref == SecretKeyRef("storage-key", "azurestorageaccountkey")
    assert src.sas_lifetime == timedelta(hours=6)
    assert not src.is_local
    assert parsed.destination is None
    assert parsed.concurrency == 16


def test_absent_sections_are_none() -> None:
    assert parse_stage_from(None) is None
    assert parse_output(None) is None


def test_sovereign_and_emulator_endpoints() -> None:
    gov = parse_stage_from(stage(account=None, endpoint="https://acct1.blob.core.usgovcloudapi.net/"))
    assert gov is not None
    assert (gov.source.endpoint, gov.source.account_name) == (
        "https://acct1.blob.core.usgovcloudapi.net",
        "acct1",
    )
    local = parse_stage_from(stage(account=None, endpoint="http://127.0.0.1:10000/devstoreaccount1"))
    assert local is not None
    assert local.source.account_name == "devstoreaccount1"
    assert local.source.container_url == "http://127.0.0.1:10000/devstoreaccount1/imagenet"
    assert local.source.is_local


def test_emulator_hosts_the_operator_allows_may_use_plain_http() -> None:
    node_azurite = "http://10.224.0.1:10000/devstoreaccount1"
    with pytest.raises(SpecError) as refused:
        parse_stage_from(stage(account=None, endpoint=node_azurite))
    assert refused.value.path == "spec.dataset.stageFrom.endpoint"
    assert "https" in refused.value.message
    allowed = parse_output(
        {"endpoint": node_azurite, "container": "runs", "credentials": KEY_CREDS},
        emulator_hosts=frozenset({"10.224.0.1"}),
    )
    assert allowed is not None
    assert allowed.target.account_name == "devstoreaccount1"
    # Allowing one host allows no other.
    with pytest.raises(SpecError):
        parse_output(
            {
                "endpoint": "http://10.224.0.2:10000/devstoreaccount1",
                "container": "runs",
                "credentials": KEY_CREDS,
            },
            emulator_hosts=frozenset({"10.224.0.1"}),
        )


def test_workload_identity_output() -> None:
    out = parse_output(
        {"account": "results01", "container": "runs", "prefix": "r50", "credentials": WI_CREDS}
    )
    assert out is not None
    assert out.target.credentials.auth_mode is AuthMode.WORKLOAD_IDENTITY
    assert out.target.credentials.client_id == WI_CREDS["clientId"]
    assert out.target.credentials.secret_ref is None


@pytest.mark.parametrize(
    ("raw", "path", "fragment"),
    [
        (stage(account=None), "spec.dataset.stageFrom", "set account"),
        (stage(account="My_Storage"), "spec.dataset.stageFrom.account", "lowercase"),
        (stage(container=None), "spec.dataset.stageFrom.container", "is required"),
        (stage(container="Bad--Name"), "spec.dataset.stageFrom.container", "lowercase"),
        (stage(container="ab"), "spec.dataset.stageFrom.container", "3-63"),
        (stage(container=7), "spec.dataset.stageFrom.container", "must be a string"),
        (stage(endpoint="http://acct.blob.core.windows.net"), "spec.dataset.stageFrom.endpoint", "https"),
        (stage(endpoint="ftp://x"), "spec.dataset.stageFrom.endpoint", "https://"),
        (
            stage(endpoint="https://acct.blob.core.windows.net?sv=1&sig=x"),
            "spec.dataset.stageFrom.endpoint",
            "SAS",
        ),
        (
            stage(endpoint="https://other.blob.core.windows.net"),
            "spec.dataset.stageFrom.account",
            "does not match",
        ),
        (
            stage(endpoint="http://127.0.0.1:10000", account=None),
            "spec.dataset.stageFrom.endpoint",
            "one path segment",
        ),
        (stage(prefix="a/../b"), "spec.dataset.stageFrom.prefix", "'..'"),
        (stage(destination="data/x"), "spec.dataset.stageFrom.destination", "absolute"),
        (stage(destination="/data/../etc"), "spec.dataset.stageFrom.destination", ".."),
        (stage(concurrency=0), "spec.dataset.stageFrom.concurrency", "between 1 and 256"),
        (stage(concurrency="8"), "spec.dataset.stageFrom.concurrency", "integer"),
        (stage(concurrency=True), "spec.dataset.stageFrom.concurrency", "integer"),
        (stage(sasLifetimeSeconds=60), "spec.dataset.stageFrom.sasLifetimeSeconds", "between 300"),
        (stage(credentials=None), "spec.dataset.stageFrom.credentials", "is required"),
        (stage(credentials={"authMode": "key"}), "spec.dataset.stageFrom.credentials.authMode", "accountKey"),
        (
            stage(credentials={"authMode": "accountKey"}),
            "spec.dataset.stageFrom.credentials.secretRef",
            "required",
        ),
        (
            stage(credentials={"authMode": "accountKey", "secretRef": {"name": "Bad_Name"}}),
            "spec.dataset.stageFrom.credentials.secretRef.name",
            "valid Secret name",
        ),
        (
            stage(credentials={**WI_CREDS, "secretRef": {"name": "k"}}),
            "spec.dataset.stageFrom.credentials.secretRef",
            "only to authMode accountKey",
        ),
        (
            stage(credentials={"authMode": "workloadIdentity", "clientId": "me"}),
            "spec.dataset.stageFrom.credentials.clientId",
            "UUID",
        ),
        ("not an object", "spec.dataset.stageFrom", "must be an object"),
    ],
)
def test_errors_name_the_field(raw: Any, path: str, fragment: str) -> None:
    err = error_of(raw)
    assert err.path == path
    assert fragment in err.message


@pytest.mark.parametrize(
    ("endpoint", "account"),
    [
        ("https://acct1.blob.core.windows.net", "acct1"),
        ("https://acct1.blob.core.windows.net/", "acct1"),
        ("https://acct1.blob.core.usgovcloudapi.net", "acct1"),
        ("https://acct1.blob.core.chinacloudapi.cn", "acct1"),
        ("https://acct1.z17.blob.storage.azure.net", "acct1"),
        ("http://127.0.0.1:10000/devstoreaccount1", "devstoreaccount1"),
        ("https://localhost:10000/devstoreaccount1", "devstoreaccount1"),
        ("http://[::1]:10000/devstoreaccount1", "devstoreaccount1"),
    ],
)
def test_azure_storage_domains_and_loopback_emulators_are_accepted(endpoint: str, account: str) -> None:
    parsed = parse_output({"endpoint": endpoint, "container": "runs", "credentials": WI_CREDS})
    assert parsed is not None
    assert parsed.target.account_name == account
    assert parsed.target.endpoint == endpoint.rstrip("/")


@pytest.mark.parametrize(
    ("endpoint", "fragment"),
    [
        # Hosts that are not Azure Storage: the operator would send them its workload identity's token.
        ("https://attacker.example.com", "not an Azure Blob Storage endpoint"),
        ("https://acct1.blob.core.windows.net.attacker.example", "not an Azure Blob Storage endpoint"),
        ("https://attacker.example/acct1", "not an Azure Blob Storage endpoint"),
        ("https://blob.core.windows.net", "not an Azure Blob Storage endpoint"),
        ("https://a.b.blob.core.windows.net", "not an Azure Blob Storage endpoint"),
        ("https://acct1.queue.core.windows.net", "not an Azure Blob Storage endpoint"),
        ("https://acct1.dfs.core.windows.net", "use the account's blob endpoint"),
        ("https://10.0.0.5:10000/devstoreaccount1", "not an Azure Blob Storage endpoint"),
        ("https://acct1.blob.core.windows.net.", "not an Azure Blob Storage endpoint"),
        # Azure's own domains: https, no port, no path.
        ("http://acct1.blob.core.windows.net", "must use https"),
        ("https://acct1.blob.core.windows.net:8443", "without port or path"),
        ("https://acct1.blob.core.windows.net/acct1", "without port or path"),
        ("https://ACCT1.blob.core.windows.net", "in lowercase"),
        ("https://user:pw@acct1.blob.core.windows.net", "credentials"),
        # Emulators name their account in the path.
        ("http://127.0.0.1:10000", "one path segment"),
        ("http://127.0.0.1:10000/a/b", "one path segment"),
    ],
)
def test_other_endpoints_are_refused_naming_the_field(endpoint: str, fragment: str) -> None:
    fields = ((parse_output, "spec.output.endpoint"), (parse_stage_from, "spec.dataset.stageFrom.endpoint"))
    for parse, path in fields:
        err = error_of({"endpoint": endpoint, "container": "runs", "credentials": WI_CREDS}, parse)
        assert err.path == path
        assert fragment in err.message


def test_output_errors_use_the_output_path() -> None:
    err = error_of({"account": "acct", "credentials": KEY_CREDS}, parse_output)
    assert err.path == "spec.output.container"


def test_destination_must_be_inside_the_data_volume() -> None:
    inside = parse_stage_from(stage(destination="/data/imagenet/"))
    assert inside is not None
    assert resolve_destination(inside, "/data", "/data") == "/data/imagenet"
    default = parse_stage_from(stage())
    assert default is not None
    assert resolve_destination(default, "/data", "/data/imagenet") == "/data/imagenet"
    outside = parse_stage_from(stage(destination="/datasets/x"))
    assert outside is not None
    with pytest.raises(SpecError) as err:
        resolve_destination(outside, "/data", "/data")
    assert err.value.path == "spec.dataset.stageFrom.destination"
    with pytest.raises(SpecError) as default_err:
        resolve_destination(default, "/data", "/scratch")
    assert default_err.value.path == "spec.dataset.dataDir"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.0.0.2", True),  # all of 127.0.0.0/8 is loopback, not only its first address
        ("127.255.255.254", True),
        ("::1", True),
        ("128.0.0.1", False),
        ("10.0.0.4", False),
        ("localhost.example.com", False),
        ("acct1.blob.core.windows.net", False),
    ],
)
def test_one_loopback_check_for_every_caller(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
    endpoint = f"http://{'[::1]' if host == '::1' else host}:10000/devstoreaccount1"
    if loopback:
        parsed = parse_stage_from(stage(account=None, endpoint=endpoint))
        assert parsed is not None and parsed.source.is_local
    else:
        assert error_of(stage(account=None, endpoint=endpoint)).path == "spec.dataset.stageFrom.endpoint"
