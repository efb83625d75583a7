"""Every API call the operator's client may make, as RBAC names it: (apiGroup, resource, verb) -> why. The
client refuses a call outside this table (dtjob.kube.rest.api_call), so the table is what the chart must
grant (the tests' test_rbac compares it with what helm renders)."""

from __future__ import annotations

from dtjob import API_GROUP, PLURAL

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)

COSCHEDULING_GROUP = "scheduling.x-k8s.io"
VOLCANO_GROUP = "scheduling.volcano.sh"
KUEUE_GROUP = "kueue.x-k8s.io"
_POD_GROUP = "a gang's PodGroup: created before its workers, its fields kept in line, deleted with its world"

PERMISSIONS: dict[Permission, str] = {
    (API_GROUP, PLURAL, "get"): "a reconcile reads its job when the watch's copy is not recent",
    (API_GROUP, PLURAL, "list"): "the jobs' watch's list, and the jobs' metadata, which confirms its copies",
    (API_GROUP, PLURAL, "watch"): "the jobs' watch (dtjob.runtime.child_watch)",
    (API_GROUP, PLURAL, "delete"): "a finished job goes after its ttlSecondsAfterFinished",
    (API_GROUP, f"{PLURAL}/status", "patch"): "the status a reconcile decided, guarded by resourceVersion",
    ("", "pods", "create"): "the workers and stagers of a world",
    ("", "pods", "get"): "a create answered 409: whose pod is it; a finalizer's removal reads it first",
    ("", "pods", "list"): "the children's cache and its resyncs; a pool's free GPUs; a world's deletion",
    ("", "pods", "watch"): "the children's watch",
    ("", "pods", "delete"): "a world's pods, each under the UID it was read with",
    ("", "pods", "patch"): "Kueue's finalizer off an ended worker whose name the next world reuses",
    ("", "pods/log", "get"): "the launcher's progress and error lines; the stager's report",
    ("", "services", "create"): "the workers' headless Service",
    ("", "services", "get"): "a create answered 409: whose Service is it, has it drifted",
    ("", "services", "patch"): "the Service's ports kept in line, an older operator's selector taken off",
    ("discovery.k8s.io", "endpointslices", "create"): "the Service's MPI hosts: the operator's own pods only",
    (
        "discovery.k8s.io",
        "endpointslices",
        "get",
    ): "a create answered 409: whose EndpointSlice is it, drifted",
    ("discovery.k8s.io", "endpointslices", "patch"): "the Service's MPI hosts kept to the world's pods",
    ("discovery.k8s.io", "endpointslices", "list"): "the children's cache and its resyncs",
    ("discovery.k8s.io", "endpointslices", "watch"): "the children's watch",
    ("discovery.k8s.io", "endpointslices", "delete"): (
        "the slices Kubernetes' controllers made for a Service an older operator created with a selector"
    ),
    ("", "endpoints", "delete"): "the Endpoints object such a Service kept once its selector went (mirrored)",
    ("", "configmaps", "create"): "the hostfile",
    ("", "configmaps", "get"): "a create answered 409: whose ConfigMap is it, has it drifted",
    ("", "configmaps", "patch"): "the hostfile kept in line",
    ("", "secrets", "create"): "the SSH key and SAS Secrets the operator owns",
    ("", "secrets", "get"): "those Secrets, and the account-key Secret a job names (read by name)",
    ("", "secrets", "update"): "a SAS Secret renewed in place (mounted copies follow)",
    ("", "secrets", "delete"): "a SAS Secret the job no longer needs, under the UID it was read with",
    ("", "persistentvolumeclaims", "get"): "the preflight: a claim a job mounts exists",
    ("", "namespaces", "get"): "the namespace's storage allowlists and NFS shares (its annotations)",
    ("", "namespaces", "list"): "every namespace's storage lists: who else reads or writes a container",
    ("", "nodes", "list"): "the preflight's GPUs per node; a pool's free GPUs",
    ("", "events", "create"): "the Events a reconcile posts about its job, and the Lease's handovers",
    ("", "events", "list"): "why admission refused a Job's pod (its FailedCreate Events): their watch's list",
    ("", "events", "watch"): "the FailedCreate Events' watch",
    ("batch", "jobs", "create"): "the launcher",
    ("batch", "jobs", "get"): "a create answered 409: whose Job is it",
    ("batch", "jobs", "list"): "the children's cache and its resyncs",
    ("batch", "jobs", "watch"): "the children's watch",
    ("batch", "jobs", "delete"): "the launcher of a world that ends",
    ("networking.k8s.io", "networkpolicies", "create"): "the world's NetworkPolicy (networkPolicy.enabled)",
    ("networking.k8s.io", "networkpolicies", "get"): "a create answered 409: whose policy is it, drifted",
    ("networking.k8s.io", "networkpolicies", "patch"): "the policy kept in line",
    (COSCHEDULING_GROUP, "podgroups", "create"): _POD_GROUP,
    (COSCHEDULING_GROUP, "podgroups", "get"): _POD_GROUP,
    (COSCHEDULING_GROUP, "podgroups", "patch"): _POD_GROUP,
    (COSCHEDULING_GROUP, "podgroups", "delete"): _POD_GROUP,
    (VOLCANO_GROUP, "podgroups", "create"): _POD_GROUP,
    (VOLCANO_GROUP, "podgroups", "get"): _POD_GROUP,
    (VOLCANO_GROUP, "podgroups", "patch"): _POD_GROUP,
    (VOLCANO_GROUP, "podgroups", "delete"): _POD_GROUP,
    (
        KUEUE_GROUP,
        "workloads",
        "create",
    ): "the Workload of a job MultiKueue dispatches (managedBy), on the manager",
    (
        KUEUE_GROUP,
        "workloads",
        "get",
    ): "on a worker, the Workload Kueue's copy of a job names: admitted before its world, its own as it ends",
    (
        KUEUE_GROUP,
        "workloads/status",
        "patch",
    ): "on a worker, that Workload marked Finished when the job ends",
    (
        KUEUE_GROUP,
        "workloadpriorityclasses",
        "get",
    ): "the priority a dispatched job's kueue.x-k8s.io/priority-class label names, for its Workload",
    ("coordination.k8s.io", "leases", "get"): "leader election: the Lease's holder",
    ("coordination.k8s.io", "leases", "create"): "leader election: the first replica creates the Lease",
    ("coordination.k8s.io", "leases", "update"): "leader election: renewals and takeovers",
    ("authentication.k8s.io", "tokenreviews", "create"): "the secure /metrics: who is behind a token",
    ("authorization.k8s.io", "subjectaccessreviews", "create"): "the secure /metrics: may that user read it",
}
