"""Subcommands of the `dtjob` CLI; each module exposes `register(subparsers)` and sets `func`."""
