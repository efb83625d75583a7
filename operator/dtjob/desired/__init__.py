"""Pure builders: a parsed JobSpec -> the Kubernetes objects (plain dicts) that should exist for it."""

from dtjob.desired.hosts import hosts_slice
from dtjob.desired.pod_group import pod_group
from dtjob.desired.pods import launcher_pod, worker_pod
from dtjob.desired.staging import staging_job
from dtjob.desired.world import (
    hostfile_config_map,
    hostfile_text,
    launcher_network_policy,
    network_policy,
    ssh_secret,
    workers_service,
)

__all__ = [
    "hostfile_config_map",
    "hostfile_text",
    "hosts_slice",
    "launcher_network_policy",
    "launcher_pod",
    "network_policy",
    "pod_group",
    "ssh_secret",
    "staging_job",
    "worker_pod",
    "workers_service",
]
