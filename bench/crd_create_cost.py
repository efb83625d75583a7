"""What the DistributedTrainingJob CRD's validation costs the API server per create, and where.

    hack/netns.sh run bash -c 'export CLUSTER_NAME=cc; hack/cluster.sh up &&
        python -m bench.crd_create_cost --count 300; hack/cluster.sh down'

Beside the real CRD, copies of it go in under groups of their own (<variant>.bench.dtjob.io: group and CRD
name renamed, nothing else), one per variant of its schema (bench/crd_variants.py): real; no-cel (every
x-kubernetes-validations removed); no-podspec (spec.worker.template and spec.launcher.template opaque
x-kubernetes-preserve-unknown-fields objects, so the rules that read them go too); no-cel-no-podspec; minimal
(spec and status opaque). Kubeflow's MPIJob CRD (v0.8.2, once hack/build-mpi-operator.sh has cached it) goes
in as mpijob.bench.dtjob.io. No operator runs: only the API server's work is measured.

Into one namespace, --count objects of each: the job bench/versus_mpi_operator.py creates (pytorch, 4 workers
of 1 GPU, a launcher pod annotation; --template adds a worker pod template, so the PodSpec schema and the
template rules have something to walk) and that benchmark's MPIJob. The kinds take turns in blocks of --block
creates (round robin, the first kind rotating), so whatever else loads the shared machine falls on all alike;
a block's wall time and the API server's CPU seconds meanwhile (utime + stime from /proc of the
kube-apiserver whose command line names the cluster's directory) count to its kind. Two passes: --threads
client threads, then one. Per kind and pass: p50 and p90 create latency, wall time, the API server's CPU per
create net of its idle rate (measured first), and each as a ratio against minimal in the same pass.

Then, with Go's pprof at hand (--profile-seconds, 0 to skip), where a create's CPU goes: kube-apiserver's CPU
profile while each kind is created from --threads threads, the kinds taking --profile-rounds turns, its
samples summed per part of the create path (bench/apiserver_profile.py: the create handler; within it
decoding, validate, of which CEL (and its field lookups) and the OpenAPI schema, pruning and defaulting,
managed fields, of which structured-merge-diff's type comparisons, etcd; and the background GC), in ms per
create.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from bench.apiserver_profile import PARTS, profile
from bench.crd_variants import VARIANTS, Crd, count_rules, variant
from bench.operator_scale import kubeconfig_path, proc_usage
from bench.versus_mpi_operator import MPI_OPERATOR_VERSION, RUN_FOREVER, mpi_job, percentile
from testbed.cache import cache_root
from testbed.kube_wait import wait_for
from testbed.operator_harness import CRD_FILE, install_crd, kubectl, wait_established

GROUP_SUFFIX = "bench.dtjob.io"
BASELINE = "minimal"
WORKER_TEMPLATE = {  # what a user adds to a worker: a label, an env var, a scratch volume
    "metadata": {"labels": {"team": "vision"}},
    "spec": {
        "containers": [{"name": "worker", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}}],
    },
}  # fmt: skip


@dataclass
class Kind:
    """One CRD under test and the object each of its creates sends."""

    name: str
    group: str
    version: str
    plural: str
    body: Callable[[str], dict[str, Any]]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0


def dtjob_body(group: str, template: bool) -> Callable[[str], dict[str, Any]]:
    def body(name: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"framework": "pytorch", "workers": 4, "gpusPerWorker": 1,
                                "launcher": {"podAnnotations": RUN_FOREVER}}  # fmt: skip
        if template:
            spec["worker"] = {"template": WORKER_TEMPLATE}
        return {"apiVersion": f"{group}/v1alpha1", "kind": "DistributedTrainingJob",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip

    return body


def mpi_body(group: str) -> Callable[[str], dict[str, Any]]:
    def body(name: str) -> dict[str, Any]:
        return {**mpi_job(name, workers=4), "apiVersion": f"{group}/v2beta1"}

    return body


def apiserver_pid(kubeconfig: str) -> int:
    """The kube-apiserver process of the cluster whose kubeconfig this is: kwok runs it from, and points it
    at, the cluster's own directory, which its command line names."""
    cluster_dir = f"{Path(kubeconfig).resolve().parent}/"
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if Path(args[0]).name == "kube-apiserver" and any(cluster_dir in arg for arg in args):
            return int(proc.name)
    sys.exit(f"no kube-apiserver process names {cluster_dir}: is the cluster's API server a local process?")


