"""Copies of a CRD under another API group, with parts of its schema taken out, for bench.crd_create_cost.

Pure functions on the CRD as a dict: each returns a new CRD and leaves its argument alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

Crd = dict[str, Any]
Schema = dict[str, Any]
RULES = "x-kubernetes-validations"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
POD_TEMPLATES = ("worker", "launcher")  # spec.<role>.template: a PodTemplateSpec


def regroup(crd: Crd, group: str) -> Crd:
    """The CRD under `group`: its group and its name change, nothing else (kind and plural stay)."""
    out = copy.deepcopy(crd)
    out["spec"]["group"] = group
    out["metadata"] = {"name": f"{out['spec']['names']['plural']}.{group}"}
    return out


def with_schemas(crd: Crd, change: Callable[[Schema], Schema]) -> Crd:
    """The CRD with every version's openAPIV3Schema replaced by change(a copy of it)."""
    out = copy.deepcopy(crd)
    for version in out["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"] = change(version["schema"]["openAPIV3Schema"])
    return out


def count_rules(schema: Any) -> tuple[int, int]:
    """(x-kubernetes-validations blocks, rules in them) anywhere in a schema."""
    blocks = rules = 0
    if isinstance(schema, dict):
        if RULES in schema:
            blocks, rules = 1, len(schema[RULES])
        children: Any = schema.values()
    elif isinstance(schema, list):
        children = schema
    else:
        return 0, 0
    for child in children:
        b, r = count_rules(child)
        blocks, rules = blocks + b, rules + r
    return blocks, rules


def without_rules(schema: Any, keep: Callable[[str], bool] = lambda rule: False) -> Any:
    """The schema with every CEL rule that keep() refuses removed, and any block left empty."""
    if isinstance(schema, list):
        return [without_rules(item, keep) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: without_rules(value, keep) for key, value in schema.items() if key != RULES}
    kept = [rule for rule in schema.get(RULES, []) if keep(rule["rule"])]
    if kept:
        out[RULES] = kept
    return out


def opaque() -> Schema:
    """An object the API server keeps as sent: no fields declared, none pruned, none validated."""
    return {"type": "object", PRESERVE: True}


def without_pod_templates(schema: Schema) -> Schema:
    """spec.worker.template and spec.launcher.template as opaque objects instead of the PodTemplateSpec
    schema. CEL reads no field that no schema declares, so the rules on the templates and any rule that
    reads a template (spec's gang rule reads their schedulerName) go with them: else the CRD is refused."""
    out = copy.deepcopy(schema)
    spec = out["properties"]["spec"]
    for role in POD_TEMPLATES:
        spec["properties"][role]["properties"]["template"] = opaque()
    stripped: Schema = without_rules(out, keep=lambda rule: ".template" not in rule)
    return stripped


def minimal(schema: Schema) -> Schema:
    """spec and status as opaque objects: only the object's metadata is checked."""
    return {"type": "object", "properties": {"spec": opaque(), "status": opaque()}}


VARIANTS: dict[str, Callable[[Schema], Schema]] = {
    "real": lambda schema: copy.deepcopy(schema),
    "no-cel": without_rules,
    "no-podspec": without_pod_templates,
    "no-cel-no-podspec": lambda schema: without_rules(without_pod_templates(schema)),
    "minimal": minimal,
}


def variant(crd: Crd, name: str, group: str) -> Crd:
    """The CRD as variant `name` (a key of VARIANTS), under `group`."""
    return regroup(with_schemas(crd, VARIANTS[name]), group)
