"""`dtjob data upload`, `dtjob data ls`, `dtjob data hash` and `dtjob data prepare-imagenet`: put a dataset
into Blob Storage, look at what is there, record a Content-MD5 on blobs other tools uploaded without one, and
turn ILSVRC2012's tarballs into the tree the trainers read.

Credentials, first match wins: --sas-file / $AZURE_STORAGE_SAS_TOKEN, --account-key-file / $AZURE_STORAGE_KEY
(--sas and --account-key take the secret itself, which then shows in shell history and ps), else
DefaultAzureCredential (az login, workload or managed identity; needs a Storage Blob Data role).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtjob.azure.errors import StorageFailure
from dtjob.azure.progress import Progress
from dtjob.cli import blob_access as blob_cli
from dtjob.cli import output
from dtjob.contract.transfer_report import ExitCode
from dtjob.names import directory_prefix
from dtjob.printable import printable
from dtjob.spec.reader import SpecError
from dtjob.spec.storage import ACCOUNT_RE, PUBLIC_BLOB_SUFFIX, parse_endpoint

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

    from dtjob.datasets.imagenet_prep import Sink


def register(subparsers: Any) -> None:
    data = subparsers.add_parser(
        "data", help="upload a dataset to Blob Storage, list what is there, hash it, prepare ImageNet"
    )
    commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    upload = commands.add_parser("upload", help="upload a local directory tree (parallel, resumable)")
    upload.add_argument("local_dir", type=Path, metavar="LOCAL_DIR")
    _location_args(upload)
    upload.add_argument(
        "--concurrency", type=blob_cli.parallelism, default=16, help="parallel uploads (default 16)"
    )
    upload.add_argument("--create-container", action="store_true", help="create the container if missing")
    upload.add_argument("--no-progress", action="store_true", help="no progress bar")
    upload.set_defaults(func=run_upload)

    ls = commands.add_parser("ls", help="list blobs under a prefix")
    _location_args(ls)
    ls.add_argument("--long", "-l", action="store_true", help="show size and MD5 too")
    output.add_output_arg(ls, "one blob a line")
    ls.set_defaults(func=run_ls)

    hash_ = commands.add_parser(
        "hash",
        help="record a Content-MD5 on blobs that have none, so the stager verifies their bytes",
        description=HASH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _location_args(hash_)
    hash_.add_argument(
        "--concurrency", type=blob_cli.parallelism, default=16, help="blobs hashed in parallel (default 16)"
    )
    hash_.add_argument("--no-progress", action="store_true", help="no progress bar")
    hash_.set_defaults(func=run_hash)

    _register_prepare(commands)


def _location_args(parser: argparse.ArgumentParser, local_dir: bool = False) -> None:
    """Where data lives in Blob Storage; with `local_dir`, --to DIR may name a local directory instead."""
    where = parser.add_mutually_exclusive_group(required=True)
    if local_dir:
        where.add_argument("--to", type=Path, metavar="DIR", help="write into this local directory")
    where.add_argument("--account", help="storage account name (public Azure)")
    where.add_argument("--endpoint", help="blob endpoint URL (other clouds, or a local emulator)")
    parser.add_argument("--container", required=not local_dir, help="blob container")
    parser.add_argument("--prefix", default="", help="virtual directory inside the container")
    blob_cli.add_credential_args(parser)


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


def _client(args: argparse.Namespace, concurrency: int) -> tuple[ContainerClient, str]:
    from dtjob.azure.clients import container_client

    endpoint, account = _endpoint_and_account(args)
    credential, hint = blob_cli.credential(args.sas, args.account_key, account)
    return container_client(f"{endpoint}/{args.container}", credential, concurrency), hint


def run_upload(args: argparse.Namespace) -> int:
    from dtjob.azure.upload import Uploader

    subject = f"container {args.container}"
    hint = "the credentials"
    progress = Progress()
    try:
        client, hint = _client(args, args.concurrency)
        if args.create_container and not client.exists():
            client.create_container()
        with blob_cli.progress_bar(progress, "upload", enabled=not args.no_progress):
            snap = Uploader(
                lambda: client, lambda: None, progress, subject, hint, concurrency=args.concurrency
            ).run(args.local_dir, args.prefix)
    except KeyboardInterrupt:
        print("dtjob data: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as err:
        return blob_cli.fail("dtjob data", err, subject, hint)
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
        return blob_cli.fail("dtjob data", err, subject, hint)
    if args.output != "text":
        print(output.dump([{"name": f.name, "size": f.size, "md5": f.md5} for f in files], args.output))
    elif args.long:
        for remote in files:
            print(
                f"{remote.size:>14}  {remote.md5 or '-':<24}  {printable(remote.name, keep_newlines=False)}"
            )
    else:
        for remote in files:
            print(printable(remote.name, keep_newlines=False))
    total = sum(f.size for f in files)
    print(f"{len(files)} blob(s), {total} bytes under {args.container}/{prefix}", file=sys.stderr)
    return int(ExitCode.OK)


HASH_DESCRIPTION = """\
Read every blob under the prefix that has no Content-MD5 (a blob uploaded in blocks has none unless its
uploader sent one, as azcopy does with --put-md5), compute its MD5 and record it as the blob's Content-MD5,
keeping its other content settings. The stager then checks such a blob's bytes, not only its length.
Blobs that have one are skipped, so a rerun only does what is left. Needs list, read and write on the blobs.