def install(kubeconfig: str, crd: Crd) -> None:
    """Applies the CRD once any earlier copy still being deleted (with its objects) has gone."""
    name = crd["metadata"]["name"]

    def not_terminating() -> bool:
        found = kubectl(kubeconfig, "get", f"crd/{name}", "-o", "json", "--ignore-not-found")
        return "deletionTimestamp" not in json.loads(found.stdout or "{}").get("metadata", {})

    wait_for(not_terminating, timeout=300, interval=1.0, what=f"CRD {name} deleted")
    done = kubectl(
        kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(crd)
    )
    assert done.returncode == 0, done.stderr

    wait_established(kubeconfig, name)


def kinds_under_test(kubeconfig: str, template: bool, with_mpi: bool) -> list[Kind]:
    """Installs every variant (and the MPIJob CRD, when cached) and returns them in round-robin order."""
    real: Crd = yaml.safe_load(CRD_FILE.read_text())
    kinds: list[Kind] = []
    for name in VARIANTS:
        crd = variant(real, name, f"{name}.{GROUP_SUFFIX}")
        install(kubeconfig, crd)
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        blocks, rules = count_rules(schema)
        print(f"{name:18s} schema {len(json.dumps(schema)) / 1024:6.1f} KiB, {blocks} rule blocks, "
              f"{rules} CEL rules", flush=True)  # fmt: skip
        group = crd["spec"]["group"]
        kinds.append(
            Kind(name, group, "v1alpha1", crd["spec"]["names"]["plural"], dtjob_body(group, template))
        )
    mpi_file = cache_root() / "bin" / f"mpi-operator-{MPI_OPERATOR_VERSION}" / "kubeflow.org_mpijobs.yaml"
    if with_mpi and mpi_file.exists():
        group = f"mpijob.{GROUP_SUFFIX}"
        crd = variant(yaml.safe_load(mpi_file.read_text()), "real", group)
        install(kubeconfig, crd)
        kinds.append(Kind("mpijob", group, "v2beta1", crd["spec"]["names"]["plural"], mpi_body(group)))
    elif with_mpi:
        print(f"no {mpi_file}: run hack/build-mpi-operator.sh to compare an MPIJob", flush=True)
    return kinds


def create(custom: client.CustomObjectsApi, namespace: str, kind: Kind, name: str) -> tuple[float, int]:
    """(latency in seconds, bytes of the object as stored) of one create; the answer is not parsed."""
    start = time.monotonic()
    answer: Any = custom.create_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural,
                                                         kind.body(name), _preload_content=False)  # fmt: skip
    return time.monotonic() - start, len(answer.data)


def warm_up(custom: client.CustomObjectsApi, namespace: str, kinds: list[Kind], count: int) -> dict[str, int]:
    """A few creates of each kind outside the measurement (the first builds the API server's handler for
    it, and may find it not served yet); returns each kind's stored object size."""
    sizes: dict[str, int] = {}
    for kind in kinds:
        for i in range(count):

            def created(kind: Kind = kind, i: int = i) -> bool:
                try:
                    sizes[kind.name] = create(custom, namespace, kind, f"warm-{i}")[1]
                    return True
                except ApiException as err:
                    if err.status == 404:
                        return False
                    raise

            wait_for(created, timeout=30, interval=0.25, what=f"{kind.name} served")
    return sizes


def run_pass(
    custom: client.CustomObjectsApi, namespace: str, kinds: list[Kind], count: int, block: int, threads: int,
    pid: int,
) -> dict[str, Tally]:  # fmt: skip
    tallies = {kind.name: Tally() for kind in kinds}
    prefix = f"t{threads}"
    with ThreadPoolExecutor(threads) as pool:
        for turn, start in enumerate(range(0, count, block)):
            names = [f"{prefix}-{i}" for i in range(start, min(count, start + block))]
            shift = turn % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                tally = tallies[kind.name]
                cpu0, _ = proc_usage(pid)
                began = time.monotonic()
                done = list(pool.map(lambda name, kind=kind: create(custom, namespace, kind, name), names))
                tally.wall_s += time.monotonic() - began
                tally.cpu_s += proc_usage(pid)[0] - cpu0
                tally.latencies += [latency for latency, _ in done]
    return tallies


def idle_cpu_rate(pid: int, seconds: float) -> float:
    """The API server's CPU seconds per second with nothing sent: its controllers, kwok's heartbeats."""
    cpu0, _ = proc_usage(pid)
    time.sleep(seconds)
    return (proc_usage(pid)[0] - cpu0) / seconds


