"""A job as the caller hands it to Client.create: a manifest or just its spec (a dict), YAML text or a YAML
file. Read into the manifest to send, and checked by the operator's own spec parser first, so that input the
operator would refuse raises InvalidJob naming the field and nothing is sent. Pure."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dtjob import API_GROUP, API_VERSION, KIND
from dtjob.client.errors import InvalidJob
from dtjob.config import OperatorConfig
from dtjob.spec.parse import JobSpec, SpecError, parse_spec

JobInput = Mapping[str, Any] | str | Path
API_VERSION_TEXT = f"{API_GROUP}/{API_VERSION}"


def read_input(job: JobInput) -> dict[str, Any]:
    """The dict `job` stands for: itself, the YAML text, or the YAML file's one document."""
    if isinstance(job, Mapping):
        return copy.deepcopy(dict(job))
    if isinstance(job, Path) or ("\n" not in job and job.endswith((".yaml", ".yml", ".json"))):
        try:
            text = Path(job).read_text()
        except OSError as err:
            raise InvalidJob(str(job), f"cannot read it: {err.strerror or err}") from None
    else:
        text = job
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise InvalidJob("the job's YAML", " ".join(str(err).split())) from None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise InvalidJob("the job's YAML", f"must hold one object, got {len(documents)} document(s)")
    return documents[0]


def manifest(job: JobInput, name: str | None = None, namespace: str = "default") -> dict[str, Any]:
    """The DistributedTrainingJob to create: a whole manifest as given (`name` replacing its name), or a
    spec (a dict without `spec`) wrapped into one named `name`. Its namespace is the client's."""
    data = read_input(job)
    if "spec" not in data:
        data = {"spec": data}
    kind, version = data.setdefault("kind", KIND), data.setdefault("apiVersion", API_VERSION_TEXT)
    if kind != KIND or version != API_VERSION_TEXT:
        raise InvalidJob("kind", f"must be {KIND} of {API_VERSION_TEXT}, got {kind} of {version}")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidJob("metadata", f"must be an object, got {type(metadata).__name__}")
    if name is not None:
        metadata["name"] = name
    if not metadata.get("name"):
        raise InvalidJob("metadata.name", "is required: pass name=, or give the whole manifest")
    given = metadata.get("namespace")
    if given is not None and given != namespace:
        raise InvalidJob("metadata.namespace", f"is {given}, but the client works in {namespace}")
    metadata["namespace"] = namespace
    data["metadata"] = metadata
    return data


def validate(body: Mapping[str, Any]) -> JobSpec:
    """The operator's parse of the job (defaults filled in); InvalidJob naming the field it refuses. What
    depends on the cluster (its storage policy, the Secrets a job names) is the operator's to check."""
    try:
        return parse_spec(body, OperatorConfig())
    except SpecError as err:
        raise InvalidJob(err.path, err.message) from None
