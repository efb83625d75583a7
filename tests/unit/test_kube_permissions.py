"""The client makes only the calls its permission table declares (dtjob.kube.permissions): a call outside it
is refused before anything is sent, so the table is all the chart's RBAC has to grant."""

from __future__ import annotations

import pytest
from dtjob import API_GROUP, KIND, PLURAL
from dtjob.kube.permissions import PERMISSIONS
from dtjob.kube.rest import api_call, permission

from tests.unit.recording_kube import unused_api


def test_a_call_outside_the_table_is_refused_before_it_is_sent() -> None:
    api = unused_api()  # nothing listens there
    for verb, kind in (("list", "Secret"), ("watch", "Secret"), ("update", "Pod"), ("patch", "Job")):
        assert permission(verb, kind) not in PERMISSIONS
        with pytest.raises(ValueError, match=r"not among dtjob\.kube\.permissions\.PERMISSIONS"):
            api_call(api, verb, kind, "ml", "x")


def test_permissions_are_named_as_rbac_names_them() -> None:
    assert permission("get", "Pod/log") == ("", "pods/log", "get")
    assert permission("patch", f"{KIND}/status") == (API_GROUP, f"{PLURAL}/status", "patch")
    assert permission("delete", "PodGroup", "scheduling.volcano.sh/v1beta1") == (
        "scheduling.volcano.sh", "podgroups", "delete"
    )  # fmt: skip
    with pytest.raises(ValueError, match="name its apiVersion"):
        permission("get", "PodGroup")  # two gang schedulers serve one
    with pytest.raises(ValueError, match=r"not among dtjob\.kube\.rest\.RESOURCES"):
        permission("get", "Pod", "v2")