def report(tallies: dict[str, Tally], count: int, threads: int, idle: float, sizes: dict[str, int]) -> None:
    figures = {
        name: (statistics.median(t.latencies) * 1e3, percentile(t.latencies, 0.9) * 1e3, t.wall_s,
               max(0.0, t.cpu_s - idle * t.wall_s) / count * 1e3)
        for name, t in tallies.items()
    }  # fmt: skip
    base = figures[BASELINE]
    print(f"\n{count} creates per kind from {threads} client thread(s); ratios against {BASELINE}:")
    print(f"{'kind':18s} {'stored':>7s} {'p50':>8s} {'p90':>8s} {'wall':>7s} {'API CPU':>10s}   "
          f"{'p50':>5s} {'p90':>5s} {'wall':>5s} {'CPU':>5s}")  # fmt: skip
    for name, (p50, p90, wall, cpu) in figures.items():
        ratios = " ".join(
            f"{value / ref:5.2f}" for value, ref in zip((p50, p90, wall, cpu), base, strict=True)
        )
        print(f"{name:18s} {sizes.get(name, 0):6d}B {p50:6.2f}ms {p90:6.2f}ms {wall:6.2f}s "
              f"{cpu:6.2f}ms/op   {ratios}")  # fmt: skip


def profile_all(
    kubeconfig: str, custom: client.CustomObjectsApi, namespace: str, kinds: list[Kind], seconds: int,
    threads: int, rounds: int,
) -> None:  # fmt: skip
    """Profiles of `seconds` per kind and round, the kinds taking turns, summed per kind."""
    print(f"\nkube-apiserver CPU per create by part of the create path, ms ({rounds} x {seconds} s of "
          f"profile per kind, {threads} threads; parts overlap: CEL (with its field lookups) and OpenAPI "
          "schema are within validate, smd type compare within managed fields):")  # fmt: skip
    sums = {kind.name: dict.fromkeys(["total", *PARTS], 0.0) for kind in kinds}
    made = dict.fromkeys(sums, 0)
    for turn in range(rounds):
        for kind in kinds:
            out = Path(f"/tmp/{namespace}-{kind.name}-{turn}.pprof")

            def one(name: str, kind: Kind = kind) -> object:
                return create(custom, namespace, kind, name)

            kubectl_cmd = ["kubectl", "--kubeconfig", kubeconfig]
            parts, n = profile(kubectl_cmd, out, seconds, one, f"prof{turn}-{kind.name}", threads)
            made[kind.name] += n
            for part, value in parts.items():
                sums[kind.name][part] += value
    print(f"{'kind':18s} {'creates':>7s} " + " ".join(f"{c[:12]:>12s}" for c in sums[kinds[0].name]))
    for name, parts in sums.items():
        print(
            f"{name:18s} {made[name]:7d} " + " ".join(f"{v / made[name] * 1e3:12.3f}" for v in parts.values())
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=1000, help="creates per kind and pass")
    parser.add_argument("--block", type=int, default=20, help="creates per turn of the round robin")
    parser.add_argument("--threads", type=int, default=4, help="client threads of the first pass")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--template", action="store_true", help="the job carries a worker pod template")
    parser.add_argument("--no-mpi", action="store_true", help="leave the MPIJob out")
    parser.add_argument("--profile-seconds", type=int, default=5, help="per kind and round; 0: no profiles")
    parser.add_argument("--profile-rounds", type=int, default=3)
    args = parser.parse_args()
    kubeconfig = kubeconfig_path()
    pid = apiserver_pid(kubeconfig)
    api = config.new_client_from_config(config_file=kubeconfig)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    install_crd(kubeconfig)  # the real one, beside which the copies go
    kinds = kinds_under_test(kubeconfig, args.template, not args.no_mpi)
    namespace = f"cc-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        sizes = warm_up(custom, namespace, kinds, 5)
        idle = idle_cpu_rate(pid, args.idle_seconds)
        shape = "with" if args.template else "without"
        print(f"kube-apiserver pid {pid}: {idle * 1e3:.1f} ms of CPU per second idle; per create below, net "
              f"of that; objects {shape} a worker pod template", flush=True)  # fmt: skip
        for threads in dict.fromkeys((args.threads, 1)):
            tallies = run_pass(custom, namespace, kinds, args.count, args.block, threads, pid)
            report(tallies, args.count, threads, idle, sizes)
        if args.profile_seconds and shutil.which("go"):
            profile_all(kubeconfig, custom, namespace, kinds, args.profile_seconds, args.threads,
                        args.profile_rounds)  # fmt: skip
        elif args.profile_seconds:
            print("no go on PATH: no profiles", flush=True)
    finally:
        crds = [f"{kind.plural}.{kind.group}" for kind in kinds]
        kubectl(kubeconfig, "delete", "crd", *crds, "--wait=false")  # with their objects, in the background
        core.delete_namespace(namespace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
