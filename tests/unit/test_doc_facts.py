"""The docs' facts that can be read from the code, checked against it: the CLI's commands, the CRD's enums and
bounds, the images, the CRD's size, defaults the README and the CRD reference quote, and every relative link
between the Markdown files (a file that moved, or a heading that was renamed, fails here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtjob.cli.main import build_parser
from dtjob.spec.storage import DEFAULT_UPLOAD_RETRY_SECONDS

from tests.unit.cli_parsers import subparsers

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "dtjob.io_distributedtrainingjobs.yaml"
README = (REPO / "README.md").read_text()
REFERENCE = (REPO / "operator" / "README.md").read_text()
KUBECTL_CLIENT_SIDE_LIMIT = 262144  # bytes of the last-applied-configuration annotation
IMAGES = ("operator", "stager", "horovod-pytorch", "horovod-tensorflow", "mpi")


def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def docs() -> list[Path]:
    skip = {"out", ".git", "node_modules"}
    return [p for p in REPO.rglob("*.md") if not skip & set(p.relative_to(REPO).parts)]


def test_every_cli_command_is_in_the_docs() -> None:
    text = README + "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    names: dict[int, list[str]] = {}  # an alias shares its command's parser
    for name, sub in subparsers(build_parser()):
        if " " not in name:
            names.setdefault(id(sub), []).append(name)
    missing = [n for n in names.values() if not any(f"dtjob {name}" in text for name in n)]
    assert not missing, f"commands the docs never show: {missing}"


def test_the_readme_job_names_every_framework_and_the_gpu_bounds() -> None:
    fields = spec_schema()["properties"]
    frameworks = fields["framework"]["enum"]
    comment = next(line for line in README.splitlines() if line.strip().startswith("framework:"))
    assert all(f in comment for f in frameworks), (frameworks, comment)
    gpus = fields["gpusPerWorker"]
    bounds = f"{gpus['minimum']}..{gpus['maximum']}"
    bad_input = (REPO / "docs" / "bad-input.md").read_text()
    assert f"`gpusPerWorker` outside {bounds}" in bad_input, bounds


def test_the_five_images_are_named_alike_everywhere() -> None:
    script = (REPO / "hack" / "build-images.sh").read_text()
    for name in IMAGES:
        assert name in script, name
        assert f"dtjob/{name}:" in (REPO / "images" / "README.md").read_text(), name
    values = yaml.safe_load((REPO / "charts" / "dtjob" / "values.yaml").read_text())
    chart = {values["image"]["repository"], values["stagerImage"], *values["trainingImages"].values()}
    assert {ref.rsplit("/", 1)[-1] for ref in chart} <= set(IMAGES), chart
    assert all(ref.rsplit("/", 2)[-2] == "dtjob" for ref in chart), (
        "the chart expects <registry>/dtjob/<name>"
    )


def test_the_crd_fits_kubectls_client_side_apply_and_the_docs_say_its_size() -> None:
    # kubectl's client-side apply keeps the object as compact JSON in an annotation: that is what is limited.
    size = len(json.dumps(yaml.safe_load(CRD.read_text()), separators=(",", ":")))
    assert size < KUBECTL_CLIENT_SIDE_LIMIT, size
    said = re.search(r"about (\d+) KB", REFERENCE)
    assert said is not None, "operator/README.md states the CRD's size"
    assert abs(int(said.group(1)) * 1000 - size) <= 10_000, f"the CRD is {size} bytes, the docs say {said[0]}"


def test_defaults_the_reference_quotes_are_the_codes() -> None:
    row = next(line for line in REFERENCE.splitlines() if line.startswith("| `output.uploadRetrySeconds`"))
    assert f"| {DEFAULT_UPLOAD_RETRY_SECONDS} |" in row, row
    upload = spec_schema()["properties"]["output"]["properties"]["uploadRetrySeconds"]
    assert str(DEFAULT_UPLOAD_RETRY_SECONDS) in upload.get("description", ""), upload


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.*)$", text)}


@pytest.mark.parametrize("path", docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, broken
