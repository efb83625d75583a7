"""The storage allowlists: cluster-wide defaults from the operator's settings, replaced per namespace by the
Namespace's annotations; refusals name the field and the rule."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.config import load_config
from dtjob.storage_spec import BlobLocation, parse_output
from dtjob.tenancy import (
    ANNOTATION_ACCOUNTS,
    ANNOTATION_CLIENT_IDS,
    ANNOTATION_CONTAINERS,
    StoragePolicy,
    Violation,
    check_location,
    check_locations,
    cluster_policy,
    namespace_policy,
)

CLIENT_ID = "0b7f7c3e-1d2a-4c5b-9e8f-123456789abc"


def location(
    account: str = "teamadata", container: str = "runs", client_id: str | None = None
) -> BlobLocation:
    creds: dict[str, Any] = {"authMode": "workloadIdentity"}
    if client_id is not None:
        creds["clientId"] = client_id
    parsed = parse_output({"account": account, "container": container, "credentials": creds})
    assert parsed is not None
    return parsed.target


def check(policy: StoragePolicy, loc: BlobLocation) -> Violation | None:
    return check_location(policy, "team-a", loc, "spec.output")


def test_the_defaults_allow_no_account_and_no_client_id() -> None:
    policy = load_config({}).storage_policy
    refused = check(policy, location())
    assert refused is not None
    assert refused.path == "spec.output.account"
    assert "storage account 'teamadata' is not allowed in namespace team-a" in refused.message
    assert "allowed: none (operator setting DTJOB_ALLOWED_STORAGE_ACCOUNTS)" in refused.message

    accounts_only = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "teamadata"})
    assert check(accounts_only, location()) is None  # any container, the operator's own identity
    refused_id = check(accounts_only, location(client_id=CLIENT_ID))
    assert refused_id is not None
    assert refused_id.path == "spec.output.credentials.clientId"
    assert "omit clientId to use the operator's own identity" in refused_id.message


def test_cluster_wide_lists_are_comma_separated_and_star_means_any() -> None:
    policy = cluster_policy({
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": " teamadata , teambdata ",
        "DTJOB_ALLOWED_STORAGE_CONTAINERS": "runs,imagenet",
        "DTJOB_ALLOWED_CLIENT_IDS": CLIENT_ID.upper(),
    })  # fmt: skip
    assert check(policy, location("teambdata", "imagenet", CLIENT_ID)) is None
    other_container = check(policy, location(container="secrets"))
    assert other_container is not None
    assert other_container.path == "spec.output.container"
    assert "allowed: imagenet, runs" in other_container.message
    star = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "*", "DTJOB_ALLOWED_CLIENT_IDS": "*"})
    assert check(star, location("anyaccount", "anything", CLIENT_ID)) is None


def test_a_namespace_annotation_replaces_its_cluster_wide_list() -> None:
    cluster = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared"})
    annotations = {ANNOTATION_ACCOUNTS: "teamadata", ANNOTATION_CONTAINERS: "team-a-runs"}
    team_a = namespace_policy(cluster, "team-a", annotations)
    assert check(team_a, location("teamadata", "team-a-runs")) is None
    shared = check(team_a, location("shared", "team-a-runs"))
    assert shared is not None
    assert shared.path == "spec.output.account"
    assert f"annotation {ANNOTATION_ACCOUNTS} on Namespace team-a" in shared.message
    # An empty annotation allows nothing in that namespace.
    closed = namespace_policy(cluster, "team-a", {ANNOTATION_ACCOUNTS: ""})
    assert check(closed, location("shared")) is not None
    # Without annotations the cluster-wide lists apply.
    assert check(namespace_policy(cluster, "team-b", {}), location("shared")) is None
    ids = namespace_policy(cluster, "team-b", {ANNOTATION_CLIENT_IDS: CLIENT_ID})
    assert check(ids, location("shared", client_id=CLIENT_ID)) is None


@pytest.mark.parametrize("allowed", ["runs", "*"])
def test_the_first_refused_location_is_reported(allowed: str) -> None:
    policy = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "teamadata",
                             "DTJOB_ALLOWED_STORAGE_CONTAINERS": allowed})  # fmt: skip
    good, bad = location(), location(account="elsewhere")
    assert check_locations(policy, "team-a", [(good, "spec.dataset.stageFrom")]) is None
    refused = check_locations(policy, "team-a", [(good, "spec.dataset.stageFrom"), (bad, "spec.output")])
    assert refused is not None
    assert refused.path == "spec.output.account"
