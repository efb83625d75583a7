"""A torchrun world's objects: worker pods that run torchrun (static rendezvous at worker 0) instead of sshd,
worker 0 alone hosting the rendezvous and uploading the results, and no launcher, SSH key or hostfile."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from typing import Any

import pytest
from dtjob import desired, names
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.desired.hosts import mpi_hosts
from dtjob.desired.torchrun import KEEP_RESULTS, TORCHRUN
from dtjob.desired.workload import world_pod_sets
from dtjob.reconcile.act import _world_objects
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import PodState

from tests.unit.operator_fixtures import job_spec

OWNER = owner_reference("rn50", "uid-1")
OUTPUT = {"account": "acct1", "container": "results", "credentials": {"authMode": "workloadIdentity"}}
RENDEZVOUS_HOST = "rn50-worker-0.rn50-workers.ml.svc"


def torchrun_spec(**spec: Any) -> JobSpec:
    return job_spec(torchrun={}, **spec)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = pod["spec"]["containers"][0]
    return found


def script(pod: dict[str, Any]) -> str:
    command = container(pod)["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    text: str = command[2]
    return text


LAUNCH = '"$python" -c '


def torchrun_argv(pod: dict[str, Any]) -> list[str]:
    """torchrun's arguments in the worker's script, as its shell splits them: the launch runs torchrun's own
    main (torch.distributed.run) in the image's Python, as a child (`&`) so the pod's SIGTERM reaches it."""
    text = script(pod)
    assert text.count(LAUNCH) == 1, text
    start = text.index(LAUNCH)
    end = text.index(" &\n", start)
    argv = shlex.split(text[start:end])
    assert argv[:3] == ["$python", "-c", TORCHRUN], argv[:3]
    return ["torchrun", *argv[3:]]


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} in {argv}"
    return argv[argv.index(name) + 1]


def test_a_torchrun_worker_has_no_ssh_no_sshd_and_no_readiness_probe() -> None:
    for index in (0, 1):
        pod = desired.worker_pod(torchrun_spec(), OWNER, index, 0)
        c = container(pod)
        assert "ssh" not in {v["name"] for v in pod["spec"]["volumes"]}
        assert "ssh" not in {m["name"] for m in c["volumeMounts"]}
        assert "readinessProbe" not in c
        assert "sshd" not in script(pod)
        assert all(p["name"] != "ssh" for p in c.get("ports", []))
    # An MPI world's worker keeps all three.
    mpi = desired.worker_pod(job_spec(), OWNER, 1, 0)
    assert "ssh" in {v["name"] for v in mpi["spec"]["volumes"]}
    assert "readinessProbe" in container(mpi) and "sshd" in script(mpi)


def test_each_worker_runs_torchrun_with_its_node_rank_at_worker_0s_rendezvous() -> None:
    spec = job_spec(
        workers=3, gpusPerWorker=2, torchrun={"processesPerWorker": 2, "rendezvousTimeoutSeconds": 120}
    )
    for index in range(3):
        argv = torchrun_argv(desired.worker_pod(spec, OWNER, index, 0))
        assert argv[0] == "torchrun"
        assert flag(argv, "--nnodes") == "3"
        assert flag(argv, "--node-rank") == str(index)
        assert flag(argv, "--nproc-per-node") == "2"
        assert flag(argv, "--rdzv-backend") == "static"
        assert flag(argv, "--master-addr") == RENDEZVOUS_HOST
        assert flag(argv, "--master-port") == "29400"
        # A failed process fails the pod: restarts are the operator's (runPolicy.backoffLimit).
        assert flag(argv, "--max-restarts") == "0"
        assert "timeout=120" in flag(argv, "--rdzv-conf")
        # The trainer follows --no-python: DDP's trainer for pytorch.
        program = argv[argv.index("--no-python") + 1 :]
        assert program[:3] == ["python", "-m", "dtjob_train.ddp"]


def test_a_custom_program_runs_under_torchrun_as_given() -> None:
    spec = torchrun_spec(framework="custom", image="ghcr.io/me/ddp:1", command=["./train", "--fast"])
    argv = torchrun_argv(desired.worker_pod(spec, OWNER, 1, 0))
    assert argv[argv.index("--no-python") + 1 :] == ["./train", "--fast"]


def test_the_rendezvous_id_is_the_jobs_attempt() -> None:
    spec = torchrun_spec()
    first = flag(torchrun_argv(desired.worker_pod(spec, OWNER, 0, 0)), "--rdzv-id")
    again = flag(torchrun_argv(desired.worker_pod(spec, OWNER, 1, 0)), "--rdzv-id")
    second = flag(torchrun_argv(desired.worker_pod(spec, OWNER, 0, 1)), "--rdzv-id")
    assert first == again  # the same world: every agent joins the same rendezvous
    assert first != second  # an agent of attempt 0 never joins attempt 1's
    assert "uid-1" in first and "uid-1" in second
    other_job = owner_reference("rn50", "uid-2")
    assert "uid-2" in flag(torchrun_argv(desired.worker_pod(spec, other_job, 0, 0)), "--rdzv-id")


def test_only_worker_0_declares_the_rendezvous_port() -> None:
    spec = torchrun_spec()
    zero = container(desired.worker_pod(spec, OWNER, 0, 0))
    assert zero["ports"] == [{"name": "rendezvous", "containerPort": 29400, "protocol": "TCP"}]
    one = container(desired.worker_pod(spec, OWNER, 1, 0))
    assert not one.get("ports")


def test_only_worker_0_mounts_the_output_token_and_uploads_keeping_the_pod_when_it_fails() -> None:
    spec = torchrun_spec(output=OUTPUT)
    sas = names.sas_secret_name("rn50", names.Access.OUTPUT)
    zero = desired.worker_pod(spec, OWNER, 0, 0)
    secrets = [v["secret"]["secretName"] for v in zero["spec"]["volumes"] if "secret" in v]
    assert secrets == [sas]
    assert any(m["name"] == "sas-out" for m in container(zero)["volumeMounts"])
    upload = [line for line in script(zero).splitlines() if "dtjob.stager upload" in line]
    assert len(upload) == 1 and upload[0].endswith("&& exit 0")
    assert script(zero).endswith(upload[0] + "\n" + KEEP_RESULTS)
    argv = shlex.split(upload[0])
    assert flag(argv, "--prefix") == "ml/rn50/uid-1/"
    # The upload comes after torchrun, only once it exited 0.
    lines = script(zero).splitlines()
    assert lines.index(upload[0]) > next(i for i, line in enumerate(lines) if line.startswith(LAUNCH))
    assert '[ "$code" -eq 0 ] || exit "$code"' in lines
    one = desired.worker_pod(spec, OWNER, 1, 0)
    assert not any("secret" in v for v in one["spec"]["volumes"])
    assert not any(m["name"] == "sas-out" for m in container(one)["volumeMounts"])
    assert "dtjob.stager upload" not in script(one)
    # Without spec.output no worker uploads.
    assert "dtjob.stager upload" not in script(desired.worker_pod(torchrun_spec(), OWNER, 0, 0))


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_a_failed_upload_keeps_worker_0_running_until_its_pod_is_deleted() -> None:
    """The script's end as worker 0 runs it, the upload replaced by its outcome: done, the pod ends 0; failed
    for good, the pod stays (with the results) and ends at the kubelet's SIGTERM."""
    done = subprocess.run(["sh", "-c", f"true && exit 0\n{KEEP_RESULTS}"], timeout=10)
    assert done.returncode == 0
    kept = subprocess.Popen(["sh", "-c", f"false && exit 0\n{KEEP_RESULTS}"])
    with pytest.raises(subprocess.TimeoutExpired):
        kept.wait(timeout=1.5)
    kept.terminate()
    assert kept.wait(timeout=10) == 143


