"""What every MPI world needs before any pod starts: SSH Secret, hostfile ConfigMap, headless Service."""

from __future__ import annotations

from collections.abc import Mapping

from dtjob import names
from dtjob.desired.common import SSH_KEY_FILE, Json, metadata
from dtjob.desired.sshkeys import SshKeyPair
from dtjob.desired.torchrun import service_port
from dtjob.spec.parse import JobSpec

# Horovod elastic's --host-discovery-script format (host:slots), derived from the static hostfile.
DISCOVER_HOSTS_SCRIPT = """#!/bin/sh
# Prints host:slots for every MPI host of this job (Horovod's --host-discovery-script format).
exec awk '{ split($2, s, "="); print $1 ":" s[2] }' "$(dirname "$0")/hostfile"
"""


def elastic_discovery_script(spec: JobSpec) -> str:
    """Horovod Elastic's host discovery for an elastic job: the address of every worker that is Ready, from
    the cluster DNS of the workers' headless Service, whose only endpoints are the operator's own Ready MPI
    hosts (dtjob.desired.hosts). A pod being deleted leaves its records at the operator's next look, and the
    launcher needs no Kubernetes credentials. Pods are listed by address, so a replacement (same name, new
    address) is a new host to Horovod, never one it remembers as failed.

    Once it has found hosts, a lookup that finds none exits 1: a running world's name never loses every
    address at once, so that is a failed lookup, and Horovod keeps the hosts it has (a failure after its first
    look is transient to it). Taken as an empty world, it would drop every host and, when they came back,
    number them anew: a freshly started replacement could become rank 0, whose state the others adopt."""
    service = f"{names.service_name(spec.name)}.{spec.namespace}.svc"
    return f"""#!/bin/sh
# Prints address:slots for every Ready worker of this job (Horovod's --host-discovery-script format).
found=${{TMPDIR:-/tmp}}/dtjob-hosts-found
hosts=$(getent ahostsv4 {service} 2>/dev/null | awk '!seen[$1]++ {{ print $1 ":{spec.slots_per_worker}" }}')
if [ -n "$hosts" ]; then
  echo "$hosts"
  touch "$found" 2>/dev/null || true
elif [ -e "$found" ]; then
  echo "no address for {service}: keeping the hosts found before" >&2
  exit 1
fi
exit 0
"""


def ssh_secret(spec: JobSpec, owner: Json, keys: SshKeyPair) -> Json:
    name = names.ssh_secret_name(spec.name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(name, spec.namespace, names.labels(spec.name, "ssh"), owner),
        "type": "Opaque",
        "stringData": {
            SSH_KEY_FILE: keys.private_openssh,
            f"{SSH_KEY_FILE}.pub": keys.public_openssh,
            "authorized_keys": keys.public_openssh,
        },
    }


def mpi_hostnames(spec: JobSpec) -> list[str]:
    """Pod hostnames of the MPI hosts, in rank order (launcher first when it runs ranks)."""
    hosts = [names.worker_name(spec.name, i) for i in range(spec.workers)]
    if spec.launcher.run_as_worker:
        hosts.insert(0, names.launcher_name(spec.name))
    return hosts


def hostfile_text(spec: JobSpec) -> str:
    """One line per MPI host: `<fqdn> slots=N` (Open MPI, and horovodrun, which converts it), or `<fqdn>:N`
    for the Hydra launchers of MPICH and Intel MPI."""
    hydra = spec.launcher.runner == "mpirun" and spec.launcher.mpi_implementation != "OpenMPI"
    slots = spec.slots_per_worker
    return "".join(
        f"{names.host_fqdn(h, spec.name, spec.namespace)}{f':{slots}' if hydra else f' slots={slots}'}\n"
        for h in mpi_hostnames(spec)
    )


def discovery_script(spec: JobSpec) -> str:
    return DISCOVER_HOSTS_SCRIPT if spec.elastic is None else elastic_discovery_script(spec)


def hostfile_config_map(spec: JobSpec, owner: Json) -> Json:
    name = names.hostfile_name(spec.name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name, spec.namespace, names.labels(spec.name, "hostfile"), owner),
        "data": {"hostfile": hostfile_text(spec), "discover_hosts.sh": discovery_script(spec)},
    }


def network_policy(spec: JobSpec, owner: Json) -> Json:
    """Only pods of this job may reach its MPI hosts: sshd (or a torchrun world's rendezvous store), and the
    ports Open MPI, Gloo and NCCL open between ranks (any port, so the policy never breaks a framework). Pods
    of other jobs, namespaces or the internet reach none. Selects by the operator's job label, so it needs a
    network plugin that enforces policies."""
    same_job = {names.JOB_NAME_LABEL: spec.name}
    return _ingress_only_from(spec, owner, names.network_policy_name(spec.name), _mpi_hosts(spec), same_job)


def launcher_network_policy(spec: JobSpec, owner: Json) -> Json:
    """Only this job's MPI hosts may reach its launcher: Open MPI's ORTE/PRRTE daemons, Hydra's proxies and
    horovodrun's task services call back to it on ports they pick at run time (any port, then). The launcher
    is not an MPI host unless it runs as worker 0, so network_policy() does not select it."""
    launcher = {names.JOB_NAME_LABEL: spec.name, names.ROLE_LABEL: names.ROLE_LAUNCHER}
    name = names.launcher_network_policy_name(spec.name)
    return _ingress_only_from(spec, owner, name, launcher, _mpi_hosts(spec))


def _mpi_hosts(spec: JobSpec) -> dict[str, str]:
    return {names.JOB_NAME_LABEL: spec.name, names.MPI_HOST_LABEL: "true"}


def _ingress_only_from(
    spec: JobSpec, owner: Json, name: str, selected: Mapping[str, str], allowed: Mapping[str, str]
) -> Json:
    """A NetworkPolicy: the pods labelled `selected` take connections, on any port, only from pods of the same
    namespace labelled `allowed`."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, spec.namespace, names.labels(spec.name, "network-policy"), owner),
        "spec": {
            "podSelector": {"matchLabels": dict(selected)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": dict(allowed)}}]}],
        },
    }


def workers_service(spec: JobSpec, owner: Json) -> Json:
    """Headless Service giving each MPI host a stable DNS name (`<pod>.<job>-workers.<ns>.svc`).

    No selector: Kubernetes' EndpointSlice controller would publish every pod labelled like an MPI host, and
    labels are anyone's to set. The operator publishes its own pods in the Service's EndpointSlice
    (dtjob.desired.hosts), and a drift patch takes the selector off a Service an older operator created.
    """
    name = names.service_name(spec.name)
    port = service_port(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, spec.namespace, names.labels(spec.name, "workers"), owner),
        "spec": {
            "clusterIP": "None",
            "ports": [{"name": port[0], "port": port[1], "targetPort": port[1], "protocol": "TCP"}],
        },
    }
