"""Every property of the CRD's schema carries a description, so `kubectl explain dtj.<field>` documents it.

The walk covers the whole openAPIV3Schema: properties, items, additionalProperties and the branches of
anyOf, oneOf and allOf. Two parts are left to Kubernetes:
- the PodSpec under each pod template's `spec`, which hack/gen_pod_template_schema.py renders from Kubernetes'
  OpenAPI document with the first sentence of the descriptions of the types users set most (all of them would
  take the CRD past the 256 KiB kubectl's client-side apply allows; `kubectl explain pod.spec` has them), and
  in the launcher's template with none (the worker's documents the same fields). That
  part must be exactly what the generator renders, so leaving it out hides no hand-written field;
- the object's `metadata`: the API server refuses a CRD whose schema says more of it than its type (and
  restrictions of name and generateName), a description included, and kubectl explain shows ObjectMeta's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import gen_pod_template_schema as gen

CRD = Path(__file__).resolve().parents[2] / "crds" / "dtjob.io_distributedtrainingjobs.yaml"
# The generated PodSpec: documented as a whole (its own description), its fields by Kubernetes.
GENERATED = ("spec.worker.template.spec", "spec.launcher.template.spec")
BRANCHES = ("anyOf", "oneOf", "allOf")
METADATA = "metadata"


def undocumented(schema: Any, path: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """The path of every property under `schema` without a non-empty description: `a.b` for a property,
    `a[*]` for a list's items, `a{*}` for a map's values, `a<anyOf[0]>` for a branch. Below a path in `skip`
    nothing is looked at (the path itself is)."""
    if not isinstance(schema, dict) or path in skip:
        return []
    found: list[str] = []
    for name, child in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        text = child.get("description") if isinstance(child, dict) else None
        if not isinstance(text, str) or not text.strip():
            found.append(where)
        found += undocumented(child, where, skip)
    if isinstance(schema.get("items"), dict):
        found += undocumented(schema["items"], f"{path}[*]", skip)
    if isinstance(schema.get("additionalProperties"), dict):
        found += undocumented(schema["additionalProperties"], f"{path}{{*}}", skip)
    for key in BRANCHES:
        for i, branch in enumerate(schema.get(key) or ()):
            found += undocumented(branch, f"{path}<{key}[{i}]>", skip)
    return found


def node_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for name in path.split("."):
        node = node["properties"][name]
    return node


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions] == ["v1alpha1"]
    root: dict[str, Any] = versions[0]["schema"]["openAPIV3Schema"]
    return root


def test_every_property_has_a_description(schema: dict[str, Any]) -> None:
    missing = [path for path in undocumented(schema, skip=GENERATED) if path != METADATA]
    assert not missing, f"{len(missing)} properties without a description:\n" + "\n".join(missing)


def test_what_is_left_to_kubernetes_is_the_generated_pod_spec_and_metadata(schema: dict[str, Any]) -> None:
    assert schema["properties"][METADATA] == {"type": "object"}
    schemas = gen.load_snapshot()["schemas"]
    # The launcher's copy keeps no description: the worker's documents the same fields.
    for path, documented in zip(GENERATED, (True, False), strict=True):
        node = node_at(schema, path)
        assert "kubectl explain pod.spec" in node["description"], path
        assert {k: v for k, v in node.items() if k != "description"} == gen.render(schemas, documented), path
    # Kubernetes' own first sentences of the fields users set most are kept.
    rendered = gen.render(schemas)
    container = rendered["properties"]["containers"]["items"]["properties"]
    assert container["image"]["description"] and rendered["properties"]["volumes"]["description"]


def test_the_walk_names_every_kind_of_gap() -> None:
    documented = {"type": "string", "description": "x"}
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "array", "description": "x", "items": {"properties": {"c": {"type": "string"}}}},
            "d": {"description": "x", "additionalProperties": {"properties": {"e": {"description": " "}}}},
            "f": {"description": "x", "anyOf": [{"properties": {"g": {}}}], "oneOf": [{"properties": {}}]},
            "h": {"description": "x", "allOf": [{"properties": {"i": documented, "j": {"type": "x"}}}]},
            "k": {"description": "x", "properties": {"l": {"type": "string"}}},
        },
    }
    assert undocumented(schema) == ["a", "b[*].c", "d{*}.e", "f<anyOf[0]>.g", "h<allOf[0]>.j", "k.l"]
    assert undocumented(schema, skip=("k",)) == ["a", "b[*].c", "d{*}.e", "f<anyOf[0]>.g", "h<allOf[0]>.j"]
