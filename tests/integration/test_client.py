"""The trainer-side client: retries, fail-over, idempotent ids and errors against an in-memory
gateway (an httpx transport), then the same calls against the real service."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from prorl_celery.core.errors import BadRequest, JobNotFound, ProrlError, ServiceStopped, UnknownTask
from prorl_celery.dev.local import free_port
from prorl_celery.trainer.client import (
    AsyncRolloutClient,
    GatewayError,
    GatewayUnavailable,
    JobRequest,
    RequestRejected,
    RetryPolicy,
    RolloutClient,
    RolloutOutcome,
    WaitTimeout,
    distribute_backends,
    is_trainable,
    reward_of,
)
from tests.support.fake_gateway import FAST, LOSE_REPLY, FakeGateway, fake_client

# -- unit tests: in-memory gateway ------------------------------------------------------------------

@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_retried_submit_reuses_its_job_id_and_creates_once():
    fake = FakeGateway()
    fake.faults = [503, httpx.ConnectError, LOSE_REPLY, 502]
    async with fake_client(fake) as client:
        job_id = await client.submit({"reward": 1.0}, job_id="trainer-1")
        assert job_id == "trainer-1"
        assert (await client.wait(job_id))["status"] == "completed"
    # the job was created by the attempt whose reply was lost; the next attempt found it
    assert list(fake.jobs) == ["trainer-1"] and fake.requests["POST /jobs"] == 2


@pytest.mark.anyio
async def test_fails_over_to_the_next_url_and_stays_there():
    fake = FakeGateway()
    fake.down = {"gw-a"}
    async with fake_client(fake, ["http://gw-a:1", "http://gw-b:2"]) as client:
        results = [await client.process({"reward": 0.5}) for _ in range(3)]
    assert [r["reward"] for r in results] == [0.5] * 3
    assert fake.hosts == {"gw-b": 6}  # one submit and one wait per job, all on the live gateway


@pytest.mark.anyio
async def test_gateway_errors_map_to_the_error_tree():
    fake = FakeGateway()
    async with fake_client(fake) as client:
        with pytest.raises(JobNotFound) as missing:
            await client.poll("nope")
        assert isinstance(missing.value, KeyError) and missing.value.status_code == 404
        assert missing.value.code == "job_not_found" and "nope" in missing.value.message
        for status, expected in [(400, BadRequest), (418, RequestRejected), (500, GatewayError)]:
            fake.faults = [status]
            with pytest.raises(expected) as caught:
                await client.submit({})
            assert isinstance(caught.value, ProrlError) and caught.value.status_code == status
        fake.faults = [503] * 10
        with pytest.raises(ServiceStopped):  # after the bounded retries
            await client.submit({})
        assert fake.faults == [503] * 4  # FAST makes six attempts


@pytest.mark.anyio
async def test_unreachable_gateways_give_up_within_the_budget():
    fake = FakeGateway()
    fake.down = {"gw-a", "gw-b"}
    policy = RetryPolicy(attempts=100, backoff_s=0.01, max_backoff_s=0.05, deadline_s=0.5)
    started = time.monotonic()
    async with fake_client(fake, ["http://gw-a:1", "http://gw-b:2"], retry=policy) as client:
        with pytest.raises(GatewayUnavailable) as caught:
            await client.status()
    assert isinstance(caught.value, ConnectionError) and "gw-a" in str(caught.value)
    assert time.monotonic() - started < 3


@pytest.mark.anyio
async def test_clear_is_retried_only_when_it_surely_never_arrived():
    fake = FakeGateway()
    async with fake_client(fake) as client:
        fake.faults = [httpx.ConnectError]
        assert await client.clear_llm_servers() == 1
        fake.faults = [httpx.ReadError]  # may have been applied: bumping twice is not a retry
        with pytest.raises(GatewayUnavailable):
            await client.clear_llm_servers()


@pytest.mark.anyio
async def test_wait_timeout_leaves_the_job_running():
    fake = FakeGateway()
    async with fake_client(fake, poll_s=0.05) as client:
        job_id = await client.submit({"delay": 0.6})
        with pytest.raises(WaitTimeout) as caught:
            await client.wait(job_id, timeout_s=0.1)
        assert isinstance(caught.value, TimeoutError) and caught.value.status == "run"
        assert (await client.wait(job_id))["status"] == "completed"


@pytest.mark.anyio
async def test_async_as_completed_yields_in_completion_order():
    fake = FakeGateway()
    async with fake_client(fake, poll_s=0.2) as client:
        ids = await client.submit_many(JobRequest({"delay": d, "reward": d}) for d in (0.3, 0.1, 0.2, 0.0))
        order = [r["reward"] async for r in client.as_completed(ids)]
        assert order == [0.0, 0.1, 0.2, 0.3]
        assert [r["reward"] for r in await client.wait_all(ids)] == [0.3, 0.1, 0.2, 0.0]


@pytest.mark.anyio
async def test_many_waits_are_one_stream_per_chunk_resumed_after_a_drop(monkeypatch):
    import prorl_celery.trainer.client as client_module

    monkeypatch.setattr(client_module, "WAIT_MANY_MAX", 2)
    fake = FakeGateway()
    async with fake_client(fake) as client:
        ids = await client.submit_many(JobRequest({"delay": d, "reward": d}) for d in (0.3, 0.1, 0.2, 0.0, 0.15))
        fake.faults = [httpx.ReadError]  # the first stream fails: retried with its ids
        order = [r["reward"] async for r in client.as_completed(ids)]
        assert order == [0.0, 0.1, 0.15, 0.2, 0.3]
        assert fake.requests["POST /jobs/wait"] == 3 and "GET /jobs/<id>" not in fake.requests  # 3 chunks
        assert client.retried == 1
        with pytest.raises(JobNotFound):
            [r async for r in client.as_completed([ids[0], "nope"])]
        slow = await client.submit({"delay": 5})
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as caught:
            await client.wait_all([ids[0], slow], timeout_s=0.2)
        assert caught.value.job_id == slow and caught.value.status == "run" and time.monotonic() - started < 2
        outcomes = [o async for o in client.wait_stream([slow, "nope"], timeout_s=0.1)]
        assert [(j, type(o).__name__) for j, o in outcomes] == [("nope", "JobNotFound"), (slow, "WaitTimeout")]


@pytest.mark.anyio
async def test_submit_many_sends_one_request_per_batch():
    fake = FakeGateway()
    async with fake_client(fake) as client:
        ids = await client.submit_many((JobRequest({"reward": 1}) for _ in range(1201)), batch_size=500)
    assert len(set(ids)) == 1201 and fake.requests["POST /jobs"] == 3


@pytest.mark.anyio
@pytest.mark.parametrize("legacy", [False, True], ids=["outcomes", "older-server"])
async def test_the_outcome_says_whether_the_reward_is_one(legacy):
    fake = FakeGateway()
    fake.legacy = legacy  # an older server: no reward_valid, a failed job's reward a number (1.0 here)
    endings = ("ok", "agent_error", "eval_error", "backend_error", "timeout")
    async with fake_client(fake) as client:
        ids = await client.submit_many(JobRequest({"status": e, "reward": 1.0}, job_id=e) for e in endings)
        views = {r["job_id"]: RolloutOutcome.of(r) for r in await client.wait_all(ids)}
    assert {j: (v.reward_valid, v.reward) for j, v in views.items()} == {
        "ok": (True, 1.0), "agent_error": (True, 1.0), "eval_error": (False, None),
        "backend_error": (False, None), "timeout": (False, None)}
    assert [views[e].retryable for e in endings] == [False, False, True, True, False]
    if legacy:  # the status alone: a failed job is the environment's, unless EVAL failed
        assert [views[e].outcome for e in endings] == ["ok", "ok", "env_error", "env_error", "timeout"]
    else:
        assert [views[e].outcome for e in endings] == list(endings)
        assert (views["eval_error"].stage, views["eval_error"].detail) == ("eval", "scripted eval_error")
        assert views["eval_error"].describe() == "job eval_error ended eval_error in eval: scripted eval_error"


def test_reward_of_is_the_one_rule():
    assert reward_of({"status": "completed", "reward": 0.0}) == 0.0  # an older server's completed job
    assert reward_of({"status": "failed", "reward": 0.0}) is None  # ... and its failed one
    assert reward_of({"status": "completed", "reward_valid": False, "reward": None, "score": 0.0}) is None
    assert reward_of({"status": "failed", "reward_valid": True, "reward": 0.5}) == 0.5  # the server says so
    assert reward_of({"status": "completed", "reward_valid": True, "reward": None}) is None  # no number, no reward
    assert not is_trainable({"status": "pending_run"}) and is_trainable({"status": "completed", "reward": 1})
    assert RolloutOutcome.of({"job_id": "j", "status": "run"}).outcome is None  # not ended yet


@pytest.mark.anyio
async def test_run_until_valid_resubmits_invalid_rewards_up_to_the_bound():
    def script(body: dict[str, Any]) -> tuple[str, float, float]:
        first, later = body["instance"]["endings"]
        return (first if "-re" not in body["job_id"] else later), 1.0, 0.0

    fake = FakeGateway(script)
    requests = [JobRequest({"endings": endings}, job_id=name) for name, endings in
                (("steady", ["ok", "ok"]), ("flaky", ["env_error", "ok"]), ("broken", ["eval_error", "backend_error"]),
                 ("cut", ["timeout", "ok"]))]
    async with fake_client(fake) as client:
        runs = await client.run_until_valid(requests, max_resubmits=2)
        assert [[r["job_id"] for r in run] for run in runs] == [
            ["steady"], ["flaky", "flaky-re1"], ["broken", "broken-re1", "broken-re2"], ["cut", "cut-re1"]]
        assert [reward_of(run[-1]) for run in runs] == [1.0, 1.0, None, 1.0]
        assert fake.jobs["flaky-re1"].body["instance"] == requests[1].instance  # the same rollout again
        once = await client.run_until_valid([JobRequest({"endings": ["env_error", "ok"]}, job_id="x")])
        assert [[r["outcome"] for r in run] for run in once] == [["env_error"]]  # no resubmission by default


@pytest.mark.anyio
async def test_set_policy_version_of_registered_backends():
    fake = FakeGateway()
    async with fake_client(fake) as client:
        await client.add_llm_server("http://vllm:8000/v1")
        assert await client.set_policy_version(0, "http://vllm:8000/v1") == {"http://vllm:8000/v1": 0}
        assert fake.policy_version == 0 and (await client.process({}))["trajectory"]["policy_versions"] == [0]
        with pytest.raises(BadRequest, match="not registered"):
            await client.set_policy_version(1, "http://elsewhere:8000/v1")


def test_sync_client_facade_and_backend_distribution():
    fakes = {url: FakeGateway() for url in ("http://10.0.0.1:8080", "http://10.0.0.2:8080")}
    clients = {url: RolloutClient(url, retry=FAST, transport=fake.transport) for url, fake in fakes.items()}
    try:
        client = clients["http://10.0.0.1:8080"]
        ids = client.submit_many([JobRequest({"delay": 0.2, "reward": 1}), JobRequest({"reward": 0})])
        assert [r["reward"] for r in client.as_completed(ids)] == [0, 1]
        outcome = client.cancel(client.submit({"delay": 5}))
        assert len(outcome.cancelled) == 1 and outcome.not_cancelled == {}
        assert client.cancel(ids).not_cancelled == {ids[0]: "completed", ids[1]: "completed"}
        plan = distribute_backends(clients, ["http://10.0.0.2:8000/v1", "http://10.0.0.1:8000/v1",
                                             "http://10.0.0.3:8000/v1"])
        assert plan == {"http://10.0.0.1:8080": ["http://10.0.0.1:8000/v1", "http://10.0.0.3:8000/v1"],
                        "http://10.0.0.2:8080": ["http://10.0.0.2:8000/v1"]}
        assert {url: fake.backends for url, fake in fakes.items()} == plan
        assert all(fake.generation == 1 for fake in fakes.values())  # cleared before registering
    finally:
        for c in clients.values():
            c.close()


# -- the real service -------------------------------------------------------------------------------

def test_real_service_jobs_errors_and_backends(gateway):
    with RolloutClient(gateway.cluster.gateway_url, poll_s=5) as client:
        # a job that only ends when cancelled, after two quick ones: completion order, not submission
        ids = client.submit_many([JobRequest({"data_source": "fault", "run_sleep_s": 60}),
                                  JobRequest({"data_source": "fault", "reward": 0.5}),
                                  JobRequest({"data_source": "fault", "reward": 0.25})])
        seen = []
        for result in client.as_completed(ids):
            seen.append((result["job_id"], result["status"]))
            if len(seen) == 2:
                assert client.cancel(ids).cancelled == [ids[0]]
        assert sorted(seen[:2]) == sorted([(ids[1], "completed"), (ids[2], "completed")])
        assert seen[2] == (ids[0], "cancelled")
        again = client.submit({"data_source": "fault", "reward": 0.5}, job_id=ids[1])
        assert again == ids[1] and client.status()["jobs"]["completed"] == 2  # never ran twice
        assert client.wait(ids[1])["reward"] == 0.5
        with pytest.raises(UnknownTask) as unknown:
            client.submit({"data_source": "chess"})
        assert unknown.value.code == "unknown_task" and "math" in unknown.value.message
        with pytest.raises(BadRequest, match="job_id"):
            client.submit({"data_source": "fault"}, job_id="no spaces allowed")
        with pytest.raises(JobNotFound):
            client.wait("never-submitted")
        generation = client.clear_llm_servers()
        assert client.add_llm_server("http://127.0.0.1:9/v1")["generation"] == generation
        assert [s["address"] for s in client.llm_servers()["servers"]] == ["http://127.0.0.1:9/v1"]


def test_real_service_fail_over_from_a_dead_gateway(gateway):
    dead = f"http://127.0.0.1:{free_port()}"

    async def scenario() -> list[dict]:
        async with AsyncRolloutClient([dead, gateway.cluster.gateway_url], retry=FAST) as client:
            ids = await client.submit_many(JobRequest({"data_source": "fault", "reward": 0.25}) for _ in range(4))
            return [r async for r in client.as_completed(ids)]

    results = asyncio.run(scenario())
    assert [r["status"] for r in results] == ["completed"] * 4 and {r["reward"] for r in results} == {0.25}
