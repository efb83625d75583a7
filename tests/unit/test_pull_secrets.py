"""The installer's pull Secrets (DTJOB_IMAGE_PULL_SECRETS): read from the environment, added after the spec's
on the workers and the launcher, and given to the stager, whose image is the installer's too."""

from __future__ import annotations

from dtjob.config import load_config
from dtjob.desired.pods import launcher_job, worker_pod
from dtjob.desired.staging import staging_job
from dtjob.spec.parse import parse_spec

from tests.unit.operator_fixtures import job_body
from tests.unit.test_stager_job import OWNER, STAGE_FROM

CONFIG = load_config({"DTJOB_IMAGE_PULL_SECRETS": " registry-creds, ,mirror-creds,registry-creds"})


def test_the_installers_pull_secrets_follow_the_specs_on_every_pod() -> None:
    assert CONFIG.image_pull_secrets == ("registry-creds", "mirror-creds")
    volume = {"nfs": {"server": "10.0.0.4", "path": "/export"}, "mountPath": "/data"}
    dataset = {"source": "imagenet", "volume": volume, "dataDir": "/data/imagenet", "stageFrom": STAGE_FROM}
    body = job_body(imagePullSecrets=[{"name": "team-creds"}, {"name": "registry-creds"}], dataset=dataset)
    spec = parse_spec(body, CONFIG)
    assert spec.pull_secrets == ("team-creds", "registry-creds", "mirror-creds")
    worker = worker_pod(spec, OWNER, 0, 0)["spec"]
    launcher = launcher_job(spec, OWNER, 0)["spec"]["template"]["spec"]
    stager = staging_job(spec, OWNER, "stager:1")["spec"]["template"]["spec"]
    every = [{"name": n} for n in ("team-creds", "registry-creds", "mirror-creds")]
    assert worker["imagePullSecrets"] == every and launcher["imagePullSecrets"] == every
    assert stager["imagePullSecrets"] == [{"name": "registry-creds"}, {"name": "mirror-creds"}]


def test_without_any_the_pods_name_none() -> None:
    spec = parse_spec(job_body(), load_config({}))
    assert "imagePullSecrets" not in worker_pod(spec, OWNER, 0, 0)["spec"]
