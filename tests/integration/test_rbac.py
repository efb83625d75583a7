"""The chart grants the operator exactly the API verbs its code uses: no more (least privilege), no fewer.

What the code uses is the operator's declared permission table (dtjob.kube.permissions.PERMISSIONS: every
call of its client goes through dtjob.kube.rest.api_call, which refuses any call outside the table, and no
module of the operator process builds a typed client of its own; its watches too: kopf serves no resource),
and the few needs of the API server that no call in our code spells out (each listed with why). What the
chart grants is what real helm renders, bound to the operator's ServiceAccount.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Any

import dtjob
import pytest
import yaml
from dtjob.desired.common import owner_reference
from dtjob.kube.permissions import PERMISSIONS
from dtjob.kube.rest import RESOURCES, permission

from tests.tools import REPO, tool

pytestmark = pytest.mark.integration
CHART = REPO / "charts" / "dtjob"
PACKAGE = REPO / "operator" / "dtjob"
RELEASE, RELEASE_NS = "dtjob", "dtjob-system"
Permission = tuple[str, str, str]  # (apiGroup, resource, verb)
# Not the operator process: the CLI calls the API with its user's own credentials, the dataset tools and the
# stager run elsewhere.
NOT_THE_OPERATOR = ("cli", "datasets", "stager")
CLUSTER_SCOPED = {
    "nodes", "namespaces", "tokenreviews", "subjectaccessreviews",
    "workloadpriorityclasses",
}  # fmt: skip
# Used only when a chart value turns the feature on.
OPTIONAL = {
    ("networking.k8s.io", "networkpolicies", "create"): "networkPolicy.enabled=true",
    ("networking.k8s.io", "networkpolicies", "get"): "networkPolicy.enabled=true",
    ("networking.k8s.io", "networkpolicies", "patch"): "networkPolicy.enabled=true",
}
# Used unless a chart value turns the feature off: the secure /metrics' reviews of its callers.
METRICS_PLAIN = "metrics.secure=false"
UNLESS = {
    ("authentication.k8s.io", "tokenreviews", "create"): METRICS_PLAIN,
    ("authorization.k8s.io", "subjectaccessreviews", "create"): METRICS_PLAIN,
}
# Leader election (on unless a chart value turns it off): the Lease, in the release namespace only, and the
# Events about it there.
LEADER_ELECTION_OFF = "leaderElection.enabled=false"
RELEASE_NAMESPACE_ONLY = {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")}
ALSO_IN_RELEASE_NAMESPACE = {("", "events", "create")}


def typed_clients(package: Path = PACKAGE) -> list[str]:
    """Every `<module>.<Name>Api(...)` (a typed client of the official library: CoreV1Api,
    CustomObjectsApi...) that a module of the operator process builds, as "path:line"."""
    found: list[str] = []
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] in NOT_THE_OPERATOR:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name = node.func.attr
            if name.endswith("Api") and name not in ("ApiClient", "Api"):
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    return found


def table_calls() -> set[Permission]:
    """The calls the operator's client may make: the declared table, each entry on a resource it knows."""
    known = {(version.rpartition("/")[0], resource) for (version, _), resource in RESOURCES.items()}
    for group, resource, _ in PERMISSIONS:
        assert (group, resource.split("/")[0]) in known, (
            f"{group}/{resource} is not in dtjob.kube.rest.RESOURCES"
        )
    return set(PERMISSIONS)


def test_every_call_goes_through_the_table() -> None:
    assert typed_clients() == [], "a typed client bypasses dtjob.kube.rest.api_call and its table"
    assert all(why.strip() for why in PERMISSIONS.values()), "every permission says why it is needed"


def test_the_watches_are_in_the_table() -> None:
    from dtjob.runtime.child_cache import CHILD_KINDS

    for kind in (*CHILD_KINDS, dtjob.KIND, "Event"):
        assert {permission("list", kind), permission("watch", kind)} <= set(PERMISSIONS)


def implicit_needs() -> set[Permission]:
    """What no call in our code spells out."""
    needs: set[Permission] = set()
    # Children point at their job with blockOwnerDeletion; with the OwnerReferencesPermissionEnforcement
    # admission plugin that needs update on the owner's finalizers.
    if owner_reference("j", "uid")["blockOwnerDeletion"]:
        needs.add((dtjob.API_GROUP, f"{dtjob.PLURAL}/finalizers", "update"))
    return needs


def used_permissions(enabled: set[str]) -> set[Permission]:
    used = table_calls() | implicit_needs()
    if LEADER_ELECTION_OFF in enabled:
        used -= RELEASE_NAMESPACE_ONLY
    used -= {p for p, off in UNLESS.items() if off in enabled}
    return {p for p in used if OPTIONAL.get(p) is None or OPTIONAL[p] in enabled}


