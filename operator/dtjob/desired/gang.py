"""How a world joins its gang scheduler (runPolicy.scheduling.gang): which scheduler places its pods and which
label or annotation ties each pod to the job's PodGroup. Pure; the PodGroup itself is in desired/pod_group.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtjob import names
from dtjob.spec.parse import JobSpec

COSCHEDULING = "coscheduling"
VOLCANO = "volcano"
# scheduler-plugins' coscheduling finds a pod's PodGroup by this label (v1alpha1.PodGroupLabel).
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
# Volcano finds it by this annotation (v1beta1.KubeGroupNameAnnotationKey).
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"


@dataclass(frozen=True)
class GangScheduler:
    api_version: str  # of its PodGroup
    scheduler_name: str  # the pods' schedulerName unless runPolicy.scheduling.schedulerName says otherwise
    installed_by: str  # what a cluster lacking the PodGroup API should install, for the refusal's message


SCHEDULERS = {
    # The name scheduler-plugins' own Helm chart gives its second scheduler.
    COSCHEDULING: GangScheduler(
        "scheduling.x-k8s.io/v1alpha1", "scheduler-plugins-scheduler", "scheduler-plugins (coscheduling)"
    ),
    VOLCANO: GangScheduler("scheduling.volcano.sh/v1beta1", "volcano", "Volcano"),
}
POD_GROUP_KIND = "PodGroup"


def gang_scheduler(spec: JobSpec) -> GangScheduler | None:
    gang = spec.run_policy.scheduling.gang
    return SCHEDULERS[gang.scheduler] if gang is not None else None


def scheduler_name(spec: JobSpec) -> str | None:
    """The world's schedulerName: the spec's, else the gang scheduler's, else the cluster's default."""
    scheduling = spec.run_policy.scheduling
    gang = gang_scheduler(spec)
    return scheduling.scheduler_name or (gang.scheduler_name if gang is not None else None)


def pod_labels(spec: JobSpec) -> dict[str, str]:
    gang = spec.run_policy.scheduling.gang
    if gang is None or gang.scheduler != COSCHEDULING:
        return {}
    return {COSCHEDULING_LABEL: names.pod_group_name(spec.name)}


def pod_annotations(spec: JobSpec) -> dict[str, str]:
    gang = spec.run_policy.scheduling.gang
    if gang is None or gang.scheduler != VOLCANO:
        return {}
    return {VOLCANO_ANNOTATION: names.pod_group_name(spec.name)}
