"""Group commit of concurrent submits (``prorl_celery.state.group_commit``): the batcher alone, with real
threads and under gevent's monkey-patching, then concurrent ``/process`` requests through the
gateway app (in this process) on the test cluster's Redis and workers."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from prorl_celery import celery_app
from prorl_celery.core.errors import ServiceUnavailable
from prorl_celery.dev.local import free_port, wait_until
from prorl_celery.state import keys
from prorl_celery.state.group_commit import GroupCommit, _Ticket
from tests.support.app import close_app, make_app


class Held:
    """A submit whose first call waits until ``queued`` more callers are queued behind it, so
    the test knows which calls arrive during a flush; it records every batch it is given."""

    def __init__(self, queued: int, fail: BaseException | None = None) -> None:
        self.queued, self.fail = queued, fail
        self.batcher: GroupCommit[str, str] = GroupCommit(self)
        self.calls: list[list[str]] = []

    def __call__(self, specs: list[str]) -> list[str]:
        if not self.calls:
            wait_until(lambda: len(self.batcher._queue) >= self.queued, 10, "callers queued behind the flush")
        self.calls.append(list(specs))
        if self.fail is not None and len(self.calls) == 2:
            raise self.fail
        return [f"done {spec}" for spec in specs]


def run_all(batcher: GroupCommit, groups: list[list[str]]) -> list:
    def one(specs: list[str]):
        try:
            return batcher.submit(specs)
        except Exception as error:  # noqa: BLE001 - the outcome under test
            return error
    with ThreadPoolExecutor(len(groups)) as pool:
        first = pool.submit(one, groups[0])
        wait_until(lambda: batcher._leading, 10, "the first call leading")
        futures = [first] + [pool.submit(one, group) for group in groups[1:]]
        return [future.result() for future in futures]


def test_callers_arriving_during_a_flush_are_submitted_together():
    held = Held(queued=5)
    outcomes = run_all(held.batcher, [["a"], ["b"], ["c", "d"], ["e"], ["f"], ["g"]])
    assert outcomes == [["done a"], ["done b"], ["done c", "done d"], ["done e"], ["done f"], ["done g"]]
    assert held.calls[0] == ["a"] and sorted(held.calls[1]) == ["b", "c", "d", "e", "f", "g"]
    assert (held.batcher.batches, held.batcher.jobs) == (2, 7) and not held.batcher._leading


def test_a_failed_submit_fails_exactly_its_own_batch():
    held = Held(queued=3, fail=ConnectionError("broker down"))
    outcomes = run_all(held.batcher, [["a"], ["b"], ["c"], ["d"]])
    assert outcomes[0] == ["done a"]
    assert all(isinstance(o, ConnectionError) and str(o) == "broker down" for o in outcomes[1:]), outcomes
    assert held.batcher.submit(["e"]) == ["done e"]  # the lead lapsed, the next call submits at once


def test_each_caller_of_a_failed_batch_raises_its_own_copy_of_the_error():
    # one object raised in several threads would grow one traceback out of all of theirs
    cause = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    error = ServiceUnavailable("the broker is unreachable, retry later")
    error.__cause__ = cause
    held = Held(queued=3, fail=error)
    failed = run_all(held.batcher, [["a"], ["b"], ["c"], ["d"]])[1:]
    assert all(type(o) is ServiceUnavailable and o.to_dict() == error.to_dict() and o.__cause__ is cause
               for o in failed), failed
    assert len({id(o) for o in failed}) == 3


def test_a_batch_holds_at_most_max_batch_jobs_but_never_splits_a_caller():
    held = Held(queued=3)
    held.batcher.max_batch = 3
    outcomes = run_all(held.batcher, [["a"], ["b", "c"], ["d", "e"], ["f", "g", "h", "i"]])
    assert [len(o) for o in outcomes] == [1, 2, 2, 4]
    assert [len(c) for c in held.calls] == [1, 2, 2, 4]  # each of the queued three in its own batch


def test_a_lone_call_is_submitted_at_once():
    calls: list[float] = []
    batcher: GroupCommit[int, int] = GroupCommit(lambda specs: calls.append(time.monotonic()) or specs)
    for i in range(3):
        started = time.monotonic()
        assert batcher.submit([i]) == [i]
        assert calls[-1] - started < 0.05  # no timer collects a batch first
    assert batcher.batches == 3


def test_an_interrupted_caller_leaves_the_queue_and_passes_on_a_lead_it_was_given():
    release = threading.Event()
    batcher: GroupCommit[str, str] = GroupCommit(lambda specs: release.wait(10) and specs)
    leader = threading.Thread(target=batcher.submit, args=(["a"],))
    leader.start()
    wait_until(lambda: batcher._leading, 10, "a leader")
    gone = _Ticket(["b"])  # a caller whose wait is interrupted (a gevent Timeout) once it is given the lead
    batcher._queue.append(gone)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(batcher.submit, ["c"])
        wait_until(lambda: len(batcher._queue) == 2, 10, "two queued")
        release.set()
        leader.join(10)
        assert gone.lead and gone.done.is_set()
        batcher._abandon(gone)  # what submit does when that wait raises
        assert waiting.result(10) == ["c"]
    assert not batcher._queue and not batcher._leading and batcher.jobs == 2


GEVENT_SCRIPT = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import gevent
    from prorl_celery.state.group_commit import GroupCommit, _Ticket

    calls = []
    def submit(specs):
        calls.append(len(specs))
        gevent.sleep(0.02)  # a round trip: the other greenlets run and queue meanwhile
        return [s * 2 for s in specs]

    batcher = GroupCommit(submit)
    results = gevent.joinall([gevent.spawn(batcher.submit, [i]) for i in range(500)], timeout=30)
    assert [g.value for g in results] == [[i * 2] for i in range(500)], [g.value for g in results][:5]
    assert sum(calls) == 500 and len(calls) <= 3, calls
    print(calls)
""")