def render(*sets: str) -> list[dict[str, Any]]:
    args = [tool("helm"), "template", RELEASE, str(CHART), "--namespace", RELEASE_NS]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def granted(docs: list[dict[str, Any]]) -> dict[Permission, set[str | None]]:
    """Permission -> namespaces where the operator's ServiceAccount has it (None: cluster-wide)."""
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs
             if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    result: dict[Permission, set[str | None]] = {}
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(s["kind"] == "ServiceAccount" and s["namespace"] == RELEASE_NS for s in subjects):
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], ref["name"], scope if ref["kind"] == "Role" else None)]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                        result.setdefault((group, resource, verb), set()).add(scope)
    return result


@pytest.mark.parametrize(
    ("sets", "namespaced"),
    [
        ((), False),
        (("watchNamespaces={ml-a,ml-b}",), True),
        (("networkPolicy.enabled=true",), False),
        (("watchNamespaces={ml-a}", "networkPolicy.enabled=true"), True),
        ((LEADER_ELECTION_OFF, "replicaCount=1"), False),
        (("watchNamespaces={ml-a}", LEADER_ELECTION_OFF, "replicaCount=1"), True),
        ((METRICS_PLAIN,), False),
    ],
)
def test_the_operator_is_granted_exactly_the_verbs_its_code_uses(
    sets: tuple[str, ...], namespaced: bool
) -> None:
    grants = granted(render(*sets))
    used = used_permissions(set(sets))
    assert set(grants) - used == set(), "granted but never used"
    assert used - set(grants) == set(), "used but not granted"
    namespaces = {"ml-a", "ml-b"} if "watchNamespaces={ml-a,ml-b}" in sets else {"ml-a"}
    electing = LEADER_ELECTION_OFF not in sets
    for granted_one, scopes in grants.items():
        resource = granted_one[1]
        if resource in CLUSTER_SCOPED or resource.split("/")[0] in CLUSTER_SCOPED:
            assert scopes == {None}
        elif granted_one in RELEASE_NAMESPACE_ONLY:
            assert scopes == {RELEASE_NS}, (resource, scopes)
        else:
            expected: set[str | None] = set(namespaces) if namespaced else {None}
            if electing and granted_one in ALSO_IN_RELEASE_NAMESPACE:
                expected = expected | {RELEASE_NS}
            assert scopes == expected, (resource, scopes)


def test_the_table_holds_the_calls_the_code_makes() -> None:
    """The table is not vacuous: it holds what the operator is known to do, and nothing it must never do;
    the scan for typed clients finds one where there is one."""
    used = table_calls()
    known = {
        ("", "pods", "create"), ("", "secrets", "get"), ("", "pods/log", "get"), ("batch", "jobs", "delete"),
        (dtjob.API_GROUP, f"{dtjob.PLURAL}/status", "patch"), *RELEASE_NAMESPACE_ONLY,
        ("", "pods", "patch"),  # Kueue's finalizer off an ended worker whose name the next world reuses
        ("scheduling.x-k8s.io", "podgroups", "create"), ("scheduling.volcano.sh", "podgroups", "delete"),
    }  # fmt: skip
    assert known <= used
    never = {("", "secrets", "list"), ("", "secrets", "watch"), ("", "pods", "update")}
    assert not never & used and ("batch", "jobs", "patch") not in used
    assert typed_clients(PACKAGE.parent / "dtjob" / "cli"), "the CLI's typed clients are found when scanned"


def test_user_roles_aggregate_into_admin_edit_and_view() -> None:
    docs = render()
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    edit, view = roles[f"{RELEASE}-edit"], roles[f"{RELEASE}-view"]
    edit_labels, view_labels = edit["metadata"]["labels"], view["metadata"]["labels"]
    assert edit_labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit_labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view_labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view_labels
    for role in (edit, view):
        assert {g for rule in role["rules"] for g in rule["apiGroups"]} == {dtjob.API_GROUP}
    edit_jobs = next(r for r in edit["rules"] if r["resources"] == [dtjob.PLURAL])
    assert {"create", "update", "patch", "delete"} <= set(edit_jobs["verbs"])
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    # Nobody is bound to them by the chart: cluster admins' aggregation does that.
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert not {f"{RELEASE}-edit", f"{RELEASE}-view"} & bound
    without = render("rbac.userRoles=false")
    assert not [d for d in without if d["metadata"]["name"].endswith(("-edit", "-view"))]
