"""A job's pod template merged over the pod the operator builds (spec.worker.template,
spec.launcher.template). Pure.

The merge is Kubernetes' strategic merge, reduced to what a template can say:
- containers and initContainers merge by name: the operator's own container (names.WORKER_CONTAINER or
  names.LAUNCHER_CONTAINER) takes the template's fields, any other is added after it (a sidecar);
- a container the template adds runs under the operator's container hardening (no privilege escalation, all
  capabilities dropped: the restricted Pod Security level), which its own securityContext may change;
- in a container, env merges by name (the template's value wins), envFrom is added, ports, volumeMounts and
  volumeDevices are added by their key, resources merge per resource name;
- volumes, imagePullSecrets and tolerations are added (the `dshm` volume merges: its sizeLimit);
- any other object merges key by key, and any other value replaces the operator's.
What the operator owns always wins here (dtjob.spec.validators lists it; dtjob.spec.template has already
refused a template that sets it, naming the field), so no template can take a pod out of the operator's hands.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dtjob.desired.common import container_security_context
from dtjob.spec import validators as rules

Json = dict[str, Any]
# Where a pod has more than one container, `kubectl logs` and `kubectl exec` pick this one by default.
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"


def merge_pod_spec(built: Mapping[str, Any], template: Mapping[str, Any], main: str) -> Json:
    """`built` (the operator's PodSpec) with `template` (a PodSpec fragment) merged over it; `main` names the
    operator's own container. Neither argument is changed."""
    out = copy.deepcopy(dict(built))
    for key, value in template.items():
        mine = out.get(key)
        if key in ("containers", "initContainers"):
            added = [_hardened(c) if c.get("name") != main else c for c in value]
            out[key] = _merge_by_key(mine or [], added, "name", _container_merger(main))
        elif key == "volumes":
            out[key] = _merge_by_key(mine or [], value, "name", _merge_volume)
        elif key == "imagePullSecrets":
            out[key] = _merge_by_key(mine or [], value, "name", _keep)
        elif key == "tolerations":
            out[key] = [*(mine or []), *(copy.deepcopy(t) for t in value if t not in (mine or []))]
        else:
            out[key] = _merge_value(mine, value)
    for key in (*rules.TEMPLATE_OWNED_POD_FIELDS, *rules.TEMPLATE_SCHEDULER_POD_FIELDS):
        _restore(out, built, key)
    grace = out.get("terminationGracePeriodSeconds")
    if isinstance(grace, int) and grace > rules.TERMINATION_GRACE_MAX_SECONDS:
        out["terminationGracePeriodSeconds"] = rules.TERMINATION_GRACE_MAX_SECONDS
    return out


def template_annotations(
    annotations: Mapping[str, str], template: Mapping[str, Any], main: str
) -> dict[str, str]:
    """The pod's annotations: with containers beside the operator's, `kubectl logs` picks the operator's by
    default (unless the job's annotations pick another)."""
    out = dict(annotations)
    others = [c for c in template.get("containers") or () if c.get("name") != main]
    if others:
        out.setdefault(DEFAULT_CONTAINER_ANNOTATION, main)
    return out


def _hardened(container: Mapping[str, Any]) -> Json:
    """A container the template adds, under the operator's own hardening (the restricted Pod Security level's
    container settings), which its securityContext may change."""
    out = dict(container)
    out["securityContext"] = _merge_value(
        container_security_context(), container.get("securityContext") or {}
    )
    return out


def _container_merger(main: str) -> Callable[[Json, Json], Json]:
    def merge(built: Json, template: Json) -> Json:
        return _merge_container(built, template) if built.get("name") == main else _keep(built, template)

    return merge


def _merge_container(built: Json, template: Mapping[str, Any]) -> Json:
    out = copy.deepcopy(built)
    for key, value in template.items():
        mine = out.get(key)
        if key == "env":
            out[key] = _merge_by_key(mine or [], value, "name", _replace)
        elif key == "envFrom":
            out[key] = [*(mine or []), *copy.deepcopy(value)]
        elif key == "ports":
            out[key] = _merge_by(mine or [], value, _port_key, _keep)
        elif key == "volumeMounts":
            out[key] = _merge_by_key(mine or [], value, "mountPath", _keep)
        elif key == "volumeDevices":
            out[key] = _merge_by_key(mine or [], value, "devicePath", _keep)
        elif key == "resources":
            out[key] = _merge_resources(mine or {}, value)
        else:
            out[key] = _merge_value(mine, value)
    owned = {**rules.TEMPLATE_OWNED_CONTAINER_FIELDS, **rules.TEMPLATE_OWNED_WORKER_FIELDS}
    for key in owned:
        if key in built:
            out[key] = copy.deepcopy(built[key])
    own_env = {e.get("name"): e for e in built.get("env") or () if e.get("name") in rules.LAUNCHER_OWNED_ENV}
    if own_env:
        out["env"] = [copy.deepcopy(own_env.get(e.get("name"), e)) for e in out.get("env") or ()]
    return out


def _merge_resources(built: Json, template: Mapping[str, Any]) -> Json:
    """limits and requests merge per resource name; the GPU count stays the operator's (gpusPerWorker)."""
    out = copy.deepcopy(built)
    for key, value in template.items():
        if key == "claims":
            out[key] = _merge_by_key(out.get(key) or [], value, "name", _keep)
        else:
            out[key] = _merge_value(out.get(key), value)
    for kind in ("limits", "requests"):
        values = out.get(kind)
        if not isinstance(values, dict):
            continue
        values.pop(rules.GPU_RESOURCE, None)
        gpus = (built.get(kind) or {}).get(rules.GPU_RESOURCE)
        if gpus is not None:
            values[rules.GPU_RESOURCE] = gpus
        if not values:
            del out[kind]
    return out


def _merge_volume(built: Json, template: Json) -> Json:
    """Only `dshm` may be named by a template (dtjob.spec.template): its emptyDir's size, in memory still."""
    if built.get("name") != rules.SHARED_MEMORY_VOLUME or not isinstance(template.get("emptyDir"), Mapping):
        return built
    out = copy.deepcopy(built)
    size = copy.deepcopy(dict(template["emptyDir"]))
    out["emptyDir"] = {**out.get("emptyDir", {}), **size, "medium": "Memory"}
    return out


def _merge_value(mine: Any, theirs: Any) -> Any:
    """Objects merge key by key (the template's values win); anything else is the template's."""
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
        out = dict(copy.deepcopy(mine))
        for key, value in theirs.items():
            out[key] = _merge_value(out.get(key), value)
        return out
    return copy.deepcopy(theirs)


def _port_key(port: Mapping[str, Any]) -> tuple[Any, Any]:
    return port.get("containerPort"), port.get("protocol") or "TCP"


def _merge_by_key(
    built: Sequence[Json], template: Iterable[Json], key: str, merge: Callable[[Json, Json], Json]
) -> list[Json]:
    return _merge_by(built, template, lambda item: item.get(key), merge)


def _merge_by(
    built: Sequence[Json],
    template: Iterable[Json],
    key: Callable[[Mapping[str, Any]], Any],
    merge: Callable[[Json, Json], Json],
) -> list[Json]:
    """The operator's items, each merged with the template's item of the same key, then the template's other
    items in their order."""
    theirs = list(template)
    by_key = {key(item): item for item in theirs}
    out = [merge(copy.deepcopy(item), by_key[key(item)]) if key(item) in by_key else copy.deepcopy(item)
           for item in built]  # fmt: skip
    mine = {key(item) for item in built}
    return out + [copy.deepcopy(item) for item in theirs if key(item) not in mine]


def _keep(built: Json, template: Json) -> Json:
    return built


def _replace(built: Json, template: Json) -> Json:
    return copy.deepcopy(template)


def _restore(out: Json, built: Mapping[str, Any], key: str) -> None:
    if key in built:
        out[key] = copy.deepcopy(built[key])
    else:
        out.pop(key, None)
