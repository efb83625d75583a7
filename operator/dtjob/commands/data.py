"""`dtjob data upload` and `dtjob data ls`: put a dataset into Blob Storage and look at what is there.

Credentials, first match wins: --sas / $AZURE_STORAGE_SAS_TOKEN, --account-key / $AZURE_STORAGE_KEY, else
DefaultAzureCredential (az login, workload or managed identity; needs a Storage Blob Data role).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dtjob.azure.errors import StorageFailure, describe_storage_error
from dtjob.azure.progress import Progress
from dtjob.names import directory_prefix
from dtjob.spec_reader import SpecError
from dtjob.storage_spec import ACCOUNT_RE, PUBLIC_BLOB_SUFFIX, parse_endpoint
from dtjob.transfer_report import ExitCode

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient


def register(subparsers: Any) -> None:
    data = subparsers.add_parser("data", help="upload a dataset to Blob Storage, list what is there")
    commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    upload = commands.add_parser("upload", help="upload a local directory tree (parallel, resumable)")
    upload.add_argument("local_dir", type=Path, metavar="LOCAL_DIR")
    _location_args(upload)
    upload.add_argument("--concurrency", type=int, default=16, help="parallel uploads (default 16)")
    upload.add_argument("--create-container", action="store_true", help="create the container if missing")
    upload.add_argument("--no-progress", action="store_true", help="no progress bar")
    upload.set_defaults(func=run_upload)

    ls = commands.add_parser("ls", help="list blobs under a prefix")
    _location_args(ls)
    ls.add_argument("--long", "-l", action="store_true", help="show size and MD5 too")
    ls.set_defaults(func=run_ls)


def _location_args(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--account", help="storage account name (public Azure)")
    where.add_argument("--endpoint", help="blob endpoint URL (other clouds, or a local emulator)")
    parser.add_argument("--container", required=True)
    parser.add_argument("--prefix", default="", help="virtual directory inside the container")
    parser.add_argument("--account-key", help="account key (default $AZURE_STORAGE_KEY)")
    parser.add_argument("--sas", help="SAS token (default $AZURE_STORAGE_SAS_TOKEN)")


def _endpoint_and_account(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.account is not None:
        if not ACCOUNT_RE.match(args.account):
            raise StorageFailure(ExitCode.USAGE, "--account: must be 3-24 lowercase letters or digits")
        return f"https://{args.account}.{PUBLIC_BLOB_SUFFIX}", args.account
    # The operator's rule: Azure Storage's own domains, or an emulator on loopback or DTJOB_EMULATOR_HOSTS.
    emulators = {h.strip() for h in os.environ.get("DTJOB_EMULATOR_HOSTS", "").split(",") if h.strip()}
    try:
        return parse_endpoint(args.endpoint, "--endpoint", emulators)
    except SpecError as err:
        raise StorageFailure(ExitCode.USAGE, str(err)) from None


def _credential(args: argparse.Namespace, account: str | None) -> tuple[Any, str]:
    """(credential, what to check when it is denied)."""
    sas = args.sas or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if sas:
        return sas.lstrip("?"), "the SAS token (--sas / AZURE_STORAGE_SAS_TOKEN)"
    key = args.account_key or os.environ.get("AZURE_STORAGE_KEY")
    if key:
        if account is None:
            raise StorageFailure(ExitCode.USAGE, "--endpoint must name the account to sign with a key")
        return {
            "account_name": account,
            "account_key": key,
        }, "the account key (--account-key / AZURE_STORAGE_KEY)"
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(), "your Entra ID identity's Storage Blob Data role (or pass --account-key)"


def _client(args: argparse.Namespace, concurrency: int) -> tuple[ContainerClient, str]:
    from dtjob.azure.clients import container_client

    endpoint, account = _endpoint_and_account(args)
    credential, hint = _credential(args, account)
    return container_client(f"{endpoint}/{args.container}", credential, concurrency), hint


def _fail(err: Exception, subject: str, hint: str) -> int:
    """Print one clear line for any failure and return its exit status."""
    from azure.core.exceptions import ClientAuthenticationError

    if isinstance(err, ClientAuthenticationError) and err.status_code is None:
        first = (err.message or "").splitlines()[0] if err.message else ""
        failure = StorageFailure(ExitCode.DENIED, f"no Entra ID token ({first}); pass --account-key or --sas")
    else:
        failure = describe_storage_error(err, subject, hint)
    reason = failure.reason
    if failure.code == ExitCode.NOT_FOUND and "ContainerNotFound" in reason:
        reason += " (create it, or pass --create-container)"
    print(f"dtjob data: {reason}", file=sys.stderr)
    return int(failure.code)


@contextmanager
def _every(interval_s: float, tick: Callable[[], None]) -> Iterator[None]:
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


def _progress_lines(
    progress: Progress, interval_s: float = 15.0, out: TextIO | None = None
) -> Iterator[None]:
    """Without a terminal (CI, `kubectl logs`), a plain progress line every `interval_s` instead of a bar."""

    def line() -> None:
        snap = progress.snapshot()
        done_mb = (snap.bytes_done + snap.bytes_skipped) / 2**20
        print(
            f"upload: {snap.files_complete}/{snap.files_total} files, {done_mb:.1f}/"
            f"{snap.bytes_total / 2**20:.1f} MiB, {snap.bytes_per_s / 2**20:.1f} MiB/s",
            file=out or sys.stderr,
            flush=True,
        )

    with _every(interval_s, line):
        yield


@contextmanager
def _progress_bar(progress: Progress, enabled: bool) -> Iterator[None]:
    """A tqdm bar in bytes fed from the shared counters (plain lines without a terminal); transfers never
    touch the terminal themselves."""
    if not enabled:
        yield
        return
    if not sys.stderr.isatty():
        yield from _progress_lines(progress)
        return
    from tqdm import tqdm

    bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc="upload", file=sys.stderr)

    def refresh() -> None:
        snap = progress.snapshot()
        bar.total = snap.bytes_total
        bar.n = snap.bytes_done + snap.bytes_skipped
        bar.set_postfix_str(f"{snap.files_complete}/{snap.files_total} files", refresh=False)
        bar.refresh()

    try:
        with _every(0.5, refresh):
            yield
    finally:
        refresh()
        bar.close()


def run_upload(args: argparse.Namespace) -> int:
    from dtjob.azure.upload import Uploader

    if args.concurrency < 1:
        print("dtjob data: --concurrency must be at least 1", file=sys.stderr)
        return int(ExitCode.USAGE)
    subject = f"container {args.container}"
    hint = "the credentials"
    progress = Progress()
    try:
        client, hint = _client(args, args.concurrency)
        if args.create_container and not client.exists():
            client.create_container()
        with _progress_bar(progress, enabled=not args.no_progress):
            snap = Uploader(
                lambda: client, lambda: None, progress, subject, hint, concurrency=args.concurrency
            ).run(args.local_dir, args.prefix)
    except KeyboardInterrupt:
        print("dtjob data: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as err:
        return _fail(err, subject, hint)
    where = f"{client.url.split('?', 1)[0]}/{args.prefix.strip('/')}".rstrip("/")
    print(
        f"uploaded {snap.files_done} file(s), {snap.bytes_done} bytes in {snap.elapsed_s:.1f}s "
        f"({snap.files_skipped} already there) to {where}/"
    )
    return int(ExitCode.OK)


def run_ls(args: argparse.Namespace) -> int:
    from dtjob.azure.download import list_remote

    subject = f"container {args.container}"
    hint = "the credentials"
    try:
        client, hint = _client(args, 2)
        prefix = directory_prefix(args.prefix)
        files = list_remote(client, prefix)
    except Exception as err:
        return _fail(err, subject, hint)
    for remote in files:
        if args.long:
            print(f"{remote.size:>14}  {remote.md5 or '-':<24}  {remote.name}")
        else:
            print(remote.name)
    total = sum(f.size for f in files)
    print(f"{len(files)} blob(s), {total} bytes under {args.container}/{prefix}", file=sys.stderr)
    return int(ExitCode.OK)
