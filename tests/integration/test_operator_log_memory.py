"""Pod logs uploaded in bounded memory: 64 workers (kwok pods) whose logs of megabytes each are served by the
simulated kubelet log server through the real API server, streamed by the operator into a real Azurite.

One test, two jobs, each with a fresh operator process: one whose workers wrote small logs, one whose workers
wrote about 9 MiB each (most over the cap the test sets, some within it). The operator's peak RSS (VmHWM) in
the second stays under the chart's memory limit and close to the first, where reading each log whole holds
them all at once (528 MiB of logs: a 671 MiB peak, measured); the blobs hold each log whole, or its head and
tail with the notes, and the one worker with no log to serve is listed in logsMissing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from azure.storage.blob import BlobServiceClient, ContainerClient
from dtjob.azure.logs import NOTE_PREFIX, LogSummary, omission_marker, truncation_note
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.sim_nodes import node
from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import REPO, Jobs, OperatorProcess
from testbed.sim_logs import serve_pod_log
from tests.azure.conftest import azurite, container_name  # noqa: F401  (fixtures: Azurite, a fresh name)
from tests.integration.test_operator_storage import key_secret, location

pytestmark = [pytest.mark.integration, pytest.mark.azure]

WORKERS = 64
# A simulated GPU pool of this test's own (8 nodes x 8 GPUs), so 64 one-GPU workers fit beside other tests.
POOL, POOL_NODES, POOL_VM = "logmem", 8, "Standard_ND96asr_v4"
CAP = 4 * 2**20  # the operator's log cap in this test (DTJOB_LOG_CAP_BYTES)
SMALL_LOG = 16 * 1024
BIG_LOG = 9 * 2**20  # over the cap ...
WITHIN_CAP = 3 * 2**20  # ... except every eighth worker's
LINE = 1000
CRI_PREFIX = "2025-01-01T00:00:00.000000000Z stdout F "  # kwok strips it, as a kubelet does


def limit_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert found, f"a memory limit in Ki, Mi or Gi: {quantity}"
    return int(found.group(1)) * units[found.group(2)]


CHART_LIMIT = limit_bytes(
    yaml.safe_load((REPO / "charts" / "dtjob" / "values.yaml").read_text())["resources"]["limits"]["memory"]
)


def log_lines(pod: str, size: int) -> Iterator[str]:
    """The lines of a pod's log (without line ends): HEAD and TAIL markers around numbered lines, `size` bytes
    in all with their line ends. Generated, so the expected blob is computed again, never stored."""
    yield f"HEAD {pod}"
    filler = "." * LINE
    written = len(f"HEAD {pod}\n") + len(f"TAIL {pod}\n")
    i = 0
    while written < size:
        line = f"{pod} line {i:07d} {filler}"[: min(LINE, size - written) - 1]
        written += len(line) + 1
        i += 1
        yield line
    yield f"TAIL {pod}"


def expected_log(pod: str, size: int) -> bytes:
    return "".join(f"{line}\n" for line in log_lines(pod, size)).encode()


def write_cri_log(path: Path, pod: str, size: int) -> None:
    with path.open("w") as out:
        out.writelines(f"{CRI_PREFIX}{line}\n" for line in log_lines(pod, size))


def peak_rss(pid: int) -> int:
    """VmHWM of a process: its resident set's high-water mark, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB$", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024


@pytest.fixture
def log_pool(core_v1: client.CoreV1Api, simulated_pool: Any) -> Iterator[str]:
    """Simulated GPU nodes for this test only, removed afterwards."""
    nodes = [node(POOL, i, POOL_VM, gpu=True) for i in range(POOL_NODES)]

    def ready() -> bool:
        found = core_v1.list_node(label_selector=f"kubernetes.azure.com/agentpool={POOL}").items
        return len(found) == POOL_NODES and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in found
        )

    try:
        for body in nodes:
            core_v1.create_node(cast(Any, body))
        wait_for(ready, timeout=60, what=f"the {POOL} pool Ready")
        yield POOL
    finally:
        for body in nodes:
            try:
                core_v1.delete_node(body["metadata"]["name"])
            except ApiException as err:
                if err.status != 404:
                    raise


def run_job(
    jobs: Jobs,
    api_client: client.ApiClient,
    kubeconfig: str,
    azurite: Azurite,  # noqa: F811
    container: str,
    name: str,
    sizes: dict[str, int],
    work: Path,
    unserved: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], int]:
    """A 64-worker job whose pods' logs have `sizes` (`unserved` pods have none to serve), under a fresh
    operator; its status.output when the logs are uploaded, and the operator's peak RSS."""
    work.mkdir(parents=True)
    for pod, size in sizes.items():
        write_cri_log(work / f"{pod}.log", pod, size)
    env = {
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME,
        "DTJOB_WRITE_CONTAINERS": "*",
        "DTJOB_LOG_CAP_BYTES": str(CAP),
    }
    operator = OperatorProcess(kubeconfig, jobs.ns, work / "operator.log", env=env)
    operator.start()
    try:
        jobs.create(
            name,
            workers=WORKERS,
            gpusPerWorker=1,
            placement={"nodePool": POOL},
            output=location(azurite, container, "runs"),
            launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
        )
        wait_for(lambda: len(jobs.live_workers(name)) == WORKERS, timeout=120, what=f"{WORKERS} workers")
        for pod in sorted(sizes.keys() - unserved):
            if "-worker-" in pod:
                serve_pod_log(api_client, jobs.ns, pod, "worker", work / f"{pod}.log")
        launcher = wait_for(
            lambda: next(iter(jobs.pods(name, "launcher")), None), timeout=180, what="the launcher pod"
        )
        launcher_pod = str(launcher.metadata.name)
        launcher_log = work / "launcher.log"
        launcher_log.write_text(f"{CRI_PREFIX}training done\n")
        serve_pod_log(api_client, jobs.ns, launcher_pod, "launcher", launcher_log)
        jobs.annotate_pod(launcher_pod, {"sim.dtjob.io/outcome": "Succeeded"})
        status = jobs.wait_phase(name, "Succeeded", "Failed", timeout=120)
        assert status["phase"] == "Succeeded", status

        def uploaded() -> dict[str, Any] | None:
            output: dict[str, Any] = jobs.status(name).get("output") or {}
            return output if output.get("logsUploaded") else None

        try:
            output = wait_for(uploaded, timeout=300, interval=1, what=f"the logs of {name} uploaded")
        except AssertionError as err:
            raise AssertionError(f"{err}\noperator log:\n{operator.log_tail()}") from None
        assert operator.proc is not None
        return output, peak_rss(operator.proc.pid)
    finally:
        operator.stop()
        for pod in sizes:
            (work / f"{pod}.log").unlink(missing_ok=True)