A blob rewritten or deleted after the listing is left without a hash (the read and the record are both
conditioned on the version listed) and named; the exit status is then 1: run the command again.
"""

# How many blobs changed meanwhile the summary names (the count covers all of them).
CHANGED_SHOWN = 10


def run_hash(args: argparse.Namespace) -> int:
    from dtjob.azure.hashing import Hasher

    subject = f"container {args.container}"
    hint = "the credentials"
    progress = Progress()
    try:
        client, hint = _client(args, args.concurrency)
        with blob_cli.progress_bar(progress, "hash", enabled=not args.no_progress):
            summary = Hasher(client, progress, subject, hint, concurrency=args.concurrency).run(
                directory_prefix(args.prefix)
            )
    except KeyboardInterrupt:
        print("dtjob data: interrupted; run the same command again to go on", file=sys.stderr)
        return 130
    except Exception as err:
        return blob_cli.fail("dtjob data", err, subject, hint)
    changed = len(summary.changed)
    print(
        f"hashed {summary.hashed} blob(s), {summary.had_one} already had a Content-MD5, "
        f"{changed} changed meanwhile, under {args.container}/{directory_prefix(args.prefix)}"
    )
    if changed:
        shown = summary.changed[:CHANGED_SHOWN]
        more = f" and {changed - CHANGED_SHOWN} more" if changed > CHANGED_SHOWN else ""
        print(
            f"dtjob data: {changed} blob(s) changed or went away while being hashed and were left without a "
            f"Content-MD5: {', '.join(shown)}{more}; run the same command again to hash them",
            file=sys.stderr,
        )
        return 1
    return int(ExitCode.OK)


PREPARE_DESCRIPTION = """\
Turn ILSVRC2012's tarballs into train/<wnid>/*.JPEG and val/<wnid>/*.JPEG, the layout the trainers read,
in a local directory (--to DIR) or straight under a Blob Storage prefix (--account/--endpoint, --container,
--prefix), which a job's dataset.stageFrom then stages. The train tarball is streamed once, class by class;
a rerun skips the classes (and val) already complete. At the end the tree is counted and checked against the
expected totals (exit status 1 when the check fails, unless --no-verify).

Val labels, in any of these forms (detected, or --val-labels-format):
  wnid-per-line   one wnid per line in val-image order (imagenet_2012_validation_synset_labels.txt)
  kaggle-csv      Kaggle's LOC_val_solution.csv (ImageId,PredictionString; the first token is the wnid)
  filename-wnid   'ILSVRC2012_val_00000001.JPEG n01751748' per line (space or comma)
