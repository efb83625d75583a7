"""Pure parts of dtjob.azure.sas: validity windows, rotation timing, the Secret, redaction."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dtjob.azure.sas import (
    ANNOTATION_EXPIRES,
    ANNOTATION_ISSUED,
    START_SKEW,
    ContainerSas,
    allowed_protocol,
    delegation_expiry,
    mint_with_account_key,
    redact,
    rotation_due,
    rotation_time,
    sas_secret,
    secret_rotation_due,
    validity_window,
    workload_identity_credential,
)
from dtjob.config import OperatorConfig
from dtjob.names import Access
from dtjob.reconcile.storage_observe import output_directory

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
OWNER = {"apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob", "name": "r50", "uid": "u-1"}
# A syntactically valid base64 key for signing only; it belongs to no account.
FAKE_KEY = "a2V5LWZvci1zaWduaW5nLW9ubHktbm90LWEtcmVhbC1hY2NvdW50LWtleS0xMjM0NTY3OA=="


def test_window_starts_in_the_past_and_ends_after_lifetime() -> None:
    start, expiry = validity_window(NOW, timedelta(hours=2))
    assert start == NOW - START_SKEW
    assert expiry == NOW + timedelta(hours=2)


def test_window_is_bounded_by_the_job_deadline() -> None:
    deadline = NOW + timedelta(minutes=30)
    assert validity_window(NOW, timedelta(hours=6), deadline=deadline)[1] == deadline


def test_window_is_bounded_by_a_cap() -> None:
    assert validity_window(NOW, timedelta(days=30), cap=timedelta(days=7))[1] == NOW + timedelta(days=7)


def test_window_refuses_a_passed_deadline_and_bad_lifetimes() -> None:
    with pytest.raises(ValueError, match="deadline"):
        validity_window(NOW, timedelta(hours=1), deadline=NOW - timedelta(seconds=1))
    with pytest.raises(ValueError, match="positive"):
        validity_window(NOW, timedelta(0))
    with pytest.raises(ValueError, match="timezone"):
        validity_window(NOW.replace(tzinfo=None), timedelta(hours=1))


def test_rotation_is_due_after_eighty_percent_of_the_life() -> None:
    issued, expires = NOW, NOW + timedelta(hours=10)
    assert rotation_time(issued, expires) == NOW + timedelta(hours=8)
    assert not rotation_due(issued, expires, NOW + timedelta(hours=7, minutes=59))
    assert rotation_due(issued, expires, NOW + timedelta(hours=8))
    assert rotation_due(issued, expires, NOW + timedelta(hours=11))
    assert not rotation_due(issued, expires, NOW + timedelta(hours=4), fraction=0.5)
    assert rotation_due(issued, expires, NOW + timedelta(hours=5), fraction=0.5)
    with pytest.raises(ValueError, match="fraction"):
        rotation_time(issued, expires, fraction=1.0)


def test_https_only_except_on_loopback() -> None:
    assert allowed_protocol("https://acct.blob.core.windows.net") == "https"
    assert allowed_protocol("http://127.0.0.1:10000/devstoreaccount1") == "https,http"
    assert allowed_protocol("http://localhost:10000/devstoreaccount1") == "https,http"
    # An in-cluster emulator the operator allows (the spec admits http nowhere else).
    assert allowed_protocol("http://10.224.0.1:10000/devstoreaccount1") == "https,http"
    assert allowed_protocol("https://127.0.0.1.evil.example") == "https"


def test_minted_token_carries_permissions_protocol_and_times() -> None:
    start, expiry = validity_window(NOW, timedelta(hours=1))
    sas_in = mint_with_account_key(
        "https://acct.blob.core.windows.net", "acct", FAKE_KEY, "data", Access.INPUT, start, expiry
    )
    fields = dict(part.split("=", 1) for part in sas_in.token.split("&"))
    assert fields["sp"] == "rl"
    assert fields["spr"] == "https"
    assert fields["sr"] == "c"
    assert fields["st"].startswith("2025-03-01T11%3A55")
    assert fields["se"].startswith("2025-03-01T13%3A00")
    assert sas_in.container_url == "https://acct.blob.core.windows.net/data"
    sas_out = mint_with_account_key(
        "https://acct.blob.core.windows.net/", "acct", FAKE_KEY, "out", Access.OUTPUT, start, expiry
    )
    out_fields = dict(part.split("=", 1) for part in sas_out.token.split("&"))
    # Create + write only: no list, read, add or delete of what other runs wrote.
    assert (out_fields["sp"], out_fields["sr"]) == ("cw", "c")
    assert sas_out.container_url == "https://acct.blob.core.windows.net/out"
    assert FAKE_KEY not in sas_out.token


def test_output_sas_on_a_hierarchical_namespace_account_reaches_only_the_run_directory() -> None:
    start, expiry = validity_window(NOW, timedelta(hours=1))
    sas = mint_with_account_key(
        "https://acct.blob.core.windows.net", "acct", FAKE_KEY, "out", Access.OUTPUT, start, expiry,
        directory="runs/team-a/r50/0b1c-uid/",
    )  # fmt: skip
    fields = dict(part.split("=", 1) for part in sas.token.split("&"))
    assert (fields["sr"], fields["sdd"], fields["sp"]) == ("d", "4", "cw")
    # Clients still address blobs by their full name under the container.
    assert sas.container_url == "https://acct.blob.core.windows.net/out"
    container_wide = mint_with_account_key(
        "https://acct.blob.core.windows.net", "acct", FAKE_KEY, "out", Access.OUTPUT, start, expiry
    )
    assert container_wide.token != sas.token
    with pytest.raises(ValueError, match="needs a directory"):
        mint_with_account_key(
            "https://acct.blob.core.windows.net", "acct", FAKE_KEY, "out", Access.OUTPUT, start, expiry, "/"
        )


def test_repr_and_str_never_show_the_token() -> None:
    sas = ContainerSas(
        "https://a.blob.core.windows.net/c", "sv=1&sig=SECRETSIG", NOW, NOW + timedelta(hours=1)
    )
    assert "SECRETSIG" not in repr(sas)
    assert "SECRETSIG" not in str(sas)
    assert "SECRETSIG" not in f"{sas}"


def test_redact_blanks_signatures_in_urls_and_messages() -> None:
    text = "GET https://a.blob.core.windows.net/c/x?sv=2024&sp=rl&sig=abc%2Bdef%3D&se=1 failed; sig=zzz"
    cleaned = redact(text)
    assert "abc%2Bdef" not in cleaned
    assert "zzz" not in cleaned
    assert "sp=rl" in cleaned
    assert cleaned.count("sig=REDACTED") == 2


def test_secret_shape_names_labels_and_owner() -> None:
    sas = ContainerSas("https://a.blob.core.windows.net/c", "sv=1&sig=S", NOW, NOW + timedelta(hours=6))
    secret = sas_secret("r50", "team-a", Access.OUTPUT, sas, NOW, OWNER)
    meta = secret["metadata"]
    assert meta["name"] == "r50-sas-out"
    assert meta["namespace"] == "team-a"
    assert meta["labels"]["dtjob.io/job-name"] == "r50"
    assert meta["labels"]["dtjob.io/role"] == "sas-out"
    assert meta["ownerReferences"] == [OWNER]
    assert meta["annotations"] == {
        ANNOTATION_ISSUED: "2025-03-01T12:00:00Z",
        ANNOTATION_EXPIRES: "2025-03-01T18:00:00Z",
    }
    assert secret["stringData"] == {
        "sas-token": "sv=1&sig=S",
        "container-url": "https://a.blob.core.windows.net/c",
        "expires-at": "2025-03-01T18:00:00Z",
    }
    # The token lives only in the data, never in labels or annotations (which `kubectl describe` shows).
    assert "sig=S" not in str(meta)
    assert sas_secret("r50", "team-a", Access.INPUT, sas, NOW, OWNER)["metadata"]["name"] == "r50-sas-in"


def test_secret_rotation_due_reads_the_annotations() -> None:
    sas = ContainerSas("https://a.blob.core.windows.net/c", "t", NOW, NOW + timedelta(hours=10))
    secret = sas_secret("r50", "ns", Access.INPUT, sas, NOW, OWNER)
    assert not secret_rotation_due(secret, NOW + timedelta(hours=7))
    assert secret_rotation_due(secret, NOW + timedelta(hours=8, seconds=1))
    assert secret_rotation_due({"metadata": {"annotations": {}}}, NOW)
    assert secret_rotation_due({"metadata": {"annotations": {ANNOTATION_ISSUED: "junk"}}}, NOW)


def test_user_delegation_tokens_never_outlive_a_seven_day_key() -> None:
    start = NOW - START_SKEW
    assert delegation_expiry(start, NOW + timedelta(days=30)) == start + timedelta(days=7)
    assert delegation_expiry(start, NOW + timedelta(hours=6)) == NOW + timedelta(hours=6)


def test_workload_identity_credential_is_built_without_contacting_azure() -> None:
    credential = workload_identity_credential("0b7f7c3e-1d2a-4c5b-9e8f-123456789abc")
    assert callable(getattr(credential, "get_token", None))


def test_only_the_output_sas_on_an_hns_account_is_scoped_to_the_run_directory() -> None:
    creds = {"authMode": "workloadIdentity"}
    spec = job_spec(output={"account": "lake1", "container": "runs", "prefix": "r50/", "credentials": creds})
    assert spec.output is not None
    target = spec.output.target
    hns = OperatorConfig(hns_accounts=frozenset({"lake1"}))
    assert output_directory(spec, target, "uid-1", hns, Access.OUTPUT) == "r50/ml/rn50/uid-1"
    assert output_directory(spec, target, "uid-1", hns, Access.INPUT) is None
    assert output_directory(spec, target, "uid-1", OperatorConfig(), Access.OUTPUT) is None