def test_every_worker_is_labelled_with_the_world_size_it_was_started_for() -> None:
    spec = torchrun_spec(workers=3)
    for index in range(3):
        labels = desired.worker_pod(spec, OWNER, index, 2)["metadata"]["labels"]
        assert labels[names.WORLD_SIZE_LABEL] == "3"
        assert labels[names.WORKER_INDEX_LABEL] == str(index)
        assert labels[names.ATTEMPT_LABEL] == "2"
    # An MPI world's size is on its launcher's pod instead.
    assert names.WORLD_SIZE_LABEL not in desired.worker_pod(job_spec(), OWNER, 0, 0)["metadata"]["labels"]


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
@pytest.mark.parametrize(
    ("spec", "index"),
    [
        (torchrun_spec(output=OUTPUT), 0),
        (torchrun_spec(output=OUTPUT), 1),
        (torchrun_spec(), 0),
        (torchrun_spec(framework="custom", image="ghcr.io/me/ddp:1", command=["./run it", "a'b"]), 1),
    ],
)
def test_the_worker_script_parses_as_shell(spec: JobSpec, index: int) -> None:
    text = script(desired.worker_pod(spec, OWNER, index, 0))
    done = subprocess.run(["sh", "-n", "-c", text], capture_output=True, text=True, timeout=10, check=False)
    assert done.returncode == 0, done.stderr


def test_the_workers_service_exposes_the_rendezvous_port() -> None:
    svc = desired.workers_service(torchrun_spec(), OWNER)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {"name": "rendezvous", "port": 29400, "targetPort": 29400, "protocol": "TCP"}
    ]
    mpi = desired.workers_service(job_spec(), OWNER)
    assert [p["name"] for p in mpi["spec"]["ports"]] == ["ssh"]


def test_the_published_hosts_are_on_the_services_port() -> None:
    # The EndpointSlice lists the hosts "on the Service's port" (desired.hosts.hosts_slice): for a torchrun
    # world that is the rendezvous port, not sshd's (there is no sshd).
    spec = torchrun_spec()
    worker = PodState(
        "rn50-worker-0", "worker", 0, 0, "Running", True, True, False, uid="u0", address="10.0.0.5"
    )
    endpoint_slice = desired.hosts_slice(spec, OWNER, mpi_hosts(spec, [worker]))
    service_ports = {(p["name"], p["port"]) for p in desired.workers_service(spec, OWNER)["spec"]["ports"]}
    assert {(p["name"], p["port"]) for p in endpoint_slice["ports"]} == service_ports


