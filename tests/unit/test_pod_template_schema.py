"""The CRD's pod template schema is what hack/gen_pod_template_schema.py renders from the committed snapshot
of Kubernetes' PodSpec, so it cannot drift, and it is a structural schema the API server accepts (the real
API server takes it in tests/integration/test_pod_templates.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hack import gen_pod_template_schema as gen

# kubectl's client-side apply keeps the whole object in an annotation, and annotations hold 256 KiB at most.
LAST_APPLIED_LIMIT = 262144


@pytest.fixture(scope="module")
def snapshot() -> dict[str, Any]:
    return gen.load_snapshot()


@pytest.fixture(scope="module")
def rendered(snapshot: dict[str, Any]) -> dict[str, Any]:
    return gen.render(snapshot["schemas"])


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(gen.CRD.read_text())
    return data


def template_of(crd: dict[str, Any], role: str) -> dict[str, Any]:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node: dict[str, Any] = spec["properties"][role]["properties"]["template"]
    return node


def nodes(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(schema, dict):
        return
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from nodes(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from nodes(schema[key], f"{path}[{key}]")


def test_the_committed_crd_is_what_the_snapshot_renders(snapshot: dict[str, Any]) -> None:
    text = gen.CRD.read_text()
    assert text == gen.expected_crd(text, snapshot), "run: python hack/gen_pod_template_schema.py write"
    assert gen.main(["check"]) == 0


def test_the_snapshot_is_the_pinned_kubernetes_release(snapshot: dict[str, Any]) -> None:
    versions = dict(
        line.split("=", 1) for line in (gen.REPO / "hack" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    assert snapshot["kubernetesVersion"] == versions["K8S_VERSION"]
    assert snapshot["root"] == gen.ROOT
    assert set(gen.reachable(snapshot["schemas"])) == set(snapshot["schemas"])


def test_both_templates_carry_the_rendered_pod_spec(
    crd: dict[str, Any], rendered: dict[str, Any], snapshot: dict[str, Any]
) -> None:
    """The launcher's is the same schema without the descriptions, which the worker's carries."""
    bare = gen.render(snapshot["schemas"], documented=False)
    for role, wanted in (("worker", rendered), ("launcher", bare)):
        spec = template_of(crd, role)["properties"]["spec"]
        assert {k: v for k, v in spec.items() if k != "description"} == wanted, role
    assert '"description"' in json.dumps(rendered) and '"description"' not in json.dumps(bare)
    metadata = [template_of(crd, role)["properties"]["metadata"] for role in ("launcher", "worker")]
    assert metadata[0] == metadata[1]
    containers = rendered["properties"]["containers"]
    assert containers["x-kubernetes-list-map-keys"] == ["name"]
    container = containers["items"]["properties"]
    assert {"env", "volumeMounts", "securityContext", "resources", "lifecycle"} <= set(container)
    for field in ("topologySpreadConstraints", "priorityClassName", "runtimeClassName", "hostIPC", "volumes"):
        assert field in rendered["properties"], field


def test_the_rendered_schema_is_structural(rendered: dict[str, Any]) -> None:
    text = json.dumps(rendered)
    for dropped in ('"$ref"', '"allOf"', '"default"', "x-kubernetes-patch", "x-kubernetes-unions"):
        assert dropped not in text, dropped
    seen = 0
    for path, node in nodes(rendered):
        seen += 1
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path}: no type"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node and node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("x-kubernetes-list-type") == "map":
            # A list-map's keys must be required (the schema has no defaults to fill them in).
            assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"].get("required", ())), path
    assert seen > 1000


def test_what_a_template_cannot_carry_is_left_out(rendered: dict[str, Any]) -> None:
    assert "ephemeralContainers" not in rendered["properties"]
    assert "containers" not in rendered.get("required", ())
    ports = rendered["properties"]["containers"]["items"]["properties"]["ports"]
    assert ports["x-kubernetes-list-type"] == "atomic"  # keyed by protocol, which only a default fills in
    claim = rendered["properties"]["volumes"]["items"]["properties"]["ephemeral"]["properties"]
    meta = claim["volumeClaimTemplate"]["properties"]["metadata"]
    assert set(meta["properties"]) == {"labels", "annotations"}


def test_enums_are_kept_and_an_optional_one_takes_empty(rendered: dict[str, Any]) -> None:
    container = rendered["properties"]["containers"]["items"]["properties"]
    assert container["imagePullPolicy"]["enum"] == ["", "Always", "IfNotPresent", "Never"]
    toleration = rendered["properties"]["tolerations"]["items"]["properties"]
    assert toleration["effect"]["enum"] == ["", "NoExecute", "NoSchedule", "PreferNoSchedule"]
    spread = rendered["properties"]["topologySpreadConstraints"]["items"]
    assert "whenUnsatisfiable" in spread["required"]
    assert spread["properties"]["whenUnsatisfiable"]["enum"] == ["DoNotSchedule", "ScheduleAnyway"]


def test_the_crd_fits_client_side_apply(crd: dict[str, Any]) -> None:
    size = len(json.dumps(crd, separators=(",", ":")))
    assert size < LAST_APPLIED_LIMIT * 0.8, size


def test_every_region_is_rendered_with_anchors_of_its_own(snapshot: dict[str, Any]) -> None:
    """Two copies of the schema in one document: an anchor's name may be defined once, so the second
    region's are renamed, and YAML still reads both copies whole."""
    text = gen.CRD.read_text()
    assert text.count(gen.BEGIN) == 2 and text.count(gen.END) == 2
    anchors = re.findall(r"(?<=\s)&([A-Za-z][\w-]*)(?=\s)", text)  # YAML anchors, not CEL's &&
    assert len(anchors) == len(set(anchors)), "an anchor defined twice"
    assert any(a.startswith("r2-id") for a in anchors) and any(a.startswith("id") for a in anchors)
    with pytest.raises(ValueError, match="END"):
        gen.splice(text.replace(gen.END, "# the end", 1), snapshot["schemas"])


def test_first_sentences() -> None:
    assert gen.first_sentence("Host networking requested for this pod. Use the host's network.") == (
        "Host networking requested for this pod."
    )
    assert gen.first_sentence("Rules (e.g. co-locate this pod). More.") == "Rules (e.g. co-locate this pod)."
    assert gen.first_sentence("x " * 200).endswith("...")
