"""Where a job's run lives in Blob Storage, as the `dtjob results` and `dtjob logs` commands find it: the
job's own spec.output and UID (`<prefix>/<namespace>/<job>/<uid>/`), so the user names the job, not a blob
path."""

from __future__ import annotations

import os
from typing import Any

from dtjob.azure.errors import StorageFailure
from dtjob.contract.transfer_report import ExitCode
from dtjob.names import run_prefix
from dtjob.spec.reader import SpecError
from dtjob.spec.storage import Output, parse_output

FINISHED_PHASES = ("Succeeded", "Failed")


def run_location(job: dict[str, Any]) -> tuple[Output, str]:
    """(the job's parsed spec.output, its run's blob prefix). Raises StorageFailure(USAGE) when the job
    writes no results."""
    meta = job.get("metadata") or {}
    emulators = {h.strip() for h in os.environ.get("DTJOB_EMULATOR_HOSTS", "").split(",") if h.strip()}
    try:
        output = parse_output((job.get("spec") or {}).get("output"), emulator_hosts=emulators)
    except SpecError as err:
        raise StorageFailure(ExitCode.USAGE, f"job {meta.get('name')}: {err}") from None
    if output is None:
        raise StorageFailure(
            ExitCode.USAGE, f"job {meta.get('name')} has no spec.output: it uploads no results"
        )
    prefix = run_prefix(output.target.prefix, str(meta["namespace"]), str(meta["name"]), str(meta["uid"]))
    return output, prefix
