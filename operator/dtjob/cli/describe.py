"""`dtjob status JOB` (alias `describe`): one screen about a job, or the object itself with -o json|yaml."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from dtjob.cli import kube_access as kube_cli
from dtjob.cli import output
from dtjob.cli.job_view import render


def register(subparsers: Any) -> None:
    status = subparsers.add_parser(
        "status",
        aliases=["describe"],
        help="a job's phase, conditions, progress, staging, output, restarts and last events",
    )
    status.add_argument("job", metavar="JOB", help="the DistributedTrainingJob's name")
    kube_cli.add_kube_args(status)
    output.add_output_arg(status, "one screen")
    status.set_defaults(func=run_status)


def run_status(args: argparse.Namespace) -> int:
    try:
        cluster = kube_cli.connect(args)
        job = cluster.read_job(args.job)
        if args.output != "text":
            print(output.dump(job, args.output))
            return 0
        events = cluster.job_events(job)
    except kube_cli.KubeFailure as err:
        print(f"dtjob status: {err}", file=sys.stderr)
        return int(err.code)
    print(render(job, events, datetime.now(UTC)))
    return 0
