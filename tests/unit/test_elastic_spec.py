"""spec.elastic: its bounds and what it refuses, each naming the field; the elastic launcher (horovodrun with
--min-np/--max-np and the host discovery script); the discovery script and the search for the worker that
holds the results, run for real with stand-ins for getent and ssh on PATH (nothing leaves this machine)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from dtjob.desired import launcher_pod, worker_pod, workers_service
from dtjob.desired.command import find_elastic_rank0, mpi_command, training_flags
from dtjob.desired.world import elastic_discovery_script
from dtjob.spec.parse import SpecError

from tests.unit.operator_fixtures import job_spec

ELASTIC = {"minWorkers": 2, "maxWorkers": 4}
OWNER = {"apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob", "name": "rn50", "uid": "u1"}


def elastic(**spec: Any) -> Any:
    return job_spec(**{"workers": 3, "elastic": ELASTIC, **spec})


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"elastic": {"maxWorkers": 4}}, "spec.elastic.minWorkers", "is required"),
        ({"elastic": {"minWorkers": 4, "maxWorkers": 4}}, "spec.elastic.minWorkers", "<= spec.workers (3)"),
        ({"elastic": {"minWorkers": 1, "maxWorkers": 2}}, "spec.elastic.maxWorkers", ">= spec.workers (3)"),
        ({"elastic": {**ELASTIC, "timeoutSeconds": 0}}, "spec.elastic.timeoutSeconds", ">= 1"),
        ({"launcher": {"runner": "mpirun"}}, "spec.launcher.runner", "Gloo controller"),
        ({"launcher": {"mpiImplementation": "MPICH"}}, "spec.launcher.mpiImplementation", "Gloo"),
        ({"launcher": {"mpiArgs": ["-v"]}}, "spec.launcher.mpiArgs", "Gloo"),
        ({"launcher": {"runAsWorker": True}}, "spec.launcher.runAsWorker", "workers that are Ready"),
    ],
)
def test_what_an_elastic_job_cannot_have_is_refused_naming_the_field(
    spec: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as err:
        elastic(**spec)
    assert err.value.path == field and says in err.value.message


def test_the_defaults_and_the_bounds() -> None:
    spec = elastic()
    assert spec.elastic is not None and (spec.elastic.min_workers, spec.elastic.max_workers) == (2, 4)
    assert spec.elastic.timeout_seconds == 300
    assert job_spec().elastic is None


def test_the_launcher_runs_horovodrun_elastic_on_the_discovered_hosts() -> None:
    spec = elastic(slotsPerWorker=2)
    cmd = mpi_command(spec)
    assert cmd[:6] == ["horovodrun", "-np", "6", "--min-np", "4", "--max-np"] and cmd[6] == "8"
    assert cmd[cmd.index("--host-discovery-script") + 1] == "/etc/mpi/discover_hosts.sh"
    assert cmd[cmd.index("--elastic-timeout") + 1] == "360"  # the operator's restart comes first
    assert cmd[cmd.index("--gloo-timeout-seconds") + 1] == "120"  # a joining rank may take its time
    assert "--hostfile" not in cmd and cmd[-1] == "--elastic"
    assert "--elastic" in training_flags(spec) and "--elastic" not in training_flags(job_spec())
    assert "--commit-every" not in training_flags(spec)  # the trainers' default
    every = elastic(elastic={**ELASTIC, "commitEverySteps": 5})
    assert training_flags(every)[-3:] == ["--elastic", "--commit-every", "5"]
    script = launcher_pod(spec, OWNER, 0)["spec"]["containers"][0]["command"][2]
    assert "does not resolve" not in script  # no wait for every hostfile name: Horovod waits for --min-np


def test_only_ready_workers_are_published_and_every_worker_may_hold_rank_0() -> None:
    # The Service selects no pods; the operator's EndpointSlice marks only Ready ones ready (test_mpi_hosts).
    assert "selector" not in workers_service(elastic(), OWNER)["spec"]
    with_output = {"output": {"account": "acct1", "container": "results", "credentials": {
        "authMode": "accountKey", "secretRef": {"name": "k", "key": "azurestorageaccountkey"}}}}  # fmt: skip
    for index in (0, 2):
        mounts = worker_pod(elastic(**with_output), OWNER, index, 0)["spec"]["containers"][0]["volumeMounts"]
        assert any(m["name"].startswith("sas-") for m in mounts), index
    mounts = worker_pod(job_spec(**with_output), OWNER, 1, 0)["spec"]["containers"][0]["volumeMounts"]
    assert not any(m["name"].startswith("sas-") for m in mounts)


def run_sh(
    tmp_path: Path, script: str, tools: dict[str, str], **env: str
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    full = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["/bin/sh", "-c", script], env=full, text=True, capture_output=True, timeout=20)


# getent ahostsv4 prints each address three times (one per socket type), as glibc does.
AHOSTS = """[ "$1" = ahostsv4 ] && [ "$2" = rn50-workers.ml.svc ] || exit 2
[ -s "$ADDRESSES" ] || exit 2
while read -r ip; do printf '%s STREAM %s\\n%s DGRAM\\n%s RAW\\n' "$ip" "$2" "$ip" "$ip"; done < "$ADDRESSES"
"""


def test_the_discovery_script_lists_each_ready_address_once_with_its_slots(tmp_path: Path) -> None:
    addresses = tmp_path / "addresses"
    addresses.write_text("10.244.0.7\n10.244.0.9\n")
    script = elastic_discovery_script(elastic(slotsPerWorker=2))
    done = run_sh(tmp_path, script, {"getent": AHOSTS}, ADDRESSES=str(addresses), TMPDIR=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "10.244.0.7:2\n10.244.0.9:2\n")
    addresses.write_text("")  # the name does not resolve after hosts were found: a failed lookup
    done = run_sh(tmp_path, script, {"getent": AHOSTS}, ADDRESSES=str(addresses), TMPDIR=str(tmp_path))
    assert (done.returncode, done.stdout) == (1, ""), done
    assert "keeping the hosts found before" in done.stderr


def test_before_any_host_is_found_an_empty_lookup_is_an_empty_world(tmp_path: Path) -> None:
    """Horovod fails the job on a discovery error at its first look, so the script says "no hosts" until it
    has found some (horovodrun then waits for --min-np)."""
    addresses = tmp_path / "addresses"
    addresses.write_text("")
    script = elastic_discovery_script(elastic(slotsPerWorker=2))
    done = run_sh(tmp_path, script, {"getent": AHOSTS}, ADDRESSES=str(addresses), TMPDIR=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "")
    addresses.write_text("10.244.0.7\n")
    done = run_sh(tmp_path, script, {"getent": AHOSTS}, ADDRESSES=str(addresses), TMPDIR=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "10.244.0.7:2\n")


def test_the_results_are_uploaded_from_the_worker_that_holds_them(tmp_path: Path) -> None:
    # ssh HOST TEST: HOLDERS lists "host test-kind"; a host answers yes only to what it holds.
    ssh = 'grep -qx "$1 $(echo "$2" | cut -c1-7)" "$HOLDERS"\n'
    hosts = "echo 10.0.0.1:1; echo 10.0.0.2:1; echo 10.0.0.3:1\n"
    script = find_elastic_rank0().replace("sh /etc/mpi/discover_hosts.sh", "discover") + 'echo "$rank0"\n'
    holders = tmp_path / "holders"
    tools = {"ssh": ssh, "discover": hosts}
    holders.write_text("10.0.0.2 test -n\n10.0.0.3 test -e\n")  # .3 holds metrics.json: the final rank 0
    assert run_sh(tmp_path, script, tools, HOLDERS=str(holders)).stdout == "10.0.0.3\n"
    holders.write_text("10.0.0.2 test -n\n")  # a program of the user's: the first with any output
    assert run_sh(tmp_path, script, tools, HOLDERS=str(holders)).stdout == "10.0.0.2\n"
    holders.write_text("")
    done = run_sh(tmp_path, script, tools, HOLDERS=str(holders))
    assert done.returncode == 200 and "no Ready worker holds the results" in done.stderr
