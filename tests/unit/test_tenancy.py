"""The storage allowlists: cluster-wide defaults from the operator's settings, replaced per namespace by the
Namespace's annotations; refusals name the field and the rule."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.config import load_config
from dtjob.spec.storage import BlobLocation, parse_output
from dtjob.spec.tenancy import (
    ANNOTATION_ACCOUNTS,
    ANNOTATION_CLIENT_IDS,
    ANNOTATION_CONTAINERS,
    ANNOTATION_READ_CONTAINERS,
    ANNOTATION_WRITE_CONTAINERS,
    StoragePolicy,
    Use,
    Violation,
    check_location,
    check_locations,
    cluster_policy,
    cluster_view,
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


def check(
    policy: StoragePolicy, loc: BlobLocation, use: Use = Use.READ, ns: str = "team-a"
) -> Violation | None:
    path = "spec.output" if use is Use.WRITE else "spec.dataset.stageFrom"
    return check_location(policy, ns, loc, path, use)


def test_the_defaults_allow_no_account_and_no_client_id() -> None:
    policy = load_config({}).storage_policy
    refused = check(policy, location())
    assert refused is not None
    assert refused.path == "spec.dataset.stageFrom.account"
    assert "storage account 'teamadata' is not allowed in namespace team-a" in refused.message
    assert "allowed: none (operator setting DTJOB_ALLOWED_STORAGE_ACCOUNTS)" in refused.message

    accounts_only = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "teamadata"})
    assert check(accounts_only, location()) is None  # any container, the operator's own identity
    refused_id = check(accounts_only, location(client_id=CLIENT_ID))
    assert refused_id is not None
    assert refused_id.path == "spec.dataset.stageFrom.credentials.clientId"
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
    assert other_container.path == "spec.dataset.stageFrom.container"
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
    assert shared.path == "spec.dataset.stageFrom.account"
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
    assert check_locations(policy, "team-a", [(good, "spec.dataset.stageFrom", Use.READ)]) is None
    both = [(good, "spec.dataset.stageFrom", Use.READ), (bad, "spec.output", Use.WRITE)]
    refused = check_locations(policy, "team-a", both)
    assert refused is not None
    assert refused.path == "spec.output.account"


def test_a_container_a_namespace_may_read_is_not_one_it_may_write() -> None:
    # The hole this closes: one list for both let a team that stages from the shared imagenet container
    # point its output there, and rank 0 then held a token that could overwrite everyone's training data.
    policy = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared", "DTJOB_READ_CONTAINERS": "imagenet"})
    imagenet = location("shared", "imagenet")
    assert check(policy, imagenet, Use.READ) is None
    refused = check(policy, imagenet, Use.WRITE)
    assert refused is not None
    assert refused.path == "spec.output.container"
    assert refused.message == (
        "container 'imagenet' is not writable in namespace team-a "
        "(allowed: none (operator setting DTJOB_WRITE_CONTAINERS))"
    )
    # The defaults: read any container of an allowed account, write none.
    defaults = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared"})
    assert check(defaults, imagenet, Use.READ) is None
    assert check(defaults, imagenet, Use.WRITE) is not None


def test_a_star_in_the_write_list_never_reaches_a_container_a_read_list_names() -> None:
    policy = cluster_policy({
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared",
        "DTJOB_READ_CONTAINERS": "imagenet",
        "DTJOB_WRITE_CONTAINERS": "*",
    })  # fmt: skip
    assert check(policy, location("shared", "team-a-runs"), Use.WRITE) is None
    refused = check(policy, location("shared", "imagenet"), Use.WRITE)
    assert refused is not None and refused.path == "spec.output.container"
    assert "is read by jobs (operator setting DTJOB_READ_CONTAINERS names it)" in refused.message
    assert "name it in the write list to allow that" in refused.message
    # A namespace's own read list counts too.
    team_a = namespace_policy(policy, "team-a", {ANNOTATION_READ_CONTAINERS: "coco"})
    assert check(team_a, location("shared", "coco"), Use.WRITE) is not None
    # Named in the write list itself: the installer said so explicitly.
    explicit = cluster_policy({
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared",
        "DTJOB_READ_CONTAINERS": "imagenet",
        "DTJOB_WRITE_CONTAINERS": "imagenet",
    })  # fmt: skip
    assert check(explicit, location("shared", "imagenet"), Use.WRITE) is None


def test_a_namespace_pattern_gives_each_namespace_a_container_of_its_own() -> None:
    policy = cluster_policy({
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared",
        "DTJOB_READ_CONTAINERS": "*",
        "DTJOB_WRITE_CONTAINERS": "results-{namespace}",
    })  # fmt: skip
    own, other = location("shared", "results-team-a"), location("shared", "results-team-b")
    assert check(policy, own, Use.WRITE, ns="team-a") is None
    assert check(policy, own, Use.READ, ns="team-a") is None  # a namespace reads what it writes
    refused_write = check(policy, other, Use.WRITE, ns="team-a")
    assert refused_write is not None and refused_write.path == "spec.output.container"
    assert "allowed: results-{namespace}" in refused_write.message
    # The read wildcard does not reach another namespace's own container...
    refused_read = check(policy, other, Use.READ, ns="team-a")
    assert refused_read is not None and refused_read.path == "spec.dataset.stageFrom.container"
    assert "is written by another namespace (it is namespace team-b's own, by operator setting " in (
        refused_read.message
    )
    # ... unless a read list names it.
    shared_with_a = namespace_policy(policy, "team-a", {ANNOTATION_READ_CONTAINERS: "results-team-b"})
    assert check(shared_with_a, other, Use.READ, ns="team-a") is None
    assert check(policy, location("shared", "imagenet"), Use.READ, ns="team-a") is None


def test_namespace_annotations_replace_the_container_lists_and_the_former_names_still_work() -> None:
    cluster = cluster_policy({"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared", "DTJOB_WRITE_CONTAINERS": "runs"})
    team_a = namespace_policy(cluster, "team-a", {ANNOTATION_WRITE_CONTAINERS: "team-a-runs"})
    assert check(team_a, location("shared", "team-a-runs"), Use.WRITE) is None
    assert check(team_a, location("shared", "runs"), Use.WRITE) is not None
    former = cluster_policy(
        {"DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared", "DTJOB_ALLOWED_STORAGE_CONTAINERS": "aaa"}
    )
    assert check(former, location("shared", "bbb")) is not None
    annotated = namespace_policy(former, "team-a", {ANNOTATION_CONTAINERS: "bbb"})
    assert check(annotated, location("shared", "bbb")) is None


WRITE_LIST = ANNOTATION_WRITE_CONTAINERS


def star_cluster(write: str = "results-{namespace}") -> StoragePolicy:
    return cluster_policy({
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": "shared",
        "DTJOB_READ_CONTAINERS": "*",
        "DTJOB_WRITE_CONTAINERS": write,
    })  # fmt: skip


def in_namespace(cluster: StoragePolicy, ns: str, namespaces: dict[str, dict[str, str]]) -> StoragePolicy:
    """`ns`'s policy with every namespace's annotations (`namespaces`) in view, as the operator reads them."""
    return namespace_policy(cluster, ns, namespaces.get(ns, {}), cluster_view(namespaces.items()))


def test_a_star_never_reaches_a_container_another_namespaces_own_write_list_names() -> None:
    # The hole this closes: team-a's results container, named only in its own annotation, was readable by
    # every namespace through the default read list's `*`.
    namespaces = {
        "team-a": {WRITE_LIST: "team-a-runs"},
        "team-b": {},
        "team-c": {WRITE_LIST: "runs-{namespace}"},
    }
    cluster = star_cluster()
    team_b = in_namespace(cluster, "team-b", namespaces)
    refused = check(team_b, location("shared", "team-a-runs"), Use.READ, ns="team-b")
    assert refused is not None and refused.path == "spec.dataset.stageFrom.container"
    assert refused.message == (
        "container 'team-a-runs' is written by another namespace (another namespace's own write list names "
        "it), so a `*` in the read list does not reach it from namespace team-b; name it in the read list to "
        "allow that (allowed: * (operator setting DTJOB_READ_CONTAINERS))"
    )
    assert "team-a" not in refused.message.replace("'team-a-runs'", "")  # never whose annotation it is
    assert check(team_b, location("shared", "runs-team-c"), Use.READ, ns="team-b") is not None
    assert check(team_b, location("shared", "imagenet"), Use.READ, ns="team-b") is None  # nobody writes it
    # Its writers read it; a read list that names it lets another namespace read it too.
    team_a = in_namespace(cluster, "team-a", namespaces)
    assert check(team_a, location("shared", "team-a-runs"), Use.READ, ns="team-a") is None
    team_c = in_namespace(cluster, "team-c", namespaces)
    assert check(team_c, location("shared", "runs-team-c"), Use.READ, ns="team-c") is None
    shared_with_b = in_namespace(
        cluster, "team-b", {**namespaces, "team-b": {ANNOTATION_READ_CONTAINERS: "team-a-runs"}}
    )
    assert check(shared_with_b, location("shared", "team-a-runs"), Use.READ, ns="team-b") is None
    # A `*` in a write list does not reach it either.
    star_writer = in_namespace(cluster, "team-b", {**namespaces, "team-b": {WRITE_LIST: "*"}})
    overwrite = check(star_writer, location("shared", "team-a-runs"), Use.WRITE, ns="team-b")
    assert overwrite is not None and overwrite.path == "spec.output.container"
    assert "is written by another namespace" in overwrite.message
    assert "a `*` in the write list does not reach it from namespace team-b" in overwrite.message
    assert check(star_writer, location("shared", "team-b-scratch"), Use.WRITE, ns="team-b") is None


def test_a_container_the_cluster_write_list_names_literally_is_shared_by_the_namespaces_that_use_it() -> None:
    cluster = star_cluster("results-{namespace},shared-results")
    namespaces = {"team-a": {}, "team-c": {WRITE_LIST: "team-c-runs"}}
    team_a = in_namespace(cluster, "team-a", namespaces)
    for use in Use:
        assert check(team_a, location("shared", "shared-results"), use, ns="team-a") is None
    # A namespace whose own annotation replaced the write list is not one of its writers.
    team_c = in_namespace(cluster, "team-c", namespaces)
    refused = check(team_c, location("shared", "shared-results"), Use.READ, ns="team-c")
    assert refused is not None and refused.path == "spec.dataset.stageFrom.container"
    assert (
        "is written by another namespace (operator setting DTJOB_WRITE_CONTAINERS names it, for every "
        "namespace without a write list of its own)"
    ) in refused.message
    # A `{namespace}` entry keeps a namespace's container for it while it sets a list of its own.
    namespaces["team-b"] = {WRITE_LIST: "team-b-runs"}
    team_a = in_namespace(cluster, "team-a", namespaces)
    assert check(team_a, location("shared", "results-team-b"), Use.READ, ns="team-a") is not None


def test_a_star_in_a_write_list_never_reaches_a_container_another_namespaces_read_list_names() -> None:
    cluster = star_cluster("*")
    namespaces = {"team-a": {}, "team-b": {ANNOTATION_CONTAINERS: "coco"}}  # the former annotation counts too
    team_a = in_namespace(cluster, "team-a", namespaces)
    refused = check(team_a, location("shared", "coco"), Use.WRITE, ns="team-a")
    assert refused is not None and refused.path == "spec.output.container"
    assert "is read by jobs (another namespace's own read list names it)" in refused.message
    assert check(team_a, location("shared", "team-a-runs"), Use.WRITE, ns="team-a") is None
    named = in_namespace(cluster, "team-a", {**namespaces, "team-a": {WRITE_LIST: "coco"}})
    assert check(named, location("shared", "coco"), Use.WRITE, ns="team-a") is None