def check_blob(results: ContainerClient, blob: str, pod: str, size: int) -> None:
    """The blob is the log, or its note, head, marker and tail when the log is over the cap."""
    data = expected_log(pod, size)
    stored = results.download_blob(blob).readall()
    if size <= CAP:
        assert stored == data, f"{pod}: {len(stored)} bytes stored of {len(data)}"
        return
    first, rest = stored.split(b"\n", 1)
    assert first.startswith(f"{NOTE_PREFIX} This log was {size} bytes".encode()), first
    found = re.search(rb"first (\d+) bytes and its last (\d+) bytes", first)
    assert found, first
    summary = LogSummary(size, int(found.group(1)), int(found.group(2)))
    assert first + b"\n" == truncation_note(summary, CAP).encode()
    assert summary.head_bytes + summary.tail_bytes <= CAP
    assert summary.head_bytes > CAP // 4 - CAP // 16 and summary.tail_bytes > CAP * 3 // 4 - CAP // 8
    marker = omission_marker(summary.omitted_bytes, head_ends_line=True).encode()
    head, tail = data[: summary.head_bytes], data[size - summary.tail_bytes :]
    assert rest == head + marker + tail, f"{pod}: the stored head and tail differ from the log's"
    assert rest.startswith(f"HEAD {pod}\n".encode()) and rest.endswith(f"TAIL {pod}\n".encode())
    assert len(stored) <= CAP + len(first) + len(marker) + 1


def test_logs_of_64_workers_stream_to_storage_in_bounded_memory(
    jobs: Jobs,
    log_pool: str,
    azurite: Azurite,  # noqa: F811
    api_client: client.ApiClient,
    kubeconfig: str,
    tmp_path: Path,
    container_name: str,  # noqa: F811
) -> None:
    blob = BlobServiceClient(azurite.endpoint, credential=azurite.account_key)
    results = blob.create_container(container_name)
    key_secret(jobs, azurite)
    small = {f"small-worker-{i}": SMALL_LOG for i in range(WORKERS)}
    big = {f"big-worker-{i}": WITHIN_CAP if i % 8 == 7 else BIG_LOG for i in range(WORKERS)}
    assert sum(big.values()) > CHART_LIMIT  # read whole, these logs alone would not fit under the limit

    unserved = frozenset({"small-worker-63"})
    small_output, small_peak = run_job(
        jobs, api_client, kubeconfig, azurite, container_name, "small", small, tmp_path / "small", unserved
    )
    big_output, big_peak = run_job(
        jobs, api_client, kubeconfig, azurite, container_name, "big", big, tmp_path / "big"
    )
    mib = 2**20
    total = sum(big.values()) / mib
    print(f"operator peak RSS: small logs {small_peak / mib:.0f} MiB, big logs {big_peak / mib:.0f} MiB "
          f"({total:.0f} MiB of logs); chart limit {CHART_LIMIT / mib:.0f} MiB")  # fmt: skip
    assert big_peak < CHART_LIMIT, f"peak RSS {big_peak / mib:.0f} MiB over the chart's limit"
    # Does not grow with the logs: 36 times more log bytes, within a small margin of the same peak.
    assert big_peak < small_peak * 1.25, (small_peak / mib, big_peak / mib)

    assert "logsTruncated" not in small_output
    assert small_output["logsMissing"] == sorted(unserved)
    over = sorted(pod for pod, size in big.items() if size > CAP)
    assert big_output["logsTruncated"] == {"pods": over, "capBytes": CAP}
    assert "logsMissing" not in big_output
    jobs.wait_event("big", "LogsUploaded")  # posted after the status patch just read
    events = [e.message for e in jobs.events("big") if e.reason == "LogsUploaded"]
    assert events and f"cut to the {CAP}-byte cap: {over[0]}, " in events[0]

    for job, sizes in (("small", small), ("big", big)):
        uid = (jobs.get(job) or {})["metadata"]["uid"]
        prefix = f"runs/{jobs.ns}/{job}/{uid}/logs/"
        stored = {b.name.removeprefix(prefix) for b in results.list_blobs(name_starts_with=prefix)}
        readable = sizes.keys() - unserved
        assert {f"{pod}.log" for pod in readable} <= stored
        assert len(stored) == len(readable) + 1  # and the launcher's
        for pod in readable:
            check_blob(results, f"{prefix}{pod}.log", pod, sizes[pod])
