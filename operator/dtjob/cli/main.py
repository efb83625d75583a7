"""The `dtjob` command line: `dtjob operator`, `data`, `pool`, `fileserver`, `results`, `status`, `logs`.

Each subcommand lives in its own module under dtjob.cli and exposes `register(subparsers)`; modules are
imported only when present, so the operator image need not carry the Azure SDKs' CLI paths.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

from dtjob import __version__
from dtjob.contract.transfer_report import ExitCode

SUBCOMMAND_MODULES = ("operator", "data", "pool", "fileserver", "results", "describe", "logs")

# Every command's exit status. Distinct codes, not kubectl's 1 for any error, so that a script can tell a
# job that is not there (4) from an API server it cannot reach (6) from a mistyped command (2) without
# parsing stderr. They are the stager's (dtjob.contract.transfer_report.ExitCode), which `dtjob data` and
# `dtjob results` share since they move the same blobs, plus 1 and 130.
EXIT_CODES = (
    (0, "done"),
    (1, "the command ran and said no: a check failed (data hash, data prepare-imagenet), a confirmation "
        "was declined, or fileserver refused to touch a share in use or an object not its own"),
    (int(ExitCode.USAGE), "usage: bad arguments, an unreadable kubeconfig or credential file, or a job the "
        "command does not apply to (no spec.output)"),
    (int(ExitCode.DENIED), "denied: the API server, Blob Storage or Azure refused the credentials "
        "(401/403), or there are none"),
    (int(ExitCode.NOT_FOUND), "not found: the job, its pod or container, its log, the pool, the storage "
        "account, the container or the blobs"),
    (int(ExitCode.LOCAL_IO), "a local file or directory could not be read or written"),
    (int(ExitCode.STORAGE), "the API server, Blob Storage or Azure answered with another error (a "
        "conflict, no quota, a failed operation) or could not be reached (after retries)"),
    (int(ExitCode.INTEGRITY), "downloaded content does not match its Content-MD5"),
    (130, "interrupted (Ctrl-C); a download or upload resumes when run again"),
)  # fmt: skip


def exit_codes_epilog() -> str:
    lines = ["exit status:"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(meaning, 79, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    # Installed as a kubectl plugin (kubectl-dtjob on PATH), it is called as `kubectl dtjob`.
    prog = "kubectl dtjob" if Path(sys.argv[0]).name == "kubectl-dtjob" else "dtjob"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dtjob {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"dtjob.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"dtjob.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.func
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
