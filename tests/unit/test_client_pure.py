"""The Python client's pure parts: reading a job given as a dict, a spec, YAML text or a file, and refusing
bad input naming the field before anything is sent; the typed status view; waiting with a predicate, on a
clock of the test's own."""

from __future__ import annotations

import importlib.util
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
from dtjob.client import InvalidJob, JobStatus, WaitTimeout, progress_line
from dtjob.client.job_input import manifest, validate
from dtjob.client.log_lines import Closed, LineSink
from dtjob.client.waiting import Waiter

SPEC = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4, "dataset": {"source": "synthetic"}}
MANIFEST = {
    "apiVersion": "dtjob.io/v1alpha1",
    "kind": "DistributedTrainingJob",
    "metadata": {"name": "r50"},
    "spec": SPEC,
}
YAML = """apiVersion: dtjob.io/v1alpha1
kind: DistributedTrainingJob
metadata:
  name: r50
spec:
  framework: pytorch
  workers: 2
  gpusPerWorker: 4
  dataset:
    source: synthetic
"""


def test_a_manifest_a_spec_yaml_text_and_a_file_become_the_same_job(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(YAML)
    expected = {**MANIFEST, "metadata": {"name": "r50", "namespace": "ml"}}
    assert manifest(MANIFEST, namespace="ml") == expected
    assert manifest(SPEC, name="r50", namespace="ml") == expected
    assert manifest({"spec": SPEC}, name="r50", namespace="ml") == expected
    assert manifest(YAML, namespace="ml") == expected
    assert manifest(path, namespace="ml") == expected
    assert manifest(str(path), namespace="ml") == expected
    assert manifest(MANIFEST, name="other", namespace="ml")["metadata"]["name"] == "other"
    assert MANIFEST["metadata"] == {"name": "r50"}, "the caller's dict is left as it was"
    assert validate(expected).total_slots == 8


@pytest.mark.parametrize(
    ("job", "name", "field"),
    [
        ({**SPEC, "workers": 0}, "r50", "spec.workers"),
        ({**SPEC, "gpusPerWorker": "four"}, "r50", "spec.gpusPerWorker"),
        ({**SPEC, "framework": "jax"}, "r50", "spec.framework"),
        ({**SPEC, "dataset": {"source": "synthetic", "stageFrom": 3}}, "r50", "spec.dataset.stageFrom"),
        (SPEC, "Not_A_Name", "metadata.name"),
        (SPEC, None, "metadata.name"),
        ({**MANIFEST, "kind": "MPIJob"}, None, "kind"),
        ({**MANIFEST, "metadata": {"name": "r50", "namespace": "elsewhere"}}, None, "metadata.namespace"),
        ("spec: [unclosed\n", "r50", "the job's YAML"),
        ("a: 1\n---\nb: 2\n", "r50", "the job's YAML"),
    ],
)
def test_bad_input_raises_naming_the_field(job: Any, name: str | None, field: str) -> None:
    with pytest.raises(InvalidJob) as raised:
        validate(manifest(job, name=name, namespace="ml"))
    assert raised.value.field == field, raised.value
    assert str(raised.value).startswith(f"{field}: ")
    assert isinstance(raised.value, ValueError)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidJob, match="cannot read it") as raised:
        manifest(tmp_path / "absent.yaml", namespace="ml")
    assert raised.value.field == str(tmp_path / "absent.yaml")


def job(phase: str | None = None, **status: Any) -> dict[str, Any]:
    if phase:
        status["phase"] = phase
    return {"metadata": {"name": "r50", "namespace": "ml", "uid": "u1"}, "status": status}


