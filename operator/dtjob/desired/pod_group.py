"""The PodGroup of a gang-scheduled world (runPolicy.scheduling.gang), in its scheduler's own API: the
scheduler (dtjob.gang) says what its spec holds. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob import gang, names
from dtjob.desired.common import Json, metadata
from dtjob.gang.pod_groups import POD_GROUP_KIND
from dtjob.spec.parse import JobSpec


def pod_group(spec: JobSpec, owner: Json, worker: Mapping[str, Any]) -> Json:
    """The job's PodGroup, sized to its workers (`worker` is one worker pod as built). Only for a job whose
    scheduler needs one (dtjob.gang.pod_group_api)."""
    scheduler = gang.gang_scheduler(spec)
    group_spec = scheduler.pod_group_spec(spec, worker) if scheduler is not None else None
    assert scheduler is not None and group_spec is not None, "only for a job whose scheduler needs a PodGroup"
    name = names.pod_group_name(spec.name)
    return {
        "apiVersion": scheduler.pod_group_api,
        "kind": POD_GROUP_KIND,
        "metadata": metadata(name, spec.namespace, names.labels(spec.name, "pod-group"), owner),
        "spec": group_spec,
    }
