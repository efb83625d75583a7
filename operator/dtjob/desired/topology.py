"""runPolicy.scheduling.topology as pod affinity: each worker (and a launcher that runs ranks) goes to the
domain of the topology key that holds the job's workers. Pure.

The scheduler places the first worker where it fits (no worker matches the term yet, and the pod matches its
own term), and every later one beside it: required waits for room in that domain, preferred (weight 100)
takes another domain when that one is full. The term selects the job's workers by job name and role, not by
attempt, so a restarted world's pods are placed by the same rule. With Kueue the annotations on the world's
hosts (dtjob.gang.kueue) place the world instead, and its pods get no affinity.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dtjob import gang, names
from dtjob.spec.parse import JobSpec

Json = dict[str, Any]
PREFERRED_WEIGHT = 100  # the most a preferred term can weigh: the domain outweighs any other preference


def worker_with_topology(spec: JobSpec, pod_spec: Mapping[str, Any]) -> Json:
    """A host of the world's (a worker, a launcher that runs ranks): its `pod_spec` with the topology
    affinity, unless a scheduler (Kueue) places by topology."""
    return with_topology(spec, pod_spec) if gang.topology_by_affinity(spec) else dict(pod_spec)


def with_topology(spec: JobSpec, pod_spec: Mapping[str, Any]) -> Json:
    """`pod_spec` with the job's topology affinity added to its own (the user's affinity kept whole)."""
    out = dict(pod_spec)
    topology = spec.run_policy.scheduling.topology
    if topology is None:
        return out
    term: Json = {
        "labelSelector": {
            "matchLabels": {names.JOB_NAME_LABEL: spec.name, names.ROLE_LABEL: names.ROLE_WORKER}
        },
        "topologyKey": topology.key,
    }
    affinity = copy.deepcopy(dict(out.get("affinity") or {}))
    pod_affinity = affinity.setdefault("podAffinity", {})
    if topology.required:
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    else:
        preferred = {"weight": PREFERRED_WEIGHT, "podAffinityTerm": term}
        pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(preferred)
    out["affinity"] = affinity
    return out