def test_the_status_view_reads_every_field_and_defaults_a_new_job() -> None:
    fresh = JobStatus.from_job(job())
    assert (fresh.phase, fresh.workers_ready, fresh.workers, fresh.restarts) == ("Pending", 0, 0, 0)
    assert fresh.progress is None and fresh.conditions == () and not fresh.finished

    progress = {"epoch": 1, "epochs": 3, "step": 7, "stepsPerEpoch": 20, "imagesPerSec": 41.2,
                "loss": 6.9021, "updatedAt": "2026-01-01T00:00:00Z", "percent": 11.6, "etaSeconds": 310,
                "summary": "epoch 1/3 step 7/20 41 img/s loss 6.902"}  # fmt: skip
    condition = {"type": "Ready", "status": "False", "reason": "Running", "message": "training"}
    running = JobStatus.from_job(
        job("Running", workers={"total": 2, "ready": 2}, workersReady="2/2", gpus=8, restarts=1,
            progress=progress, conditions=[condition], launcher={"state": "Running"},
            output={"url": "https://a.blob/x"}, message="2 ranks")
    )  # fmt: skip
    assert (running.workers_ready, running.workers, running.gpus, running.restarts) == (2, 2, 8, 1)
    assert running.progress is not None and running.progress.steps_per_epoch == 20
    assert running.progress.images_per_sec == 41.2 and running.progress.loss == 6.9021
    assert (running.progress.percent, running.progress.eta_seconds) == (11.6, 310)
    assert running.condition("Ready") is not None and running.condition("Ready").reason == "Running"
    assert running.launcher == "Running" and running.output_url == "https://a.blob/x"
    assert progress_line(running) == (
        "r50: Running, workers 2/2 ready, 1 restart(s), epoch 1/3 step 7/20 41 img/s loss 6.902 (2 ranks)"
    )
    assert JobStatus.from_job(job("Succeeded")).succeeded
    no_eta = JobStatus.from_job(job("Restarting", progress={**progress, "etaSeconds": None}))
    assert no_eta.progress is not None and no_eta.progress.eta_seconds is None
    with pytest.raises(AttributeError):
        running.phase = "Failed"  # type: ignore[misc]


class Script:
    """A job whose status moves along a script, one step per read, on a clock the sleeps advance."""

    def __init__(self, *phases: str) -> None:
        self.phases = list(phases)
        self.now = 0.0
        self.reads = 0

    def read(self) -> JobStatus:
        phase = self.phases[min(self.reads, len(self.phases) - 1)]
        self.reads += 1
        return JobStatus.from_job(job(phase))

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def waiter(self) -> Waiter:
        return Waiter(self.read, self.sleep, lambda: self.now, interval_s=2.0)


def test_wait_returns_the_first_status_the_predicate_accepts_and_reports_each_change() -> None:
    script = Script("Pending", "Pending", "Running", "Running", "Succeeded")
    seen: list[str] = []
    final = script.waiter().wait(lambda s: s.phase == "Running", on_change=lambda s: seen.append(s.phase))
    assert final.phase == "Running" and script.reads == 3 and script.now == 4.0
    assert seen == ["Pending", "Running"], "an unchanged status is reported once"

    assert Script("Pending", "Failed").waiter().wait().phase == "Failed"
    assert Script("Pending", "Running").waiter().wait("Running").phase == "Running"


def test_wait_times_out_with_the_last_status_and_never_sleeps_past_the_deadline() -> None:
    script = Script("Pending", "Running")
    with pytest.raises(WaitTimeout) as raised:
        script.waiter().wait(("Succeeded", "Failed"), timeout=5.0)
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.status.phase == "Running" and script.now == 5.0
    assert str(raised.value) == "job r50 is still Running after 5s"
    with pytest.raises(ValueError, match="no phase"):
        Script("Pending").waiter().wait(())


def test_the_python_example_job_passes_the_operators_checks() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "python_client.py"
    spec = importlib.util.spec_from_file_location("python_client_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(["--gpus", "0", "--namespace", "ml"])
    job = validate(manifest({**example.JOB, "gpusPerWorker": args.gpus}, name=args.name, namespace="ml"))
    assert (job.workers, job.gpus_per_worker, job.dataset.source) == (2, 0, "synthetic")


def test_the_log_sink_hands_over_whole_lines_and_stops_the_follower_once_the_reader_has() -> None:
    lines: queue.Queue[Any] = queue.Queue(maxsize=2)
    closed = threading.Event()
    sink = LineSink(lines, closed)
    sink.write(b"rank 0: ep")
    assert lines.empty(), "half a line waits for its end"
    sink.write(b"och 1\nrank 1: \xff\n")
    sink.finish()
    assert [lines.get_nowait(), lines.get_nowait()] == ["rank 0: epoch 1", "rank 1: \ufffd"]
    sink.write(b"no newline at the end")
    sink.finish()
    assert lines.get_nowait() == "no newline at the end"

    sink.writelines([b"a\n", b"b\n"])  # the queue is full now: the reader is behind
    closed.set()  # and stops reading
    with pytest.raises(Closed):
        sink.write(b"c\n")
