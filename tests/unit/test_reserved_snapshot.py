"""The fetch gates count the worker's reserved requests from the consumer's thread while pool
threads take finished ones out (prorl_celery.worker._celery.reserved_snapshot): counting must
never raise. Iterating the live WeakSet did ("Set changed size during iteration"), which
stopped a RUN worker's consumer in a 1,000-job burst."""
from __future__ import annotations

import threading

from celery.worker import state

from prorl_celery.celery_app import _jobs_in
from prorl_celery.worker._celery import reserved_snapshot


class Request:
    def __init__(self, args: list) -> None:
        self.args = args


def test_counting_while_other_threads_add_and_take_out_never_raises() -> None:
    keep = [Request([["a", "b"]]) if i % 2 else Request(["c"]) for i in range(64)]
    stop = threading.Event()

    def churn() -> None:  # as pool threads do: requests in and out of the set
        while not stop.is_set():
            for request in keep:
                state.reserved_requests.add(request)
            for request in keep:
                state.reserved_requests.discard(request)
    threads = [threading.Thread(target=churn) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        counts = [_jobs_in(reserved_snapshot()) for _ in range(20_000)]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert max(counts) <= 96 and min(counts) >= 0  # 32 chunks of two and 32 single jobs at most
    assert _jobs_in(reserved_snapshot()) == 0

