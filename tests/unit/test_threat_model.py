"""docs/threat-model.md is held to the code: every row of its inputs table names at least one test, and each
test it names exists; every spec field of the CRD and every label or annotation key the operator knows (a
tenant may set any of them on what it creates) is named on the page. A new field or label the operator reads
without its row and its test fails here."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import dtjob
import yaml

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "threat-model.md"
CRD = REPO / "crds" / "dtjob.io_distributedtrainingjobs.yaml"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
# A label or annotation key of the groups the operator reads and writes (API versions are not keys).
KEY = re.compile(r"^(dtjob\.io|volcano\.sh|([\w-]+\.)*(x-k8s|k8s|kubernetes)\.io)/(?!v\d)[\w.-]+$")
# Keys the operator knows and never reads: no input, so no row.
NOT_READ = {
    "service.kubernetes.io/headless": "written on the job's own Service",
    "kubectl.kubernetes.io/default-container": "written on its pods for kubectl (a template's value kept)",
    "kubectl.kubernetes.io/last-applied-configuration": "dropped from the operator's copies of jobs",
}


def inputs_table() -> list[list[str]]:
    """The rows of the table under "## Inputs a tenant controls", as cells."""
    section = DOC.read_text().split("## Inputs a tenant controls", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def test_every_row_names_a_test_that_exists() -> None:
    rows = inputs_table()
    assert len(rows) >= 20, "the inputs table was not found whole"
    for row in rows:
        refs = TEST_REF.findall(row[-1])
        assert refs, f"row {row[0]!r} names no test (`tests/...py::test_name`)"
        for path, name in refs:
            source = REPO / path
            assert source.is_file(), f"row {row[0]!r}: {path} does not exist"
            assert re.search(rf"^(async )?def {name}\(", source.read_text(), re.M), (
                f"row {row[0]!r}: {path} has no test {name}"
            )


def test_every_spec_field_is_named() -> None:
    doc = DOC.read_text()
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = sorted(schema["properties"]["spec"]["properties"])
    missing = [f for f in fields if not re.search(rf"`spec\.{f}[`.\[]", doc)]
    assert not missing, f"spec fields without a row in {DOC.name}: {missing}"


def known_keys() -> set[str]:
    """Every label or annotation key held in a module-level constant of the operator's package."""
    keys: set[str] = set()
    for module in pkgutil.walk_packages(dtjob.__path__, "dtjob."):
        if module.name.endswith(".__main__"):  # a program: importing it runs it
            continue
        loaded = importlib.import_module(module.name)
        keys |= {v for v in vars(loaded).values() if isinstance(v, str) and KEY.match(v)}
    return keys


def test_every_label_and_annotation_key_the_operator_knows_is_named() -> None:
    doc = DOC.read_text()
    keys = known_keys()
    assert "kueue.x-k8s.io/prebuilt-workload-name" in keys and "dtjob.io/job-name" in keys
    assert "kubernetes.io/service-name" in keys and set(NOT_READ) <= keys
    missing = sorted(k for k in keys - set(NOT_READ) if f"`{k}`" not in doc)
    assert not missing, f"label or annotation keys without a mention in {DOC.name}: {missing}"
