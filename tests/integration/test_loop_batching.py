"""The RUN loop's Redis and broker round trips, batched off the loop (``event_loops.Batched``),
against a real redis-server: policy-version reads, backend assignments and releases, and the EVAL
hand-over's publishes, each one round trip for the stages of a loop that ask at once, each
caller still getting work done after it asked, and nothing lost when callers are aborted."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
from celery import Celery

from prorl_celery.celery_app import create_celery, enqueue_many
from prorl_celery.core.event_loops import Batched, StageLoop
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.llm.pool import BackendPool
from prorl_celery.state import keys
from tests.support.services import own_redis_fixture

DB = 7
#: the module's own redis-server: its round trips are counted in INFO commandstats, which counts
#: every client of a server (a shared one's other clients made the counts flaky)
own_redis = own_redis_fixture("redis-batching")


@pytest.fixture
def client(own_redis) -> redis.Redis:
    connection = redis.Redis.from_url(f"{own_redis}/{DB}", decode_responses=True)
    connection.flushdb()
    yield connection
    connection.flushdb()


@pytest.fixture
def stage_loop():
    loop = StageLoop(64, name="test-batching")
    yield loop
    loop.close()


def calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_calls_made_in_one_turn_of_the_loop_share_one_batch_that_runs_after_them(stage_loop):
    batches: list[tuple[float, list[int]]] = []

    def run_batch(items: list[int]) -> list[int]:
        batches.append((time.monotonic(), list(items)))
        return [item * 2 for item in items]

    batched: Batched[int, int] = Batched(run_batch)

    async def call(item: int) -> tuple[float, int]:
        asked = time.monotonic()
        return asked, await batched(item)

    async def burst() -> list[tuple[float, int]]:
        first = [asyncio.ensure_future(call(i)) for i in range(20)]  # their first steps: one turn
        await asyncio.sleep(0.02)
        later = [asyncio.ensure_future(call(i)) for i in range(20, 50)]
        return await asyncio.gather(*first, *later)

    results = stage_loop.call(burst(), timeout_s=10)
    assert [doubled for _, doubled in results] == [2 * i for i in range(50)]
    assert [items for _, items in batches] == [list(range(20)), list(range(20, 50))]
    started = {item: at for at, items in batches for item in items}
    assert all(started[i] >= asked for i, (asked, _) in enumerate(results))
    assert batched.batches == 2


def test_a_failed_batch_fails_its_callers_and_the_next_one_runs(stage_loop):
    outcomes = iter([RuntimeError("Redis away"), None])

    def run_batch(items: list[str]) -> list[str]:
        error = next(outcomes)
        if error:
            raise error
        return items

    batched: Batched[str, str] = Batched(run_batch)

    async def twice() -> tuple[BaseException | str, str]:
        first = await asyncio.gather(batched("a"), return_exceptions=True)
        return first[0], await batched("b")

    failed, ok = stage_loop.call(twice(), timeout_s=10)
    assert isinstance(failed, RuntimeError) and ok == "b"


def test_policy_versions_are_read_off_the_loop_once_per_batch_and_after_each_call(client, stage_loop):
    pool = BackendPool(client)
    pool.add("http://a:1/v1", version=3)
    pool.add("http://b:1/v1")
    before, hgets = calls(client, "hgetall"), calls(client, "hget")

    async def reads() -> list[int | None]:
        return await asyncio.gather(*(pool.current_version(address)
                                      for address in ["http://a:1/v1", "http://b:1/v1"] * 100))

    assert stage_loop.call(reads(), timeout_s=10) == [3, None] * 100
    made = calls(client, "hgetall") - before
    assert 1 <= made <= 3 and calls(client, "hget") == hgets  # not 200 HGETs

    async def after_update() -> int | None:
        pool.set_version(4, "http://a:1/v1")  # the trainer's update lands: the next read sees it
        return await pool.current_version("http://a:1/v1")

    assert stage_loop.call(after_update(), timeout_s=10) == 4


def test_backends_are_assigned_in_one_round_trip_and_an_aborted_stage_gives_its_back(client, stage_loop):
    pool = BackendPool(client)
    pool.add("http://a:1/v1")
    pool.add("http://b:1/v1", protocol="sglang")
    job_ids = [f"job-{i}" for i in range(40)]
    for job_id in job_ids:
        client.hset(keys.job(job_id), mapping={"status": JobStatus.RUN.value, "attempt": 1})
    client.hset(keys.job("job-0"), "attempt", 2)  # another attempt now: counted, not written

    async def assign() -> list:
        return await asyncio.gather(*(pool.acquire_on_loop(job_id, 1) for job_id in job_ids))

    assignments = stage_loop.call(assign(), timeout_s=10)
    assert sorted(a.address for a in assignments).count("http://a:1/v1") == 20  # least-assigned, in turn
    inflight = client.hgetall(keys.LLM_INFLIGHT)
    assert inflight == {"http://a:1/v1": "20", "http://b:1/v1": "20"}
    records = [client.hmget(keys.job(job_id), "backend", "backend_protocol") for job_id in job_ids]
    assert records[0] == [None, None]
    assert all(record == [a.address, a.protocol] for record, a in zip(records[1:], assignments[1:]))

    async def release_all() -> None:
        await asyncio.gather(*(pool.release_on_loop(a.address) for a in assignments))

    stage_loop.call(release_all(), timeout_s=10)
    assert client.hgetall(keys.LLM_INFLIGHT) == {"http://a:1/v1": "0", "http://b:1/v1": "0"}

    # a stage aborted before its assignment came back, or after it came back but before the
    # stage resumed to take it: nobody holds it, so it is given back
    async def aborted(after_the_batch: bool) -> None:
        task = asyncio.ensure_future(pool.acquire_on_loop("job-1", 1))
        if after_the_batch:
            await asyncio.sleep(0)  # the stage has asked; its batch runs next, then this cancel
        asyncio.get_running_loop().call_soon(task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task

    for after_the_batch in (False, True):
        stage_loop.call(aborted(after_the_batch), timeout_s=10)
        assert sum(int(v) for v in client.hgetall(keys.LLM_INFLIGHT).values()) == 0
        assert client.zscore(keys.LLM_BACKENDS, "http://a:1/v1") is not None


@pytest.fixture
def broker(own_redis) -> Celery:
    settings = Settings(redis_url=f"{own_redis}/{DB + 1}", broker_url=f"{own_redis}/{DB + 1}")
    app = create_celery(settings, set_as_current=False)
    broker = redis.Redis.from_url(f"{own_redis}/{DB + 1}")
    broker.flushdb()
    yield app
    app.close()
    broker.flushdb()


def queued(app: Celery, queue: str) -> list[str]:
    import json

    broker = redis.Redis.from_url(app.conf.broker_url)
    return sorted(json.loads(m)["headers"]["argsrepr"] for m in broker.lrange(queue, 0, -1))


def test_eval_publishes_of_many_stages_go_in_batches_and_none_is_lost_when_stages_are_aborted(broker, stage_loop):
    sent: list[int] = []

    def publish(job_ids: list[str]) -> list[None]:
        sent.append(len(job_ids))
        enqueue_many(Stage.EVAL, job_ids, celery=broker)
        return [None] * len(job_ids)

    batched: Batched[str, None] = Batched(publish, shielded=True)
    finished: list[str] = []

    async def stage(job_id: str) -> None:
        await batched(job_id)
        finished.append(job_id)

    async def burst() -> None:
        tasks = [asyncio.ensure_future(stage(f"j{i}")) for i in range(60)]
        await asyncio.sleep(0)  # each stage has asked to publish; the batch has not run yet
        for task in tasks[::3]:  # a third of the stages are aborted (the loop cancels their tasks)
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 20

    stage_loop.call(burst(), timeout_s=20)
    assert queued(broker, Stage.EVAL.value) == sorted(repr([f"j{i}"]) for i in range(60))
    assert sent == [60]  # one batch, each job once
    assert len(finished) == 40


def test_a_stage_holds_its_slot_until_its_eval_message_is_out(broker, stage_loop):
    gate = threading.Event()

    def publish(job_ids: list[str]) -> list[None]:
        gate.wait(5)
        enqueue_many(Stage.EVAL, job_ids, celery=broker)
        return [None] * len(job_ids)

    batched: Batched[str, None] = Batched(publish, shielded=True)
    for i in range(5):
        assert stage_loop.admit(lambda loop, i=i: batched(f"k{i}"))
    # a worker draining at SIGTERM waits for its stages: they are not done while unpublished
    assert not stage_loop.wait_idle(0.3)
    gate.set()
    assert stage_loop.wait_idle(5)
    assert queued(broker, Stage.EVAL.value) == sorted(repr([f"k{i}"]) for i in range(5))
