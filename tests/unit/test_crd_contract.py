"""One source per contract: the CRD's schema and the operator's parser agree on every bound of the spec.

Each probe sets one field of a full, valid job on or beyond one of its bounds (tests/crd_contract.py). Here
the schema's keywords judge it (minimum, maximum, enum, pattern, lengths); the real API server, which also
runs the CEL rules, judges the same probes in tests/integration/test_crd_contract_api.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from dtjob import desired
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.spec import validators
from dtjob.spec.parse import SpecError, parse_spec

from tests.crd_contract import BASES, Probe, job, probes, spec_schema

CONFIG = OperatorConfig()


def parser_accepts(probe: Probe) -> tuple[bool, str]:
    try:
        parse_spec(job(probe.body), CONFIG)
    except SpecError as err:
        return False, str(err)
    return True, ""


@pytest.fixture(scope="module")
def all_probes() -> list[Probe]:
    return list(probes())


def test_the_bases_are_valid_jobs() -> None:
    for base in BASES:
        parse_spec(job(base), CONFIG)


def test_every_bound_of_the_schema_is_the_parsers(all_probes: list[Probe]) -> None:
    assert len(all_probes) > 1000
    fields = {p.field for p in all_probes}
    assert len(fields) > 60, sorted(fields)
    wrong: list[str] = []
    for probe in all_probes:
        accepted, why = parser_accepts(probe)
        if not probe.keywords_ok and accepted:
            wrong.append(f"{probe.name}: the schema refuses it, the parser accepts it")
        if probe.keywords_ok and not probe.cel and not accepted:
            wrong.append(f"{probe.name}: the schema accepts it, the parser refuses it ({why})")
    assert not wrong, "\n".join(wrong)


def test_probes_reach_every_kind_of_bound(all_probes: list[Probe]) -> None:
    # A walk that silently skipped a branch of the schema would compare nothing there.
    fields = {p.field for p in all_probes}
    for expected in (
        "spec.workers", "spec.image", "spec.env[0].name", "spec.worker.podLabels.k", "spec.worker.podLabels",
        "spec.dataset.volume.mountPath", "spec.dataset.volume.nfs.server", "spec.checkpoints.nfs.readOnly",
        "spec.dataset.volume.persistentVolumeClaim.claimName", "spec.dataset.stageFrom.prefix",
        "spec.output.prefix", "spec.hyperparameters.labelSmoothing", "spec.hyperparameters.seed",
        "spec.placement.nodePool", "spec.placement.tolerations[0].key", "spec.placement.tolerations",
        "spec.placement.launcher.tolerations[0].tolerationSeconds", "spec.runPolicy.activeDeadlineSeconds",
        "spec.runPolicy.scheduling.queueName", "spec.imagePullSecrets[0].name",
        "spec.runPolicy.scheduling.gang.scheduler", "spec.runPolicy.scheduling.gang.queue",
        "spec.runPolicy.scheduling.gang.scheduleTimeoutSeconds",
    ):  # fmt: skip
        assert expected in fields


def _node(path: str) -> dict[str, Any]:
    node: Any = spec_schema()
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    assert isinstance(node, dict)
    return node


@pytest.mark.parametrize(
    ("path", "pattern"),
    [
        ("image", validators.IMAGE),
        ("env.[].name", validators.ENV_NAME),
        ("imagePullSecrets.[].name", validators.DNS_SUBDOMAIN),
        ("dataset.dataDir", validators.ABSOLUTE_PATH),
        ("dataset.volume.mountPath", validators.ABSOLUTE_PATH),
        ("checkpoints.mountPath", validators.ABSOLUTE_PATH),
        ("dataset.volume.nfs.server", validators.NFS_SERVER),
        ("dataset.volume.nfs.path", validators.NFS_PATH),
        ("checkpoints.persistentVolumeClaim.claimName", validators.DNS_SUBDOMAIN),
        ("dataset.stageFrom.destination", validators.DESTINATION),
        ("dataset.stageFrom.prefix", validators.BLOB_PREFIX),
        ("output.prefix", validators.BLOB_PREFIX),
        ("placement.nodePool", validators.NODE_POOL),
        ("placement.launcher.nodePool", validators.NODE_POOL),
        ("placement.tolerations.[].key", validators.TOLERATION_KEY),
        ("placement.tolerations.[].value", validators.LABEL_VALUE),
        ("runPolicy.scheduling.queueName", validators.DNS_LABEL),
        ("runPolicy.scheduling.schedulerName", validators.DNS_SUBDOMAIN),
        ("runPolicy.scheduling.gang.queue", validators.DNS_SUBDOMAIN),
    ],
)
def test_schema_patterns_are_the_validators_own(path: str, pattern: str) -> None:
    assert _node(path)["pattern"] == pattern


def test_patterns_are_re2() -> None:
    for name in dir(validators):
        value = getattr(validators, name)
        if name.isupper() and isinstance(value, str) and value.startswith("^"):
            assert not re.search(r"\(\?[=!<]|\\[1-9]", value), f"{name}: lookaround or backreference"


@pytest.mark.parametrize("path", ["worker.podLabels", "launcher.podAnnotations", "placement.nodeSelector",
                                  "dataset.stageFrom.podAnnotations"])  # fmt: skip
def test_map_keys_are_checked_with_the_validators_pattern(path: str) -> None:
    rule = _node(path)["x-kubernetes-validations"][0]["rule"]
    assert f"'{validators.QUALIFIED_NAME}'" in rule and f"'{validators.QUALIFIED_PREFIX}'" in rule
    assert _node(path)["maxProperties"] == validators.MAX_MAP_ENTRIES


def test_reserved_mount_paths_in_the_schema_are_the_operators() -> None:
    for path in ("dataset.volume.mountPath", "checkpoints.mountPath"):
        rule = _node(path)["x-kubernetes-validations"][0]["rule"]
        listed = re.findall(r"'(/[^']*)'", rule.split("].exists")[0])
        assert tuple(listed) == validators.RESERVED_MOUNT_PATHS


def test_every_mount_the_operator_makes_is_reserved() -> None:
    # Find them in what desired/ builds (worker 0 holds rank 0's extras), not in a hand-kept list.
    spec = parse_spec(job(BASES[0]), CONFIG)
    owner = owner_reference(spec.name, "uid-1")
    pods = [
        desired.worker_pod(spec, owner, 0, 0)["spec"],
        desired.launcher_pod(spec, owner, 0)["spec"],
        desired.staging_job(spec, owner, "stager:1")["spec"]["template"]["spec"],
    ]
    user = {spec.dataset.volume.mount_path if spec.dataset.volume else "", "/checkpoints"}
    mounts = {m["mountPath"] for pod in pods for c in pod["containers"] for m in c.get("volumeMounts", [])}
    own = mounts - user
    assert len(own) >= 5, own
    for path in own:
        assert any(path == r or path.startswith(r + "/") for r in validators.RESERVED_MOUNT_PATHS), path
