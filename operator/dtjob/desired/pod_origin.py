"""Where what a pod the operator creates names came from: the pod spec inside a Pod or a batch Job, and the
template (spec.worker.template, spec.launcher.template) behind a role's pods. Pure; the checks that name the
spec field a refusal is about (dtjob.desired.pod_trust, dtjob.desired.pod_shares) share it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob import names
from dtjob.spec.parse import JobSpec

# The template behind each role's pods (the stager has none).
TEMPLATE_PATHS = {names.ROLE_WORKER: "spec.worker.template", names.ROLE_LAUNCHER: "spec.launcher.template"}


def pod_spec(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """A Pod's spec, or a batch Job's pod template's spec, and its path in the object."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Job":
        return (spec.get("template") or {}).get("spec") or {}, "spec.template.spec"
    return spec, "spec"


def template_path(obj: Mapping[str, Any]) -> str | None:
    """The spec field of the template `obj` was built from, by its role label; None: it has none."""
    role = ((obj.get("metadata") or {}).get("labels") or {}).get(names.ROLE_LABEL)
    return TEMPLATE_PATHS.get(str(role))


def template_spec(spec: JobSpec, path: str | None) -> Mapping[str, Any] | None:
    """The pod spec fragment of the template at `path` (template_path), or None."""
    pod = {
        TEMPLATE_PATHS[names.ROLE_WORKER]: spec.worker,
        TEMPLATE_PATHS[names.ROLE_LAUNCHER]: spec.launcher.pod,
    }
    template = pod[path].template if path is not None else None
    return template.spec if template is not None else None


def describe(obj: Mapping[str, Any]) -> str:
    return f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')}"
