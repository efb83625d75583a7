"""The job copies kept confirmed: one LIST of the jobs' metadata per scope, every
JOB_COPIES_CONFIRMED_EVERY_S, where a running job reconciled by its progress polls would otherwise be read
again each time its copy aged (dtjob.runtime.job_cache). A job the LIST no longer holds was deleted while its
watch was down, and is forgotten as its DELETED event would have had it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Executor

from dtjob.runtime.cached_kube import JOB_COPIES_CONFIRMED_EVERY_S, ControllerKube

log = logging.getLogger(__name__)
Key = tuple[str, str]


async def keep_confirmed(
    kube: ControllerKube,
    scopes: Iterable[str | None],
    leading: Callable[[], bool],
    threads: Executor,
    gone: Callable[[Key], None],
) -> None:
    """Runs until cancelled. `scopes`: the namespaces to list (None: the whole cluster)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(JOB_COPIES_CONFIRMED_EVERY_S)
        if not leading():
            continue  # a standby reconciles nothing, so it reads no job either
        for scope in scopes:
            try:
                deleted = await loop.run_in_executor(threads, kube.confirm_jobs, scope)
            except Exception as error:  # the API is down, say: copies age, and reconciles read the jobs
                where = scope or "the cluster"
                log.warning("could not list the jobs of %s to confirm their copies: %s", where, error)
                continue
            for key in deleted:
                log.info("%s/%s is gone, though no watch event said so", *key)
                gone(key)
