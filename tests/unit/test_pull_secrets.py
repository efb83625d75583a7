"""The installer's pull Secrets (DTJOB_IMAGE_PULL_SECRETS): read from the environment, added after the spec's
on the workers and the launcher while they run only the installer's images, and given to the stager, whose
image is the installer's too. A job that brings its own image brings its own pull Secrets."""

from __future__ import annotations

from typing import Any

from dtjob.config import load_config
from dtjob.desired.pods import launcher_pod, worker_pod
from dtjob.desired.staging import staging_job
from dtjob.spec.parse import JobSpec, parse_spec

from tests.unit.operator_fixtures import job_body
from tests.unit.test_stager_job import OWNER, STAGE_FROM

CONFIG = load_config({
    "DTJOB_IMAGE_PULL_SECRETS": " registry-creds, ,mirror-creds,registry-creds",
    "DTJOB_IMAGE_PYTORCH": "myacr.azurecr.io/dtjob/horovod-pytorch:0.1.0",
    "DTJOB_STAGER_IMAGE": "myacr.azurecr.io/dtjob/stager:0.1.0",
})  # fmt: skip
INSTALLERS = ["registry-creds", "mirror-creds"]
VOLUME = {"nfs": {"server": "10.0.0.4", "path": "/export"}, "mountPath": "/data"}
STAGED = {"source": "imagenet", "volume": VOLUME, "dataDir": "/data/imagenet", "stageFrom": STAGE_FROM}
# Another team's image in the installer's registry: the installer's credentials would pull it.
FOREIGN = "myacr.azurecr.io/team-b/private-model:3"


def pods(spec: JobSpec) -> dict[str, list[str]]:
    """The pull Secrets each pod of the job names."""
    specs = {
        "worker": worker_pod(spec, OWNER, 0, 0)["spec"],
        "launcher": launcher_pod(spec, OWNER, 0)["spec"],
    }
    if spec.dataset.staging is not None:
        specs["stager"] = staging_job(spec, OWNER, CONFIG.stager_image)["spec"]["template"]["spec"]
    return {role: [s["name"] for s in pod.get("imagePullSecrets") or ()] for role, pod in specs.items()}


def sidecar(image: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "exporter", "image": image}]}}


def test_the_installers_pull_secrets_follow_the_specs_on_pods_running_its_images() -> None:
    assert CONFIG.image_pull_secrets == tuple(INSTALLERS)
    body = job_body(imagePullSecrets=[{"name": "team-creds"}, {"name": "registry-creds"}], dataset=STAGED)
    spec = parse_spec(body, CONFIG)
    every = ["team-creds", *INSTALLERS]
    assert pods(spec) == {"worker": every, "launcher": every, "stager": INSTALLERS}
    assert spec.every_pull_secret == tuple(every)
    # Naming the installer's own image is running it.
    named = parse_spec(job_body(image=CONFIG.image_for("pytorch")), CONFIG)
    assert pods(named) == {"worker": INSTALLERS, "launcher": INSTALLERS}


def test_a_job_that_brings_its_own_image_gets_none_of_the_installers() -> None:
    """Before: every pod of every job got them, so any job could pull any image the installer's credentials
    reach (another team's private images in the same registry) by naming it in spec.image."""
    body = job_body(image=FOREIGN, imagePullSecrets=[{"name": "team-creds"}], dataset=STAGED)
    spec = parse_spec(body, CONFIG)
    # The stager still runs the installer's image, with the installer's Secrets.
    assert pods(spec) == {"worker": ["team-creds"], "launcher": ["team-creds"], "stager": INSTALLERS}
    assert spec.every_pull_secret == ("team-creds", *INSTALLERS)
    unstaged = parse_spec(job_body(image=FOREIGN), CONFIG)
    assert pods(unstaged) == {"worker": [], "launcher": []} and unstaged.every_pull_secret == ()


def test_a_template_container_of_another_image_keeps_them_off_that_pod_only() -> None:
    body = job_body(worker={"template": sidecar(FOREIGN)})
    assert pods(parse_spec(body, CONFIG)) == {"worker": [], "launcher": INSTALLERS}
    init = {"spec": {"initContainers": [{"name": "fetch", "image": FOREIGN}]}}
    body = job_body(launcher={"template": init})
    assert pods(parse_spec(body, CONFIG)) == {"worker": INSTALLERS, "launcher": []}
    # A sidecar of the installer's own images keeps them.
    body = job_body(worker={"template": sidecar(CONFIG.stager_image)})
    assert pods(parse_spec(body, CONFIG))["worker"] == INSTALLERS


def test_without_any_the_pods_name_none() -> None:
    spec = parse_spec(job_body(), load_config({}))
    assert "imagePullSecrets" not in worker_pod(spec, OWNER, 0, 0)["spec"]
