"""The `dtjob` command line: `dtjob operator`, `data`, `pool`, `fileserver`, `results`, `status`, `logs`.

Each subcommand lives in its own module under dtjob.commands and exposes `register(subparsers)`; modules are
imported only when present, so the operator image need not carry the Azure SDKs' CLI paths.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dtjob import __version__

SUBCOMMAND_MODULES = ("operator", "data", "pool", "fileserver", "results", "describe", "logs")


def build_parser() -> argparse.ArgumentParser:
    # Installed as a kubectl plugin (kubectl-dtjob on PATH), it is called as `kubectl dtjob`.
    prog = "kubectl dtjob" if Path(sys.argv[0]).name == "kubectl-dtjob" else "dtjob"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"dtjob {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"dtjob.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"dtjob.commands.{name}":
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
