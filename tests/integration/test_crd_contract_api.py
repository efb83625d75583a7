"""One source per contract, judged by the real API server: every probe of tests/crd_contract.py (each bound of
each field of the spec, on and beyond it) is created with dryRun against the installed CRD, whose schema and
CEL rules run for real, and the operator's parser must say the same. Where the API server refuses, its
message must name the field."""

from __future__ import annotations

import json

import pytest
from dtjob.config import OperatorConfig
from dtjob.spec.parse import SpecError, parse_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.operator_harness import GROUP, PLURAL, VERSION, install_crd
from tests.crd_contract import Probe, job, probes

pytestmark = pytest.mark.integration


def api_verdict(custom: client.CustomObjectsApi, namespace: str, probe: Probe) -> tuple[bool, str]:
    body = job(probe.body, name="probe", namespace=namespace)
    del body["metadata"]["uid"], body["metadata"]["generation"]
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")
    except ApiException as err:
        if err.status != 422:
            raise
        return False, str(json.loads(err.body or "{}").get("message", ""))
    return True, ""


def parser_verdict(probe: Probe) -> tuple[bool, str]:
    try:
        parse_spec(job(probe.body), OperatorConfig())
    except SpecError as err:
        return False, str(err)
    return True, ""


def test_the_api_server_and_the_parser_agree_on_every_probe(
    api_client: client.ApiClient, kubeconfig: str, namespace: str
) -> None:
    install_crd(kubeconfig)
    custom = client.CustomObjectsApi(api_client)
    checked, disagreements, unnamed = 0, [], []
    for probe in probes():
        api_ok, api_message = api_verdict(custom, namespace, probe)
        parser_ok, parser_message = parser_verdict(probe)
        checked += 1
        if api_ok != parser_ok:
            said = f"API: {api_message or 'accepted'} | parser: {parser_message or 'accepted'}"
            disagreements.append(f"{probe.name}: {said}")
        elif not api_ok and str(probe.path[-1]) not in api_message:
            unnamed.append(f"{probe.name}: {api_message}")
    assert checked > 1000
    assert not disagreements, "\n".join(disagreements)
    assert not unnamed, "refusals that do not name the field:\n" + "\n".join(unnamed)
