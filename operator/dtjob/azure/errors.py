"""Turn Azure SDK and local I/O exceptions into one-line reasons a user can act on.

Every reason passes through `redact`, so a signed URL quoted by an exception never reaches a log or status.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtjob.contract.transfer_report import ExitCode
from dtjob.redaction import redact


@dataclass
class StorageFailure(Exception):
    code: ExitCode
    reason: str

    def __post_init__(self) -> None:
        self.reason = redact(self.reason)
        super().__init__(self.reason)

    def __str__(self) -> str:
        return self.reason


def _error_code(err: Exception) -> str:
    code = getattr(err, "error_code", None)
    # The SDK gives some codes as StorageErrorCode members: show the code the service sent, not the member.
    code = getattr(code, "value", code)
    return f" {code}" if code else ""


def describe_storage_error(err: Exception, subject: str, credentials_hint: str) -> StorageFailure:
    """A StorageFailure for an exception raised while working on `subject` (e.g. "input container data").

    `credentials_hint` names what the user should check on a denial, e.g. "Secret r50-sas-in"."""
    from azure.core.exceptions import HttpResponseError, ServiceRequestError

    if isinstance(err, StorageFailure):
        return err
    if isinstance(err, HttpResponseError):
        status = err.status_code
        code = _error_code(err)
        if status in (401, 403):
            return StorageFailure(
                ExitCode.DENIED, f"{subject}: access denied ({status}{code}): check {credentials_hint}"
            )
        if status == 404:
            return StorageFailure(ExitCode.NOT_FOUND, f"{subject}: not found (404{code})")
        first_line = (err.message or "").splitlines()[0] if err.message else type(err).__name__
        return StorageFailure(ExitCode.STORAGE, f"{subject}: storage error ({status}{code}): {first_line}")
    if isinstance(err, ServiceRequestError):
        return StorageFailure(
            ExitCode.STORAGE, f"{subject}: cannot reach the storage endpoint: {err.message}"
        )
    if isinstance(err, OSError):
        where = f" {err.filename}" if err.filename else ""
        return StorageFailure(ExitCode.LOCAL_IO, f"local I/O error{where}: {err.strerror or err}")
    return StorageFailure(ExitCode.STORAGE, f"{subject}: {type(err).__name__}: {err}")


def arm_exit_code(status: int | None) -> ExitCode:
    """The CLI's exit status for an Azure Resource Manager answer (`dtjob pool`, `dtjob fileserver`): not
    found, denied, or Azure failed (any other refusal, a failed operation, or no answer)."""
    if status == 404:
        return ExitCode.NOT_FOUND
    if status in (401, 403):
        return ExitCode.DENIED
    return ExitCode.STORAGE
