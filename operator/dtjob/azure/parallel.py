"""Run one function over many items on a thread pool, with a bounded queue and a stop on the first error."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

Item = TypeVar("Item")
T = TypeVar("T")


def run_bounded(
    items: Iterable[Item], work: Callable[[Item, threading.Event], None], concurrency: int, name: str
) -> None:
    """Call `work(item, cancel)` for every item on `concurrency` threads. At most 4 items per thread wait in
    the queue, so a million files never become a million pending futures. The first error sets `cancel`
    (work checks it to stop early), drops the queued items and is raised here."""
    cancel = threading.Event()
    window = concurrency * 4
    with cf.ThreadPoolExecutor(concurrency, thread_name_prefix=name) as pool:
        pending: set[cf.Future[None]] = set()
        try:
            for item in items:
                if len(pending) >= window:
                    done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    _raise_first(done)
                pending.add(pool.submit(work, item, cancel))
            done, pending = cf.wait(pending)
            _raise_first(done)
        except BaseException:
            cancel.set()
            for future in pending:
                future.cancel()
            raise


def _raise_first(done: Iterable[cf.Future[None]]) -> None:
    for future in done:
        err = future.exception()
        if err is not None:
            raise err


def retry_once_on_denial(action: Callable[[], T], refresh: Callable[[], None]) -> T:
    """Run `action`; after a 401/403 re-read the credentials and try once more, because a mounted token may
    have been rotated between two requests. A second denial is real and propagates."""
    from azure.core.exceptions import HttpResponseError

    try:
        return action()
    except HttpResponseError as err:
        if err.status_code not in (401, 403):
            raise
        refresh()
        return action()
