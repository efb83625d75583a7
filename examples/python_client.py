"""Run a training job from Python with dtjob's client: the synthetic ResNet-50 job (the one `make demo` runs,
examples/pytorch-synthetic-resnet50.yaml, here shrunk to a few steps), followed to its end with a progress
line at each change, then its status, its launcher's log, and the job deleted.

    pip install '.[azure]'        # from this repository: the client comes with the `dtjob` command
    python examples/python_client.py --namespace ml --gpus 1

The same calls work in a notebook, a Kubeflow Pipelines component or an Airflow task
(docs/python-client.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dtjob.client import Client, DtjobError, JobStatus

# ResNet-50 on synthetic data: nothing to stage, so the job runs wherever the operator runs.
JOB: dict[str, Any] = {
    "framework": "pytorch",
    "workers": 2,
    "gpusPerWorker": 1,
    "dataset": {"source": "synthetic"},
    "hyperparameters": {"batchSizePerGpu": 32, "epochs": 1, "stepsPerEpoch": 20, "logInterval": 5},
    "runPolicy": {"startupDeadlineSeconds": 900, "backoffLimit": 1, "activeDeadlineSeconds": 1800},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--name", default="resnet50-from-python", help="the job's name")
    parser.add_argument("--namespace", help="default: the kubeconfig context's")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    parser.add_argument("--context", help="default: the current one")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per worker (0: CPU workers)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the job's end")
    parser.add_argument("--keep", action="store_true", help="leave the job in place at the end")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> JobStatus:
    dtjob = Client(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)
    job = dtjob.create({**JOB, "gpusPerWorker": args.gpus}, name=args.name)
    print(f"created {job.name} in namespace {job.namespace}")
    try:
        final = dtjob.wait(job, until=("Succeeded", "Failed"), timeout=args.timeout, progress=True)
        print(f"{final.phase}: {final.message}; {final.restarts} restart(s)")
        if final.progress is not None:
            print(f"last progress: {final.progress.summary}")
        print("--- the launcher's log (every rank) ---")
        for line in dtjob.logs(job):
            print(line)
        return final
    finally:
        if not args.keep:
            dtjob.delete(job, wait=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    try:
        final = run(parse_args(argv))
    except DtjobError as err:  # InvalidJob, JobNotFound, AccessDenied, WaitTimeout...
        print(f"python_client: {err}", file=sys.stderr)
        return 1
    return 0 if final.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
