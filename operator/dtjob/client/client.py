"""Client: create, follow and clean up DistributedTrainingJobs from Python (a notebook, a pipeline step, an
Airflow task), with the `dtjob` commands' own code underneath: the same kubeconfig resolution, job reads, log
follower and results download, and the operator's own spec parser checking a job before it is sent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtjob.cli import kube_access
from dtjob.cli.results import Downloaded, download_results
from dtjob.client.errors import JobNotFound, of_code
from dtjob.client.job_input import JobInput, manifest, validate
from dtjob.client.log_lines import LogOptions, log_lines
from dtjob.client.status import FINISHED_PHASES, JobStatus, progress_line
from dtjob.client.waiting import Until, Waiter
from dtjob.contract.transfer_report import ExitCode


@contextmanager
def translated() -> Iterator[None]:
    """The commands' failures (KubeFailure, StorageFailure) raised as the client's own (DtjobError)."""
    from dtjob.azure.errors import StorageFailure

    try:
        yield
    except (kube_access.KubeFailure, StorageFailure) as err:
        raise of_code(err.code, err.reason) from None


@dataclass(frozen=True)
class JobRef:
    """A job this client created (or named): what every method accepts besides a name."""

    name: str
    namespace: str
    uid: str


JobArg = str | JobRef | JobStatus
Report = Callable[[JobStatus], None]


class Client:
    """One namespace of one cluster, chosen as kubectl and `dtjob` choose: `kubeconfig` (else $KUBECONFIG,
    else ~/.kube/config), its `context` (else the current one), `namespace` (else the context's, else
    default)."""

    def __init__(
        self, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
    ) -> None:
        with translated():
            self._cluster = kube_access.connect_to(kubeconfig, context, namespace)
        self.namespace = self._cluster.namespace
        self.poll_interval_s = 2.0

    def create(self, job: JobInput, name: str | None = None) -> JobRef:
        """Create the job: a manifest or its spec (a dict), YAML text, or a YAML file's path. Checked by the
        operator's spec parser first: InvalidJob naming the field, nothing sent."""
        body = manifest(job, name, self.namespace)
        validate(body)
        with translated():
            created = self._cluster.create_job(body)
        meta = created["metadata"]
        return JobRef(str(meta["name"]), str(meta["namespace"]), str(meta["uid"]))

    def status(self, job: JobArg) -> JobStatus:
        with translated():
            return JobStatus.from_job(self._read(job))

    def wait(
        self,
        job: JobArg,
        until: Until = FINISHED_PHASES,
        timeout: float | None = None,
        progress: Report | bool = False,
    ) -> JobStatus:
        """Poll the job until `until` holds (a phase, phases, or a predicate of its JobStatus); the final
        status. `progress`: a callable given each status that differs from the last, or True to print a line
        for each. WaitTimeout (a TimeoutError, carrying the last status) after `timeout` seconds."""
        report: Report | None = _printer if progress is True else (progress or None)
        waiter = Waiter(lambda: self.status(job), time.sleep, time.monotonic, self.poll_interval_s)
        return waiter.wait(until, timeout, report)

    def logs(self, job: JobArg, follow: bool = False, **options: Any) -> Iterator[str]:
        """The launcher's log (every rank's output), line by line, as `dtjob logs` prints it: live from the
        pod, following it across world restarts to the job's end with `follow`; once the pods are gone, the
        copy the operator uploaded. `options`: LogOptions' (worker, attempt, container, tail, since_seconds,
        timestamps, sas, account_key)."""
        name = self._name(job)
        lines = log_lines(self._cluster, name, LogOptions(follow=follow, **options))
        with translated():
            yield from lines

    def results(self, job: JobArg) -> Results:
        return Results(self._cluster, self._name(job))

    def delete(self, job: JobArg, wait: bool = False, timeout: float | None = None) -> None:
        """Delete the job (its pods and other children go with it). `wait`: until the job is gone."""
        name = self._name(job)
        with translated():
            self._cluster.delete_job(name)
        if not wait:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._exists(name):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {name} is still there {timeout:g}s after its delete")
            time.sleep(min(self.poll_interval_s, 1.0))

    def _exists(self, name: str) -> bool:
        try:
            with translated():
                self._cluster.read_job(name)
        except LookupError:
            return False
        return True

    def _name(self, job: JobArg) -> str:
        if isinstance(job, str):
            return job
        if job.namespace != self.namespace:
            raise ValueError(
                f"job {job.name} is in namespace {job.namespace}; this client's is {self.namespace}"
            )
        return job.name

    def _read(self, job: JobArg) -> dict[str, Any]:
        """The job; JobNotFound when a handle's job was deleted and another of its name made since."""
        read = self._cluster.read_job(self._name(job))
        if not isinstance(job, str) and job.uid and read["metadata"]["uid"] != job.uid:
            raise JobNotFound(
                f"job {job.name} was deleted and another of its name created since (uid {job.uid})",
                ExitCode.NOT_FOUND,
            )
        return read


def _printer(status: JobStatus) -> None:
    print(progress_line(status), file=sys.stdout, flush=True)


@dataclass(frozen=True)
class Results:
    """A job's results in Blob Storage (its run under spec.output), read with the caller's credentials."""

    cluster: kube_access.Cluster
    job: str

    def download(
        self,
        dest: str | Path,
        with_logs: bool = False,
        sas: str | None = None,
        account_key: str | None = None,
        concurrency: int = 8,
        show_progress: bool = False,
    ) -> Downloaded:
        """As `dtjob results download`: into `dest` (created if missing), resumable; a SAS (else
        $AZURE_STORAGE_SAS_TOKEN), an account key (else $AZURE_STORAGE_KEY) or the Entra ID identity."""
        with translated():
            job = self.cluster.read_job(self.job)
            return download_results(job, Path(dest), sas, account_key, concurrency, with_logs, show_progress)
