"""`dtjob logs JOB [-f] [--worker N | --launcher | --stager] [--attempt N] [-c NAME] [--tail N] [--since 5m]
[--timestamps]`: a job's log, live or uploaded.

Live: the log of the launcher's pod (every rank's output), of one worker's, or of the stager's (the staging
Job's pod that copies spec.dataset.stageFrom onto the data volume), through the API server as `kubectl logs`
reads it, with kubectl's -c, --tail, --since and --timestamps passed to the pods/log API. With -f it keeps
following: across a world restart (the next world's pod, announced on stderr) until the job ends; the stager's
across the staging Job's retries until staging ends.
Once the pods are gone, the copy the operator uploaded under the job's output (`logs/`, or
`logs/attempt-<n>/` for a world a restart replaced), read with the caller's own credentials: --tail applies to
it; it has no timestamps, so --since and --timestamps cannot (stderr says so), and it holds the operator's own
container only. The stager's log is not uploaded: once its pods are gone the command says so, and how staging
ended.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, BinaryIO

from dtjob import names
from dtjob.azure.errors import StorageFailure, describe_storage_error
from dtjob.cli import blob_access as blob_cli
from dtjob.cli import kube_access as kube_cli
from dtjob.cli.log_target import (
    LogPosition,
    LogTarget,
    has_ended,
    newest_pod,
    split_stamp,
    staging_outcome,
    staging_over,
    uploaded_log,
)
from dtjob.cli.run_location import FINISHED_PHASES, run_location
from dtjob.contract.transfer_report import ExitCode
from dtjob.timefmt import parse_duration

POLL_S = 2.0
# A followed stream quiet this long is dropped and opened again from where it was left: a stream can stay
# open after its pod is gone (a lost node), and only a fresh look at the pods tells.
IDLE_S = 15.0
# The longest line printed whole; a longer one is cut there and marked, the rest of it is skipped.
MAX_LINE_BYTES = 1024 * 1024
CUT_MARKER = b" [... line cut by dtjob logs]"


def register(subparsers: Any) -> None:
    logs = subparsers.add_parser(
        "logs", help="a job's launcher, worker or stager log, live (-f follows) or uploaded"
    )
    logs.add_argument("job", metavar="JOB", help="the DistributedTrainingJob's name")
    which = logs.add_mutually_exclusive_group()
    which.add_argument(
        "--launcher",
        action="store_true",
        help="the launcher's log: every rank (default; a torchrun job has none: worker 0's is its default)",
    )
    which.add_argument(
        "--worker", type=int, metavar="N", help="worker N's log (its sshd, or a torchrun job's ranks)"
    )
    which.add_argument(
        "--stager", action="store_true",
        help="the stager's log: the staging Job's pod that copies spec.dataset.stageFrom onto the data "
        "volume (live only: the operator does not upload it)",
    )  # fmt: skip
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep following, across restarts, to the end"
    )
    logs.add_argument(
        "--attempt",
        type=int,
        metavar="N",
        help="world N (0 is the first; status.restarts is the current one)",
    )
    logs.add_argument(
        "-c", "--container", metavar="NAME",
        help="this container of the pod (a sidecar from the pod template); default: the launcher's or the "
        "worker's own",
    )  # fmt: skip
    logs.add_argument(
        "--tail", type=int, default=-1, metavar="N",
        help="only the last N lines of the log (the uploaded copy too), then what follows; -1: all (default)",
    )  # fmt: skip
    logs.add_argument(
        "--since", type=_duration, metavar="DURATION",
        help="only lines newer than this, like 5s, 2m or 3h (live logs only)",
    )  # fmt: skip
    logs.add_argument(
        "--timestamps", action="store_true", help="prefix each line with its RFC 3339 time (live logs only)"
    )
    kube_cli.add_kube_args(logs)
    blob_cli.add_credential_args(
        logs, sas_needs=" with read and list (uploaded logs)", key_use=" (uploaded logs)"
    )
    logs.set_defaults(func=run_logs)


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run_logs(args: argparse.Namespace) -> int:
    if (args.worker is not None and args.worker < 0) or (args.attempt is not None and args.attempt < 0):
        print("dtjob logs: --worker and --attempt are 0 or more", file=sys.stderr)
        return int(ExitCode.USAGE)
    if args.tail < -1:
        print("dtjob logs: --tail is 0 or more, or -1 for all", file=sys.stderr)
        return int(ExitCode.USAGE)
    if args.stager and args.attempt is not None:
        print("dtjob logs: --attempt names a world; the stager runs once, before the first", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        cluster = kube_cli.connect(args)
        target = LogTarget(args.job, args.worker, stager=args.stager)
        follower = Follower(cluster, target, args, sys.stdout.buffer)
        return follower.run()
    except (kube_cli.KubeFailure, StorageFailure) as err:
        print(f"dtjob logs: {err}", file=sys.stderr)
        return int(err.code)
    except KeyboardInterrupt:
        return 130


class Follower:
    """Streams one target's log; remembers how far it printed each pod's log, so a reconnect to the same pod
    (a stream the API server closed while the container runs) prints only what is new."""

    def __init__(self, cluster: kube_cli.Cluster, target: LogTarget, args: argparse.Namespace, out: BinaryIO):
        self.cluster = cluster
        self.target = target
        self.args = args
        self.out = out
        self.container: str = args.container or target.container
        self.tail: int | None = args.tail if args.tail >= 0 else None
        self.printed: dict[str, LogPosition] = {}  # pod uid -> how far its log was printed

    def run(self) -> int:
        job = self.cluster.read_job(self.target.job)
        self._rank0_of_torchrun(job)
        current = int((job.get("status") or {}).get("restarts") or 0)
        if self.args.attempt is not None and self.args.attempt > current:
            raise StorageFailure(
                ExitCode.USAGE, f"--attempt {self.args.attempt}: the job is at attempt {current}"
            )
        if self.target.stager and not ((job.get("spec") or {}).get("dataset") or {}).get("stageFrom"):
            raise StorageFailure(
                ExitCode.NOT_FOUND,
                f"job {self.target.job} stages no dataset (no spec.dataset.stageFrom): it has no stager",
            )
        while True:
            pod = newest_pod(self._pods(), self.args.attempt)
            if pod is not None:
                uid = str(pod["metadata"]["uid"])
                if self.printed and uid not in self.printed:
                    # The stager's next pod is the staging Job's retry, not another world.
                    world = "" if self.target.stager else f" (world {pod_attempt(pod)})"
                    say(f"--- {pod['metadata']['name']}{world} ---")
                finished = self._stream(pod)
                if not self.args.follow or (finished and self.args.attempt is not None):
                    return 0
            elif not self.printed:
                if self._uploaded(job):
                    return 0
                if not self.args.follow:
                    phase = (job.get("status") or {}).get("phase") or "Pending"
                    copy = " and no uploaded log" if self.target.uploaded else ""
                    raise StorageFailure(
                        ExitCode.NOT_FOUND,
                        f"{self.target.describe()} of job {self.target.job} has no pod yet{copy} "
                        f"(phase {phase}); -f waits for it",
                    )
            job = self.cluster.read_job(self.target.job)
            if self._over(job) and (pod is None or has_ended(pod)):
                return 0
            time.sleep(POLL_S)

    def _rank0_of_torchrun(self, job: Mapping[str, Any]) -> None:
        """A torchrun job has no launcher: every worker's log holds its own ranks' output, and by default the
        log followed is worker 0's, where rank 0 runs."""
        if self.target.role != names.ROLE_LAUNCHER or "torchrun" not in (job.get("spec") or {}):
            return
        if self.args.launcher:
            raise StorageFailure(
                ExitCode.USAGE,
                f"job {self.target.job} runs under torchrun and has no launcher: each worker's log holds its "
                "own ranks' output (rank 0's is worker 0's, the default; --worker N for another)",
            )
        self.target = LogTarget(self.target.job, 0)
        self.container = self.args.container or self.target.container

    def _over(self, job: Mapping[str, Any]) -> bool:
        """Whether no new pod of the target can come: the job has ended; for the stager, staging has."""
        if self.target.stager:
            return staging_over(job)
        return (job.get("status") or {}).get("phase") in FINISHED_PHASES

    def _pods(self) -> list[dict[str, Any]]:
        from kubernetes import client

        pods = self.cluster.call(
            f"listing the pods of job {self.target.job}",
            lambda: client.CoreV1Api(self.cluster.api).list_namespaced_pod(
                self.cluster.namespace, label_selector=self.target.label_selector()
            ),
        )
        return [self.cluster.api.sanitize_for_serialization(p) for p in pods.items]

    def _stream(self, pod: Mapping[str, Any]) -> bool:
        """Print the pod's log from where this follower left it; True once the container has ended and its
        whole log is printed. A container not started yet prints nothing and counts as not ended."""
        import urllib3
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        what = f"reading the log of {meta['name']}"
        self._check_container(pod)
        position = self.printed.setdefault(str(meta["uid"]), LogPosition())
        now = time.monotonic()
        options = position.request(self.tail, self.args.since, now)
        try:
            # Always with timestamps: they place each line for a reconnect (LogPosition); printed only with
            # --timestamps.
            response: Any = client.CoreV1Api(self.cluster.api).read_namespaced_pod_log(
                meta["name"],
                self.cluster.namespace,
                container=self.container,
                follow=self.args.follow,
                timestamps=True,
                _preload_content=False,
                tail_lines=options.get("tail_lines"),
                since_seconds=options.get("since_seconds"),
                _request_timeout=(10.0, IDLE_S),
            )
        except ApiException as err:
            if err.status in (400, 404):  # not started yet (ContainerCreating), or already gone
                return False
            raise kube_cli.api_failure(err, what) from None
        except Exception as err:
            failure = kube_cli.unreachable(err, what)
            if failure is None:
                raise
            raise failure from None
        position.opened(now)
        try:
            for line in _lines(response.stream(64 * 1024, decode_content=True)):
                stamp, text = split_stamp(line)
                if position.admit(stamp):
                    self.out.write(line if self.args.timestamps else text)
                    self.out.flush()
        except (urllib3.exceptions.HTTPError, OSError):
            return False  # broke or went quiet: the next pass looks at the pods again, then reconnects
        finally:
            response.release_conn()
        return has_ended(pod) or not self.args.follow

    def _check_container(self, pod: Mapping[str, Any]) -> None:
        """-c must name one of the pod's containers (its sidecars are init containers of the launcher's pod):
        the API server's 400 for another would read as a container not started yet."""
        if self.args.container is None:
            return
        spec = pod.get("spec") or {}
        names = [str(c.get("name")) for key in ("containers", "initContainers") for c in spec.get(key) or ()]
        if self.container not in names:
            name = pod["metadata"]["name"]
            raise kube_cli.KubeFailure(
                ExitCode.NOT_FOUND,
                f"pod {name} has no container {self.container!r} (it has {', '.join(names)})",
            )

    def _uploaded(self, job: Mapping[str, Any]) -> bool:
        """Print the uploaded copy of the target's log, if the job has one; False when there is none (yet).
        The stager's log has none: NOT_FOUND once staging has ended, so that no one waits for it."""
        if not self.target.uploaded:
            self._stager_gone(job)
            return False
        if not (job.get("spec") or {}).get("output"):
            return False
        # The final world's logs are uploaded as the job ends; a replaced world's before its restart.
        uploaded = ((job.get("status") or {}).get("output") or {}).get("logsUploaded")
        if self.args.attempt is None and not uploaded:
            return False
        if self.container != self.target.container:
            raise StorageFailure(
                ExitCode.NOT_FOUND,
                f"the pods of job {self.target.job} are gone, and the operator uploads the log of their "
                f"{self.target.container} container only, not {self.container}'s",
            )
        from dtjob.azure.clients import container_client

        spec_output, run = run_location(dict(job))
        target = spec_output.target
        credential, hint = blob_cli.credential(self.args.sas, self.args.account_key, target.account_name)
        blobs = container_client(target.container_url, credential, 2)
        folder = names.logs_folder(run, self.args.attempt)
        try:
            found = uploaded_log(
                self.target, [b.name for b in blobs.list_blobs(name_starts_with=folder)], folder
            )
            if found is None:
                return False
            self._say_what_cannot_apply()
            say(f"--- {found[len(folder) :]} (uploaded to {target.container_url}/{folder}) ---")
            download = blobs.download_blob(found)
            if self.tail is None:  # line by line, as a live log: a line past MAX_LINE_BYTES is cut
                self.out.writelines(_lines(download.chunks()))
            else:
                self.out.writelines(deque(_lines(download.chunks()), maxlen=self.tail))
        except Exception as err:
            raise describe_storage_error(err, f"container {target.container}", hint) from None
        self.out.flush()
        return True

    def _stager_gone(self, job: Mapping[str, Any]) -> None:
        """Once staging has ended with no stager pod left (its node scaled away, the Job deleted), its log is
        nowhere to be read: say so, and what the job says of how staging ended. Before that, nothing."""
        if not staging_over(job):
            return
        raise StorageFailure(
            ExitCode.NOT_FOUND,
            f"the stager's pods of job {self.target.job} are gone, and the operator does not upload the "
            f"stager's log (only the launcher's and the workers'); {staging_outcome(job)}",
        )

    def _say_what_cannot_apply(self) -> None:
        """The uploaded copy was read without timestamps: --since and --timestamps have nothing to go by."""
        shown = "all of it" if self.tail is None else f"its last {self.tail} line(s)"
        if self.args.since is not None:
            say(f"dtjob logs: --since cannot apply to the uploaded log (no timestamps); printing {shown}")
        if self.args.timestamps:
            say("dtjob logs: --timestamps cannot apply to the uploaded log (no timestamps)")


def pod_attempt(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(names.ATTEMPT_LABEL, "?"))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _lines(chunks: Iterable[bytes], max_line: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Whole lines from a byte stream (the last one even without its newline). A line longer than `max_line`
    is cut: its first `max_line` bytes, then CUT_MARKER and the newline; the rest of it is dropped as it
    arrives, so a pod that prints endlessly without a newline never makes this hold more than a chunk and
    `max_line` bytes."""
    pending = b""
    dropping = False  # inside a line already cut: skip up to its newline
    for chunk in chunks:
        while chunk:
            end = chunk.find(b"\n")
            if dropping:
                if end < 0:
                    break
                dropping, chunk = False, chunk[end + 1 :]
                continue
            if end < 0:
                pending += chunk[: max_line + 1 - len(pending)]
                chunk = b""
            else:
                pending += chunk[: min(end, max_line + 1 - len(pending))]
                if len(pending) <= max_line:
                    yield pending + b"\n"
                    pending, chunk = b"", chunk[end + 1 :]
                    continue
                chunk = chunk[end:]  # the newline ends the cut line below
            if len(pending) > max_line:
                yield pending[:max_line] + CUT_MARKER + b"\n"
                pending, dropping = b"", True
    if pending:
        yield pending