def test_the_network_policy_admits_only_the_jobs_own_pods_to_the_workers() -> None:
    spec = torchrun_spec()
    policy = desired.network_policy(spec, OWNER)["spec"]
    selected = policy["podSelector"]["matchLabels"]
    worker_labels = desired.worker_pod(spec, OWNER, 0, 0)["metadata"]["labels"]
    assert selected.items() <= worker_labels.items()  # every worker is selected
    assert selected[names.JOB_NAME_LABEL] == "rn50"
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": {names.JOB_NAME_LABEL: "rn50"}}}]}]
    # Another job's workers in the namespace are not admitted.
    other = desired.worker_pod(job_spec(name="other", torchrun={}), OWNER, 0, 0)["metadata"]["labels"]
    assert not policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= other.items()


def test_a_torchrun_world_needs_no_ssh_secret_hostfile_or_launcher_policy() -> None:
    config = OperatorConfig(network_policy=True)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in _world_objects(config, torchrun_spec(), OWNER)]
    assert kinds == [("Service", "rn50-workers"), ("NetworkPolicy", "rn50-mpi")]
    mpi = {(o["kind"], o["metadata"]["name"]) for o in _world_objects(config, job_spec(), OWNER)}
    assert mpi == {
        ("Secret", "rn50-ssh"),
        ("ConfigMap", "rn50-hostfile"),
        ("Service", "rn50-workers"),
        ("NetworkPolicy", "rn50-mpi"),
        ("NetworkPolicy", "rn50-launcher-mpi"),
    }
    # Without the operator's networkPolicy option: the Service alone.
    plain = _world_objects(OperatorConfig(network_policy=False), torchrun_spec(), OWNER)
    assert [o["kind"] for o in plain] == ["Service"]


def test_kueue_admits_only_the_workers_of_a_torchrun_world() -> None:
    spec = torchrun_spec(runPolicy={"scheduling": {"queueName": "gpu-queue"}})
    sets = world_pod_sets(spec, OWNER)
    assert [s["name"] for s in sets] == [names.ROLE_WORKER]
    assert sets[0]["count"] == 2
    template = sets[0]["template"]["spec"]
    assert LAUNCH in template["containers"][0]["command"][2]
    mpi = world_pod_sets(job_spec(runPolicy={"scheduling": {"queueName": "gpu-queue"}}), OWNER)
    assert [s["name"] for s in mpi] == [names.ROLE_WORKER, names.ROLE_LAUNCHER]


def test_an_elastic_world_rendezvouses_over_its_node_range_with_rank_0_on_worker_0() -> None:
    spec = job_spec(
        workers=3, gpusPerWorker=2, torchrun={"rendezvousTimeoutSeconds": 120},
        elastic={"minWorkers": 2, "maxWorkers": 4, "commitEverySteps": 7},
    )  # fmt: skip
    addrs = []
    for index in range(3):
        argv = torchrun_argv(desired.worker_pod(spec, OWNER, index, 0))
        assert flag(argv, "--nnodes") == "2:4"
        assert "--node-rank" not in argv and "--master-addr" not in argv  # the rendezvous ranks the nodes
        assert flag(argv, "--rdzv-backend") == "c10d"
        assert flag(argv, "--rdzv-endpoint") == f"{RENDEZVOUS_HOST}:29400"
        conf = dict(kv.split("=") for kv in flag(argv, "--rdzv-conf").split(","))
        # Only worker 0's agent hosts the store, whatever its hostname resolves to.
        assert conf == {
            "join_timeout": "120", "last_call_timeout": "10", "is_host": "true" if index == 0 else "false"
        }  # fmt: skip
        # Every round's rank 0 publishes its store to the ranks (a replacement joins a later round).
        worker = script(desired.worker_pod(spec, OWNER, index, 0))
        assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n" in worker
        addrs.append(flag(argv, "--local-addr"))
        # The agent restarts its processes when a peer is lost, a bounded number of times.
        assert int(flag(argv, "--max-restarts")) >= 3
        program = argv[argv.index("--no-python") + 1 :]
        assert program[:3] == ["python", "-m", "dtjob_train.ddp"]
        assert "--elastic" in program and flag(program, "--commit-every") == "7"
    # Ranks follow the sorted addresses: worker 0's sorts first (rank 0 there), even past ten workers.
    assert addrs[0] == RENDEZVOUS_HOST and sorted(addrs) == addrs
    tenth = flag(torchrun_argv(desired.worker_pod(spec, OWNER, 10, 0)), "--local-addr")
    assert min(addrs[0], tenth) == addrs[0]
    # A fixed world shares torchrun's store with its ranks, as torchrun does by default.
    fixed = job_spec(workers=3, torchrun={})
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in script(desired.worker_pod(fixed, OWNER, 1, 0))