The devkit's ILSVRC2012_validation_ground_truth.txt holds ILSVRC2012_IDs, not wnids; mapping them needs the
devkit's MATLAB meta.mat, which is not read.
"""


def _register_prepare(commands: Any) -> None:
    from dtjob.datasets.imagenet_layout import EXPECTED_CLASSES, EXPECTED_TRAIN, EXPECTED_VAL, LabelFormat

    prepare = commands.add_parser(
        "prepare-imagenet",
        help="turn ILSVRC2012's tarballs into train/<wnid>/ and val/<wnid>/ (streamed, resumable)",
        description=PREPARE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument("--train-tar", type=Path, required=True, help="ILSVRC2012_img_train.tar")
    prepare.add_argument("--val-tar", type=Path, required=True, help="ILSVRC2012_img_val.tar")
    prepare.add_argument("--val-labels", type=Path, required=True, help="the val images' wnids (see above)")
    prepare.add_argument(
        "--val-labels-format", choices=[f.value for f in LabelFormat], help="default: detected from the file"
    )
    _location_args(prepare, local_dir=True)
    prepare.add_argument(
        "--concurrency", type=blob_cli.parallelism, default=16, help="parallel writes (default 16)"
    )
    prepare.add_argument("--create-container", action="store_true", help="create the container if missing")
    for flag, default, what in (
        ("--expect-classes", EXPECTED_CLASSES, "classes"),
        ("--expect-train", EXPECTED_TRAIN, "train images"),
        ("--expect-val", EXPECTED_VAL, "val images"),
    ):
        prepare.add_argument(
            flag, type=int, default=default, metavar="N", help=f"{what} the check expects (default {default})"
        )
    prepare.add_argument(
        "--no-verify", action="store_true", help="print the check's report but exit 0 even when it fails"
    )
    prepare.add_argument("--no-progress", action="store_true", help="no progress bar")
    prepare.set_defaults(func=run_prepare)


def _prepare_usage(args: argparse.Namespace) -> str | None:
    if args.to is not None and (args.container or args.prefix):
        return "--to writes a local directory: --container and --prefix are for Blob Storage"
    if args.to is None and not args.container:
        return "--container is required with --account or --endpoint"
    if min(args.expect_classes, args.expect_train, args.expect_val) < 0:
        return "--expect-classes, --expect-train and --expect-val must not be negative"
    return None


def _prepare_sink(args: argparse.Namespace) -> tuple[Sink, str]:
    """Where the tree goes (a local directory, or a Blob prefix through the upload's own client and
    credentials) and what to check when storage refuses it."""
    from dtjob.datasets.imagenet_prep import LocalSink

    if args.to is not None:
        args.to.mkdir(parents=True, exist_ok=True)
        return LocalSink(args.to, concurrency=args.concurrency), f"the permissions of {args.to}"
    from dtjob.azure.imagenet_sink import BlobSink

    client, hint = _client(args, args.concurrency)
    if args.create_container and not client.exists():
        client.create_container()
    prefix = directory_prefix(args.prefix)
    where = f"{client.url.split('?', 1)[0]}/{prefix}"
    return BlobSink(lambda: client, prefix, where, concurrency=args.concurrency), hint


def run_prepare(args: argparse.Namespace) -> int:
    from dtjob.datasets.imagenet_layout import (
        Expected,
        LabelError,
        LabelFormat,
        LayoutError,
        check_tree,
        parse_val_labels,
    )
    from dtjob.datasets.imagenet_prep import Preparation

    problem = _prepare_usage(args)
    if problem:
        print(f"dtjob data: {problem}", file=sys.stderr)
        return int(ExitCode.USAGE)
    subject = f"container {args.container}" if args.to is None else str(args.to)
    hint = "the credentials"
    expected = Expected(args.expect_classes, args.expect_train, args.expect_val)
    progress = Progress()
    try:
        fmt = LabelFormat(args.val_labels_format) if args.val_labels_format else None
        labels = parse_val_labels(args.val_labels.read_text(errors="replace"), str(args.val_labels), fmt)
        sink, hint = _prepare_sink(args)
        with blob_cli.progress_bar(progress, "prepare", enabled=not args.no_progress, unit="images"):
            outcome = Preparation(args.train_tar, args.val_tar, labels, sink, progress, expected).run()
        report = check_tree(sink.counts(), expected, outcome.train_classes)
    except KeyboardInterrupt:
        print("dtjob data: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (LabelError, LayoutError) as err:
        print(f"dtjob data: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except Exception as err:
        return blob_cli.fail("dtjob data", err, subject, hint)
    snap = progress.snapshot()
    val = "val prepared" if outcome.val_done else "val already complete"
    print(
        f"prepared {outcome.classes_done} class(es) ({outcome.classes_skipped} already complete), {val}: "
        f"{snap.files_done} image(s) written in {snap.elapsed_s:.1f}s to {sink.location}"
    )
    for line in report.lines():
        print(line)
    if not report.ok and not args.no_verify:
        return 1
    return int(ExitCode.OK)
