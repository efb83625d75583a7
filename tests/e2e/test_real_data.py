"""Data on volumes, for real: ILSVRC2012-style tarballs prepared into Azurite by
`dtjob data prepare-imagenet`, staged onto a PVC by the stager Job and trained on by two workers; and a world
that loses a rank mid-training, restarts and resumes from rank 0's checkpoint on a checkpoints claim.

The claims are bound to hostPath PersistentVolumes (this machine has no kernel NFS client); both nodes share
the machine's filesystem, so a claim reads the same on either node, as an NFS share would on AKS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.conftest import NODE_IP
from tests.e2e.real_jobs import (
    assert_trained_together,
    at,
    blob_names,
    blob_text,
    create_tiny_job,
    live_launcher_records,
    new_container,
    output_location,
    paced_workers,
    progress_records,
    run_metrics,
    tiny_model,
    tiny_training,
    wait_finished,
)
from tests.imagenet_tarballs import images_of_tree, make_tarballs
from tests.training.training_helpers import make_tree

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def host_path_claim(jobs: Jobs, name: str, directory: Path) -> str:
    """A PVC bound to a hostPath PV on `directory` (writable by the images' users, as an export would be)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o777)
    pv_name = f"{jobs.ns}-{name}"
    jobs.core.create_persistent_volume(
        client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=pv_name, labels={"dtjob.io/test": "true"}),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"},
                access_modes=["ReadWriteMany"],
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                host_path=client.V1HostPathVolumeSource(path=str(directory), type="Directory"),
                claim_ref=client.V1ObjectReference(namespace=jobs.ns, name=name),
            ),
        )
    )
    jobs.core.create_namespaced_persistent_volume_claim(
        jobs.ns,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteMany"],
                storage_class_name="",
                volume_name=pv_name,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        ),
    )
    return name


@pytest.fixture
def claims(real_jobs: Jobs) -> Any:
    made: list[str] = []
    yield made
    for pv in made:
        real_jobs.core.delete_persistent_volume(pv)


def prepare_imagenet(azurite: Azurite, container: str, tree: Path, workdir: Path, prefix: str) -> int:
    """The dataset as a user makes it: the tree packed as ILSVRC2012's tarballs (per-class tars in the train
    tar, a flat val tar and its labels), then `dtjob data prepare-imagenet` straight into Blob Storage."""
    mini = make_tarballs(workdir, images_of_tree(tree))
    argv = [
        *("data", "prepare-imagenet", "--train-tar", str(mini.train_tar), "--val-tar", str(mini.val_tar)),
        *("--val-labels", str(mini.labels["wnid-per-line"]), "--endpoint", azurite.endpoint),
        *("--container", container, "--prefix", prefix, *mini.expect_args()),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'operator'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "AZURE_STORAGE_KEY": azurite.account_key,
        "DTJOB_EMULATOR_HOSTS": NODE_IP,
    }
    command = [sys.executable, "-m", "dtjob", *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("check: complete"), done.stdout
    return len(mini.expected)


def test_imagenet_tree_is_staged_from_blob_onto_a_claim_and_trained_on(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    tmp_path: Path,
    claims: list[str],
) -> None:
    datasets = new_container(node_azurite)
    results = new_container(node_azurite)
    tree = make_tree(tmp_path / "tree", per_class_train=8, per_class_val=2)
    uploaded = prepare_imagenet(node_azurite, datasets, tree, tmp_path / "tarballs", "ilsvrc-mini")
    claim = host_path_claim(real_jobs, "imagenet", tmp_path / "export")
    claims.append(f"{real_jobs.ns}-{claim}")
    name = "staged"
    started = time.monotonic()
    create_tiny_job(
        real_jobs,
        name,
        node_azurite,
        results,
        dataset={
            "source": "imagenet",
            "volume": {"persistentVolumeClaim": {"claimName": claim}, "mountPath": "/data"},
            "dataDir": "/data/imagenet",
            "stageFrom": {
                **output_location(node_azurite, datasets),
                "prefix": "ilsvrc-mini",
            },
        },
        **tiny_model(),
    )
    # The Staging phase comes first, then the workers train on what the stager wrote.
    real_jobs.wait_phase(name, "Staging", "Starting", "Running", "Succeeded", "Failed", timeout=300)
    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=results)
    print(f"[e2e] staged imagenet job succeeded in {time.monotonic() - started:.0f}s")
    staged = [p for p in (tmp_path / "export" / "imagenet").rglob("*") if p.is_file()]
    assert len(staged) >= uploaded, sorted(str(p) for p in staged)
    assert (tmp_path / "export" / "imagenet" / "train").is_dir()
    assert not (tmp_path / "export" / "imagenet" / "_prepare").exists()  # the markers stay in Blob Storage
    # The stager's own final report, read back from its pod into status.staging.
    assert status["staging"]["phase"] == "done", status["staging"]
    assert status["staging"]["filesTotal"] == uploaded, status["staging"]
    assert status["staging"]["filesCompleted"] + status["staging"]["filesSkipped"] == uploaded
    metrics = run_metrics(node_azurite, results, real_jobs, name)
    assert metrics["data"] == "imagenet"
    assert_trained_together(metrics)


