"""What a job's pod templates may not hand its pods, refused from the spec alone and naming the field: the
operator's own ServiceAccount (in the operator's namespace) and the Secret holding the storage account key
the spec names. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from dtjob.config import load_config
from dtjob.spec.parse import parse_spec
from dtjob.spec.reader import SpecError
from dtjob.spec.template import secret_references

from tests.unit.operator_fixtures import CONFIG, job_body

OPERATOR = replace(CONFIG, operator_namespace="dtjob-system", operator_service_account="dtjob")
OUTPUT = {
    "account": "acct1",
    "container": "results",
    "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
}


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    return {"template": {"spec": spec}}


@pytest.mark.parametrize("part", ["worker", "launcher"])
def test_the_operators_service_account_is_refused_in_the_operators_namespace(part: str) -> None:
    body = job_body(namespace="dtjob-system")
    body["spec"][part] = _worker({"serviceAccountName": "dtjob"})
    with pytest.raises(SpecError) as err:
        parse_spec(body, OPERATOR)
    assert err.value.path == f"spec.{part}.template.spec.serviceAccountName"
    assert "operator's own ServiceAccount" in err.value.message


def test_another_service_account_or_another_namespace_is_left_to_rbac_and_pod_security() -> None:
    parse_spec(
        job_body(namespace="dtjob-system", worker=_worker({"serviceAccountName": "trainer"})), OPERATOR
    )
    parse_spec(job_body(namespace="ml", worker=_worker({"serviceAccountName": "dtjob"})), OPERATOR)


MOUNTS: list[tuple[dict[str, Any], str]] = [
    ({"volumes": [{"name": "k", "secret": {"secretName": "storage-key"}}]},
     "spec.worker.template.spec.volumes[0].secret.secretName"),
    ({"volumes": [{"name": "k", "projected": {"sources": [{"configMap": {"name": "c"}},
                                                          {"secret": {"name": "storage-key"}}]}}]},
     "spec.worker.template.spec.volumes[0].projected.sources[1].secret.name"),
    ({"containers": [{"name": "worker", "env": [
        {"name": "A", "value": "1"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "storage-key", "key": "k"}}}]}]},
     "spec.worker.template.spec.containers[0].env[1].valueFrom.secretKeyRef.name"),
    ({"initContainers": [{"name": "fetch", "image": "busybox",
                          "envFrom": [{"secretRef": {"name": "storage-key"}}]}]},
     "spec.worker.template.spec.initContainers[0].envFrom[0].secretRef.name"),
]  # fmt: skip


@pytest.mark.parametrize(("template", "field"), MOUNTS)
def test_the_account_key_secret_the_spec_names_never_enters_a_pod(
    template: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(job_body(output=OUTPUT, worker=_worker(template)), CONFIG)
    assert err.value.path == field
    assert "storage account key (spec.output.credentials.secretRef.name)" in err.value.message


def test_the_account_key_in_spec_env_is_refused() -> None:
    env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "storage-key", "key": "k"}}}]
    with pytest.raises(SpecError) as err:
        parse_spec(job_body(output=OUTPUT, env=env), CONFIG)
    assert err.value.path == "spec.env[0].valueFrom.secretKeyRef.name"


def test_other_secrets_are_listed_for_the_operators_read() -> None:
    template, _ = MOUNTS[0]
    parse_spec(job_body(worker=_worker(template)), CONFIG)  # no account key named: a read decides
    refs = [ref for t, _ in MOUNTS for ref in secret_references(t, "spec.worker.template.spec")]
    assert [name for _, name in refs] == ["storage-key"] * 4
    assert [field for field, _ in refs] == [field for _, field in MOUNTS]


def test_the_operator_learns_its_namespace_and_service_account_from_the_downward_api() -> None:
    config = load_config({"POD_NAMESPACE": "dtjob-system", "DTJOB_SERVICE_ACCOUNT": "dtjob"})
    assert (config.operator_namespace, config.operator_service_account) == ("dtjob-system", "dtjob")
    assert load_config({}).operator_service_account is None  # outside a pod: nothing to compare with
