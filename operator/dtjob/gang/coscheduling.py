"""scheduler-plugins' Coscheduling (runPolicy.scheduling.gang.scheduler coscheduling): its PodGroup
(scheduling.x-k8s.io/v1alpha1) and the label that puts a pod in it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtjob.gang.pod_groups import PodGroupScheduler, group_name
from dtjob.spec.parse import JobSpec

# Coscheduling finds a pod's PodGroup by this label (v1alpha1.PodGroupLabel).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


class Coscheduling(PodGroupScheduler):
    name = "coscheduling"
    # The name scheduler-plugins' own Helm chart gives its second scheduler.
    scheduler_name = "scheduler-plugins-scheduler"
    pod_group_api = "scheduling.x-k8s.io/v1alpha1"
    installed_by = "scheduler-plugins (coscheduling)"

    def pod_labels(self, spec: JobSpec, role: str) -> dict[str, str]:
        return {POD_GROUP_LABEL: group_name(spec)}

    def pod_group_spec(self, spec: JobSpec, worker: Mapping[str, Any]) -> dict[str, Any]:
        gang = spec.run_policy.scheduling.gang
        assert gang is not None, "only for a job with runPolicy.scheduling.gang"
        # scheduleTimeoutSeconds: how long placed workers wait at Permit for the rest of the gang before all
        # are let go again.
        # No minResources: coscheduling checks it in PreFilter as unresolvable, and v0.34 retries such a pod
        # only when a pod is added or a PodGroup changes (or at the scheduler's flush of unschedulable pods,
        # 5 minutes by default), not when GPUs are freed. Without it the worker that does not fit fails Filter
        # on its GPUs, which a deleted pod or an added node retries at once.
        return {"minMember": spec.workers, "scheduleTimeoutSeconds": gang.schedule_timeout_seconds}
