"""The job copies confirmed by a LIST of the jobs' metadata, on the controller's own schedule: each scope
listed while leading, a job the LIST no longer holds forgotten as a DELETED event would have had it, a
standby listing nothing, and a failed LIST leaving the copies to age."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest
from dtjob.runtime import job_copies
from dtjob.runtime.cached_kube import ControllerKube

Key = tuple[str, str]


class Jobs:
    def __init__(self, gone: dict[str | None, list[Key]], fail: frozenset[str | None] = frozenset()) -> None:
        self.gone = gone
        self.fail = fail
        self.listed: list[str | None] = []

    def confirm_jobs(self, namespace: str | None) -> list[Key]:
        self.listed.append(namespace)
        if namespace in self.fail:
            raise ConnectionError("the API server is down")
        return self.gone.get(namespace, [])


def rounds(jobs: Jobs, scopes: list[str | None], leading: bool, times: int) -> list[Key]:
    forgotten: list[Key] = []

    async def main() -> None:
        with ThreadPoolExecutor(1) as threads:
            kube = cast(ControllerKube, jobs)
            confirming = job_copies.keep_confirmed(kube, scopes, lambda: leading, threads, forgotten.append)
            task = asyncio.create_task(confirming)
            while len(jobs.listed) < times * len(scopes) and leading:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    return forgotten


def test_each_scope_is_listed_and_the_jobs_gone_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_copies, "JOB_COPIES_CONFIRMED_EVERY_S", 0.001)
    jobs = Jobs({"ml": [("ml", "deleted-meanwhile")]}, fail=frozenset({"cv"}))
    forgotten = rounds(jobs, ["cv", "ml"], leading=True, times=2)
    assert jobs.listed[:4] == ["cv", "ml", "cv", "ml"], "a failed LIST does not stop the others"
    assert set(forgotten) == {("ml", "deleted-meanwhile")}


def test_a_standby_lists_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_copies, "JOB_COPIES_CONFIRMED_EVERY_S", 0.001)
    jobs = Jobs({None: [("ml", "x")]})
    assert rounds(jobs, [None], leading=False, times=1) == [] and jobs.listed == []