def _kill_rank(jobs: Jobs, pod: str) -> int:
    """SIGKILL the training process in a worker, as an OOM kill or a crash would end it; how many it killed
    (the exec's output: a failed exec or a rank already gone must not pass for a kill)."""
    # "dtjob[_]train" matches the ranks' command lines, not this shell's own (which holds the pattern).
    script = (
        "n=0; for p in /proc/[0-9]*; do "
        'if tr "\\0" " " < $p/cmdline 2>/dev/null | grep -q "dtjob[_]train"; '
        "then kill -9 ${p#/proc/} && n=$((n+1)); fi; "
        "done; echo killed=$n"
    )
    from kubernetes.stream import stream

    said = stream(
        jobs.core.connect_get_namespaced_pod_exec,
        pod,
        jobs.ns,
        command=["/bin/sh", "-c", script],
        stderr=True,
        stdout=True,
        stdin=False,
        tty=False,
    )
    found = re.search(r"killed=(\d+)", str(said))
    assert found, f"the kill in {pod} said: {said!r}"
    return int(found.group(1))


def test_a_lost_rank_restarts_the_world_which_resumes_from_the_checkpoint(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    tmp_path: Path,
    claims: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A fixed world's answer to a lost rank, which test_real_elastic.py's elastic world is measured against:
    a restart, counted, from the last epoch checkpoint; printed: seconds from the kill to training again, and
    the steps redone."""
    results = new_container(node_azurite)
    claim = host_path_claim(real_jobs, "checkpoints", tmp_path / "checkpoints")
    claims.append(f"{real_jobs.ns}-{claim}")
    name = "resume"
    # resnet-tiny on paced workers (a step or two a second): the second epoch, when a rank is killed, lasts
    # long enough for the kill to land while the world trains, at a fraction of ResNet-50's CPU.
    epochs, steps = 3, 40
    create_tiny_job(
        real_jobs,
        name,
        node_azurite,
        results,
        hyperparameters=tiny_training(epochs=epochs, stepsPerEpoch=steps),
        **tiny_model(),
        **paced_workers(),
        checkpoints={"persistentVolumeClaim": {"claimName": claim}, "mountPath": "/checkpoints"},
        runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 1500, "cleanPodPolicy": "Running"},
    )

    def in_second_epoch() -> bool:
        status = real_jobs.status(name)
        assert status.get("phase") not in ("Succeeded", "Failed"), json.dumps(status, indent=1)
        records = live_launcher_records(real_jobs, name)
        return status.get("restarts", 0) == 0 and bool(records) and int(records[-1].get("epoch") or 0) >= 2

    wait_for(in_second_epoch, timeout=900, interval=0.5, what=f"{name} training its second epoch")
    killed_at = time.time()
    killed = _kill_rank(real_jobs, f"{name}-worker-1")
    assert killed >= 1, f"nothing to kill in {name}-worker-1: {json.dumps(real_jobs.status(name))}"

    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=results)
    assert status["restarts"] == 1, json.dumps(status, indent=1)
    metrics = run_metrics(node_azurite, results, real_jobs, name)
    # Resumed from the checkpoint of an epoch the first world finished, not restarted from step 0.
    assert metrics["resumedFromEpoch"] >= 1, metrics
    assert metrics["epochsDone"] == epochs
    assert metrics["weightsConsistent"] is True
    uid = real_jobs.get(name)["metadata"]["uid"]
    run = f"runs/{real_jobs.ns}/{name}/{uid}/"
    names = blob_names(node_azurite, results, run)
    failed_attempt = [n for n in names if n.startswith(f"{run}logs/attempt-0/")]
    assert f"{run}logs/attempt-0/{name}-worker-1.log" in failed_attempt, names
    final_launcher = [n for n in names if n.startswith(f"{run}logs/{name}-launcher")]
    assert final_launcher, names
    assert "resuming from" in blob_text(node_azurite, results, final_launcher[0])
    before = progress_records(real_jobs, node_azurite, results, name, attempt=0)
    after = progress_records(real_jobs, node_azurite, results, name)[0]
    done = (int(before[-1]["epoch"]) - 1) * steps + int(before[-1]["step"])
    resumed = (int(after["epoch"]) - 1) * steps + int(after["step"]) - 1
    with capsys.disabled():  # in the run's output even when the test passes
        print(
            f"\n[e2e] fixed-size pytorch: training again {at(after) - killed_at:.1f}s after a rank was "
            f"killed, after a world restart from the epoch checkpoint; {max(0, done - resumed)} step(s) "
            "redone; restarts 1"
        )