def test_under_gevent_greenlets_queue_behind_a_flush():
    done = subprocess.run([sys.executable, "-c", GEVENT_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1, 499]"


def test_the_gateway_celery_app_builds_no_backend_per_thread():
    """Under gevent a thread is a greenlet: a request's greenlet must not build its own backend."""
    from prorl_celery.core.settings import Settings
    from prorl_celery.services import Services

    services = Services(Settings())
    app = services.celery
    seen: list = []
    threads = [threading.Thread(target=lambda: seen.append((app.backend, app.thread_oid))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {id(backend) for backend, _ in seen} == {id(app.backend)} and {oid for _, oid in seen} == {app.thread_oid}
    services.close()


# -- the gateway -------------------------------------------------------------------------------------

def fault(reward: float) -> dict:
    return {"data_source": "fault", "reward": reward}


def hold_first_batch(app, queued: int) -> list[int]:
    """Make the app's first batch wait until ``queued`` requests are queued behind it; returns
    the sizes of the batches submitted."""
    intake = app.extensions["prorl"].intake
    submit, sizes = intake._submit, []

    def held(specs):
        if not sizes:
            wait_until(lambda: len(intake._queue) >= queued, 20, "requests queued behind the first")
        sizes.append(len(specs))
        return submit(specs)
    intake._submit = held
    return sizes


def post_all(app, bodies: list[dict]) -> list:
    def one(body):
        return app.test_client().post("/process", json=body)
    with ThreadPoolExecutor(len(bodies)) as pool:
        first = pool.submit(one, bodies[0])
        wait_until(lambda: app.extensions["prorl"].intake._leading, 20, "the first request submitting")
        futures = [first] + [pool.submit(one, body) for body in bodies[1:]]
        return [future.result() for future in futures]


@pytest.fixture
def fresh_app(cluster):
    """An app of its own (its batcher counts only this test's submits)."""
    redis.Redis.from_url(cluster.state_url).flushdb()
    app = make_app(cluster)
    yield app
    close_app(app)


def test_concurrent_process_requests_are_created_in_two_submits(fresh_app):
    sizes = hold_first_batch(fresh_app, queued=11)
    bodies = [{"instance": fault(i / 12), "job_id": f"grouped-{i}"} for i in range(12)]
    replies = post_all(fresh_app, bodies)
    assert [r.status_code for r in replies] == [200] * 12, [r.text for r in replies]
    assert [(r.json["job_id"], r.json["status"]) for r in replies] == [(f"grouped-{i}", "completed") for i in range(12)]
    assert [r.json["reward"] for r in replies] == pytest.approx([i / 12 for i in range(12)])
    assert sizes == [1, 11] and fresh_app.extensions["prorl"].intake.batches == 2


def test_a_repeated_job_id_in_one_batch_is_one_job(fresh_app):
    sizes = hold_first_batch(fresh_app, queued=3)
    body = {"instance": fault(0.75), "job_id": "twice"}
    replies = post_all(fresh_app, [{"instance": fault(0.5)}, body, body, {"instance": fault(0.25)}])
    assert sizes == [1, 3]
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    assert [r.json["reward"] for r in replies] == pytest.approx([0.5, 0.75, 0.75, 0.25])
    assert replies[1].json == replies[2].json  # the one job's result, for both requests
    recent = redis.Redis.from_url(fresh_app.extensions["prorl"].settings.redis_url).zcard(keys.RECENT_JOBS)
    assert recent == 3


def test_an_unreachable_broker_fails_every_request_of_the_batch_with_503(cluster, monkeypatch):
    # a broker port nobody listens on; one quick retry instead of ~30 s of them per job
    monkeypatch.setattr(celery_app, "PUBLISH_RETRY", {"max_retries": 1, "interval_start": 0, "interval_step": 0,
                                                      "interval_max": 0})
    app = make_app(cluster, broker_url=f"redis://127.0.0.1:{free_port()}/0")
    try:
        sizes = hold_first_batch(app, queued=4)
        replies = post_all(app, [{"instance": fault(1.0), "job_id": f"stranded-{i}"} for i in range(5)])
        assert sizes == [1, 4]
        assert [(r.status_code, r.json["code"]) for r in replies] == [(503, "service_unavailable")] * 5
        assert all("broker is unreachable" in r.json["message"] for r in replies)
        store = app.extensions["prorl"].store
        assert {store.load(f"stranded-{i}").status.value for i in range(5)} == {"failed"}  # not pending forever
    finally:
        close_app(app)


def test_concurrent_reads_of_records_go_out_together(fresh_app):
    client = fresh_app.test_client()
    ids = [client.post("/jobs", json={"instance": fault(i / 4)}).json["job_id"] for i in range(4)]
    for job_id in ids:
        assert client.get(f"/jobs/{job_id}", query_string={"wait": 30}).status_code == 200
    records = fresh_app.extensions["prorl"].records
    read, sizes = records._submit, []

    def held(job_ids):
        if not sizes:
            wait_until(lambda: len(records._queue) >= 3, 20, "reads queued behind the first")
        sizes.append(len(job_ids))
        return read(job_ids)
    records._submit = held

    def get(job_id):
        return fresh_app.test_client().get(f"/jobs/{job_id}")
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(get, ids[0])
        wait_until(lambda: records._leading, 20, "the first read")
        futures = [first] + [pool.submit(get, job_id) for job_id in [*ids[1:], "no-such-job"]]
        replies = [future.result() for future in futures]
    # a GET without wait is one record read (no status read first): the unknown id's is in the batch
    assert sizes == [1, 4]
    assert [r.json["reward"] for r in replies[:4]] == pytest.approx([i / 4 for i in range(4)])
    assert replies[4].status_code == 404 and replies[4].json["code"] == "job_not_found"
