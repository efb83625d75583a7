"""bench.crd_variants' copies of a CRD, and bench.apiserver_profile's reading of pprof's traces."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from bench.apiserver_profile import by_part, seconds, traces
from bench.crd_variants import PRESERVE, RULES, count_rules, variant
from testbed.operator_harness import CRD_FILE


def rule(text: str) -> dict[str, str]:
    return {"rule": text, "message": "no"}


def template() -> dict[str, Any]:
    return {
        "type": "object",
        RULES: [rule("!has(self.spec) || !has(self.spec.hostname)")],
        "properties": {"spec": {"type": "object", "properties": {"hostname": {"type": "string"}}}},
    }


def tiny_crd() -> dict[str, Any]:
    spec = {
        "type": "object",
        RULES: [rule("self.workers > 0"), rule("!has(self.worker.template.spec.hostname)")],
        "properties": {
            "workers": {"type": "integer"},
            "worker": {"type": "object", "properties": {"template": template()}},
            "launcher": {"type": "object", "properties": {"template": template()}},
        },
    }
    schema = {"type": "object", "properties": {"spec": spec, "status": {"type": "object"}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "jobs.dtjob.io", "labels": {"a": "b"}},
        "spec": {"group": "dtjob.io", "names": {"plural": "jobs", "kind": "Job"},
                 "versions": [{"name": "v1", "schema": {"openAPIV3Schema": schema}}]},
    }  # fmt: skip


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return found


def test_a_variant_renames_group_and_name_only_and_leaves_its_argument_alone() -> None:
    crd = tiny_crd()
    before = copy.deepcopy(crd)
    real = variant(crd, "real", "real.bench.dtjob.io")
    assert crd == before
    assert real["metadata"] == {"name": "jobs.real.bench.dtjob.io"}
    assert real["spec"]["group"] == "real.bench.dtjob.io"
    assert real["spec"]["names"] == crd["spec"]["names"]
    assert schema_of(real) == schema_of(crd)
    assert count_rules(schema_of(real)) == (3, 4)


def test_no_cel_removes_every_rule_and_nothing_else() -> None:
    stripped = schema_of(variant(tiny_crd(), "no-cel", "g"))
    assert count_rules(stripped) == (0, 0)
    spec = stripped["properties"]["spec"]
    assert spec["properties"]["worker"]["properties"]["template"]["properties"]["spec"]["type"] == "object"


def test_no_podspec_makes_the_templates_opaque_and_drops_the_rules_that_read_them() -> None:
    spec = schema_of(variant(tiny_crd(), "no-podspec", "g"))["properties"]["spec"]
    for role in ("worker", "launcher"):
        assert spec["properties"][role]["properties"]["template"] == {"type": "object", PRESERVE: True}
    assert spec[RULES] == [rule("self.workers > 0")]


def test_minimal_keeps_spec_and_status_as_sent() -> None:
    schema = schema_of(variant(tiny_crd(), "minimal", "g"))
    assert schema["properties"] == {"spec": {"type": "object", PRESERVE: True},
                                    "status": {"type": "object", PRESERVE: True}}  # fmt: skip


def test_the_real_crd_s_variants_shed_what_they_say() -> None:
    real = yaml.safe_load(CRD_FILE.read_text())
    rules = {name: count_rules(schema_of(variant(real, name, "g")))[1]
             for name in ("real", "no-cel", "no-podspec", "no-cel-no-podspec", "minimal")}  # fmt: skip
    assert rules["real"] > rules["no-podspec"] > 0
    assert rules["no-cel"] == rules["no-cel-no-podspec"] == rules["minimal"] == 0


TRACES = """File: kube-apiserver
Type: cpu
-----------+-------------------------------------------------------
      10ms   k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model.(*Structural).Properties
             github.com/google/cel-go/interpreter.evalAnd.Eval
             k8s.io/apiextensions-apiserver/pkg/registry/customresource.customResourceStrategy.Validate
             k8s.io/apiserver/pkg/storage/etcd3.(*store).Create
-----------+-------------------------------------------------------
     1.20s   runtime.futex
-----------+-------------------------------------------------------
"""


def test_pprof_traces_are_summed_per_part_of_the_create_path() -> None:
    assert seconds("10ms") == pytest.approx(0.01)
    assert seconds("1.20s") == pytest.approx(1.2)
    stacks = traces(TRACES)
    assert [value for value, _ in stacks] == pytest.approx([0.01, 1.2])
    assert stacks[0][1][1] == "github.com/google/cel-go/interpreter.evalAnd.Eval"
    parts = by_part(stacks)
    assert parts["total"] == pytest.approx(1.21)
    assert parts["CEL"] == parts["CEL field lookup"] == parts["validate"] == pytest.approx(0.01)
    assert parts["etcd"] == pytest.approx(0.01)
    assert parts["OpenAPI schema"] == parts["managed fields"] == 0
