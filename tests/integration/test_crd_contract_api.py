"""One source per contract, judged by the real API server: every probe of tests/crd_contract.py (each bound of
each field of the spec, on and beyond it) is created with dryRun against the installed CRD, whose schema and
CEL rules run for real, and the operator's parser must say the same. Where the API server refuses, its
message must name the field. The one exception: Kueue's keys on a job's pods, refused at apply and accepted by
the parser, which drops them, so that a job stored before that rule keeps running."""

from __future__ import annotations

import json

import pytest
from dtjob.config import OperatorConfig
from dtjob.spec import validators
from dtjob.spec.parse import SpecError, parse_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.operator_harness import GROUP, PLURAL, VERSION, install_crd
from tests.crd_contract import Probe, job, probes, refused_at_apply_only

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
    checked, disagreements, unnamed, apply_only = 0, [], [], set()
    for probe in probes():
        api_ok, api_message = api_verdict(custom, namespace, probe)
        parser_ok, parser_message = parser_verdict(probe)
        checked += 1
        if refused_at_apply_only(probe) and parser_ok:
            apply_only.add(probe.field)
            if api_ok or validators.KUEUE_KEY_WHY not in " ".join(api_message.split()):
                disagreements.append(f"{probe.name}: the API server should refuse it, said: {api_message}")
        elif api_ok != parser_ok:
            said = f"API: {api_message or 'accepted'} | parser: {parser_message or 'accepted'}"
            disagreements.append(f"{probe.name}: {said}")
        elif not api_ok and str(probe.path[-1]) not in api_message:
            unnamed.append(f"{probe.name}: {api_message}")
    assert checked > 1000
    maps = ("podLabels", "podAnnotations", "template.metadata.labels", "template.metadata.annotations")
    pods = {f"spec.{role}.{field}" for role in ("worker", "launcher") for field in maps}
    assert apply_only == pods, sorted(apply_only)
    assert not disagreements, "\n".join(disagreements)
    assert not unnamed, "refusals that do not name the field:\n" + "\n".join(unnamed)
