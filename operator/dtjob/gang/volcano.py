"""Volcano (runPolicy.scheduling.gang.scheduler volcano): its PodGroup (scheduling.volcano.sh/v1beta1), sized
to the workers' resources for its queue, and the annotation that puts a pod in it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob.gang.pod_groups import PodGroupScheduler, group_name
from dtjob.gang.resources import min_resources
from dtjob.spec.parse import JobSpec

# Volcano finds a pod's PodGroup by this annotation (v1beta1.KubeGroupNameAnnotationKey).
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"


class Volcano(PodGroupScheduler):
    name = "volcano"
    scheduler_name = "volcano"
    pod_group_api = "scheduling.volcano.sh/v1beta1"
    installed_by = "Volcano"

    def pod_annotations(self, spec: JobSpec, role: str) -> dict[str, str]:
        return {GROUP_NAME_ANNOTATION: group_name(spec)}

    def pod_group_spec(self, spec: JobSpec, worker: Mapping[str, Any]) -> dict[str, Any]:
        gang = spec.run_policy.scheduling.gang
        assert gang is not None, "only for a job with runPolicy.scheduling.gang"
        # Volcano admits a group into its queue only when the queue has room for minResources.
        group: dict[str, Any] = {
            "minMember": spec.workers,
            "minResources": min_resources(worker, spec.workers),
        }
        if gang.queue is not None:
            group["queue"] = gang.queue
        return group
