"""What the client raises: one exception family, each naming its cause in one line, as the `dtjob` commands
print it. `code` is the exit status the command would end with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtjob.contract.transfer_report import ExitCode

if TYPE_CHECKING:
    from dtjob.client.status import JobStatus


class DtjobError(Exception):
    """Any failure of the client: the API server's or Blob Storage's answer, or input it refused."""

    def __init__(self, reason: str, code: ExitCode = ExitCode.STORAGE) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class JobNotFound(DtjobError, LookupError):
    """The job (or its pod, its log, its results) is not there."""


class AccessDenied(DtjobError, PermissionError):
    """The API server or Blob Storage refused the credentials (401/403), or there are none."""


class InvalidJob(DtjobError, ValueError):
    """A job spec the operator would refuse; `field` names the field (`spec.workers`). Nothing was sent."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", ExitCode.USAGE)
        self.field = field
        self.message = message


class WaitTimeout(DtjobError, TimeoutError):
    """The job did not get where it was awaited in time; `status` is the last one read."""

    def __init__(self, status: JobStatus, timeout: float) -> None:
        super().__init__(
            f"job {status.name} is still {status.phase} after {timeout:g}s"
            + (f" ({status.message})" if status.message else ""),
            ExitCode.STORAGE,
        )
        self.status = status
        self.timeout = timeout


def of_code(code: ExitCode, reason: str) -> DtjobError:
    """The exception of a command's failure, by its exit status."""
    kind = {ExitCode.NOT_FOUND: JobNotFound, ExitCode.DENIED: AccessDenied}.get(code, DtjobError)
    return kind(reason, code)
