"""What the commands that move data to and from Blob Storage share: the caller's credentials (from a file,
stdin or the environment, so that no secret need be on the command line), one clear line per failure, and a
progress bar (plain lines without a terminal)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from dtjob.azure.errors import StorageFailure, describe_storage_error
from dtjob.azure.progress import Progress
from dtjob.contract.transfer_report import ExitCode


def parallelism(text: str) -> int:
    """--concurrency's type: a whole number of at least 1, refused by argparse (exit 2) naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_credential_args(parser: argparse.ArgumentParser, sas_needs: str = "", key_use: str = "") -> None:
    """--account-key-file / --sas-file (a file, or `-` for stdin), and --account-key / --sas for the secret
    itself, which shows in shell history and `ps`. Either form of a secret lands in the same attribute
    (`account_key`, `sas`); a file is read, and refused when unreadable or empty, as the flags are parsed."""
    key = parser.add_mutually_exclusive_group()
    key.add_argument(
        "--account-key-file", dest="account_key", type=secret_file, metavar="PATH",
        help=f"read the account key{key_use} from PATH ('-': stdin) (default $AZURE_STORAGE_KEY)",
    )  # fmt: skip
    key.add_argument(
        "--account-key", dest="account_key", metavar="KEY",
        help="the account key itself, visible in shell history and ps: prefer --account-key-file or "
        "$AZURE_STORAGE_KEY",
    )  # fmt: skip
    sas = parser.add_mutually_exclusive_group()
    sas.add_argument(
        "--sas-file", dest="sas", type=secret_file, metavar="PATH",
        help=f"read a SAS token{sas_needs} from PATH ('-': stdin) (default $AZURE_STORAGE_SAS_TOKEN)",
    )  # fmt: skip
    sas.add_argument(
        "--sas", dest="sas", metavar="TOKEN",
        help="the SAS token itself, visible in shell history and ps: prefer --sas-file or "
        "$AZURE_STORAGE_SAS_TOKEN",
    )  # fmt: skip


def secret_file(path: str) -> str:
    """The secret in a file (`-`: stdin), without the whitespace around it; argparse's usage error when it
    cannot be read or holds nothing."""
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise argparse.ArgumentTypeError(f"cannot read {where}: {reason}") from None
    secret = text.strip()
    if not secret:
        raise argparse.ArgumentTypeError(f"{where} is empty")
    return secret


def credential(sas: str | None, account_key: str | None, account: str | None) -> tuple[Any, str]:
    """(credential, what to check when it is denied); first match wins: a SAS (or $AZURE_STORAGE_SAS_TOKEN),
    an account key (or $AZURE_STORAGE_KEY), else the caller's Entra ID identity (DefaultAzureCredential)."""
    token = sas or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if token:
        return token.lstrip("?"), "the SAS token (--sas / AZURE_STORAGE_SAS_TOKEN)"
    key = account_key or os.environ.get("AZURE_STORAGE_KEY")
    if key:
        if account is None:
            raise StorageFailure(ExitCode.USAGE, "--endpoint must name the account to sign with a key")
        return {
            "account_name": account,
            "account_key": key,
        }, "the account key (--account-key / AZURE_STORAGE_KEY)"
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(), (
        "your Entra ID identity's Storage Blob Data role (or pass --account-key-file or --sas-file)"
    )


def fail(command: str, err: Exception, subject: str, hint: str) -> int:
    """Print one clear line for any failure and return its exit status."""
    failure = storage_failure(err, subject, hint)
    print(f"{command}: {failure.reason}", file=sys.stderr)
    return int(failure.code)


def storage_failure(err: Exception, subject: str, hint: str) -> StorageFailure:
    """The StorageFailure of any failure of a transfer, its reason one clear line."""
    from azure.core.exceptions import ClientAuthenticationError

    if isinstance(err, ClientAuthenticationError) and err.status_code is None:
        first = (err.message or "").splitlines()[0] if err.message else ""
        failure = StorageFailure(
            ExitCode.DENIED, f"no Entra ID token ({first}); pass --account-key-file or --sas-file"
        )
    else:
        failure = describe_storage_error(err, subject, hint)
    if failure.code == ExitCode.NOT_FOUND and "ContainerNotFound" in failure.reason:
        return StorageFailure(failure.code, failure.reason + " (create it, or pass --create-container)")
    return failure


@contextmanager
def every(interval_s: float, tick: Callable[[], None]) -> Iterator[None]:
    """Call `tick` every `interval_s` from a thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            tick()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def progress_lines(
    progress: Progress, label: str, interval_s: float = 15.0, out: TextIO | None = None, unit: str = "files"
) -> Iterator[None]:
    """Without a terminal (CI, `kubectl logs`), a plain progress line every `interval_s` instead of a bar."""

    def line() -> None:
        snap = progress.snapshot()
        done_mb = (snap.bytes_done + snap.bytes_skipped) / 2**20
        print(
            f"{label}: {snap.files_complete}/{snap.files_total} {unit}, {done_mb:.1f}/"
            f"{snap.bytes_total / 2**20:.1f} MiB, {snap.bytes_per_s / 2**20:.1f} MiB/s",
            file=out or sys.stderr,
            flush=True,
        )

    with every(interval_s, line):
        yield


@contextmanager
def progress_bar(progress: Progress, label: str, enabled: bool, unit: str = "files") -> Iterator[None]:
    """A tqdm bar in bytes fed from the shared counters (plain lines without a terminal); transfers never
    touch the terminal themselves."""
    if not enabled:
        yield
        return
    if not sys.stderr.isatty():
        with progress_lines(progress, label, unit=unit):
            yield
        return
    from tqdm import tqdm

    bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr)

    def refresh() -> None:
        snap = progress.snapshot()
        bar.total = snap.bytes_total
        bar.n = snap.bytes_done + snap.bytes_skipped
        bar.set_postfix_str(f"{snap.files_complete}/{snap.files_total} {unit}", refresh=False)
        bar.refresh()

    try:
        with every(0.5, refresh):
            yield
    finally:
        refresh()
        bar.close()
