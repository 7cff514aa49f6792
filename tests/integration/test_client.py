"""The trainer-side client: retries, fail-over, idempotent ids and errors against an in-memory
gateway (an httpx transport), then the same calls against the real service."""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from prorl_celery.core.errors import BadRequest, JobNotFound, ProrlError, ServiceStopped, UnknownTask
from prorl_celery.core.outcomes import Outcome
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

LOSE_REPLY = "lose reply"
FAST = RetryPolicy(attempts=6, backoff_s=0.001, max_backoff_s=0.01, deadline_s=5)

# -- an in-memory gateway ---------------------------------------------------------------------------

#: POST /jobs body -> (how it ends: a status or an outcome class, reward, seconds until it ends)
Script = Callable[[dict[str, Any]], tuple[str, float, float]]
#: the status a scripted outcome class ends in, and the outcome a scripted status stands for
STATUS_OF = {"ok": "completed", "agent_error": "completed", "env_error": "failed", "backend_error": "failed",
             "eval_error": "failed", "timeout": "timeout", "cancelled": "cancelled"}
OUTCOME_OF = {"completed": "ok", "failed": "env_error", "timeout": "timeout", "cancelled": "cancelled"}


def default_script(body: dict[str, Any]) -> tuple[str, float, float]:
    instance = body["instance"]
    return instance.get("status", "completed"), float(instance.get("reward", 1.0)), float(instance.get("delay", 0))


@dataclass
class FakeJob:
    job_id: str
    body: dict[str, Any]
    generation: int
    status: str = "pending_init"
    reward: float = 0.0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.TimerHandle | None = None
    #: the backend's policy version when the job started (None: never set)
    policy_version: int | None = None
    outcome: str | None = None
    #: answer as a server from before outcomes: no outcome fields, the reward a number always
    legacy: bool = False

    def result(self) -> dict[str, Any]:
        instance = self.body["instance"]
        trajectory = None if self.policy_version is None else {"policy_versions": [self.policy_version]}
        if instance.get("tokens"):  # a trajectory of that many model tokens
            n = int(instance["tokens"])
            trajectory = {**(trajectory or {"policy_versions": []}), "prompt_ids": [1, 2],
                          "response_ids": list(range(10, 10 + n)), "response_mask": [1] * n,
                          "response_logprobs": [-0.5] * n}
        result = {"job_id": self.job_id, "status": self.status, "reward": self.reward,
                  "instance_id": instance.get("instance_id"), "trajectory_id": instance.get("trajectory_id"),
                  "generation": self.generation, "critical_error": None, "error": None, "trajectory": trajectory}
        if self.legacy or self.outcome is None:
            return result
        outcome = Outcome(self.outcome)
        stage = {"env_error": "init", "backend_error": "run", "eval_error": "eval"}.get(outcome.value)
        return {**result, "outcome": outcome.value, "reward_valid": outcome.reward_valid,
                "retryable": outcome.retryable, "outcome_stage": stage, "attempts": [],
                "detail": None if outcome is Outcome.OK else f"scripted {outcome.value}",
                "reward": self.reward if outcome.reward_valid else None}


class FakeGateway:
    """The gateway's job endpoints in memory, as an httpx transport (``/jobs``, ``/cancel``, backends).

    ``faults`` is consumed one per request: None serves it, an int answers with that status and a JSON error body,
    an exception class is raised as a transport error, ``LOSE_REPLY`` serves the request and then
    fails as if the reply were lost. Hosts in ``down`` refuse every connection. Results carry the
    outcome fields (``reward`` null when not valid) unless ``legacy``.
    """

    def __init__(self, script: Script = default_script) -> None:
        self.script = script
        self.jobs: dict[str, FakeJob] = {}
        self.faults: list[int | type[Exception] | str | None] = []
        self.down: set[str] = set()
        self.requests: Counter[str] = Counter()
        self.hosts: Counter[str] = Counter()
        self.generation = 0
        self.policy_version: int | None = None
        self.legacy = False
        self.backends: list[str] = []
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.hosts[request.url.host] += 1
        if self.faults:
            fault = self.faults.pop(0)
            if fault is None:  # this request goes through
                return await self.serve(request)
            if isinstance(fault, int):
                code = {400: "bad_request", 503: "service_stopped"}.get(fault, "boom")
                return httpx.Response(fault, json={"code": code, "message": f"scripted {fault}"})
            if fault != LOSE_REPLY:
                raise fault("scripted transport failure", request=request)
            await self.serve(request)
            raise httpx.ReadError("scripted lost reply", request=request)
        return await self.serve(request)

    async def serve(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        route = path if path == "/jobs/wait" else path.split("/jobs/")[0] or "/jobs/<id>"
        self.requests[f"{request.method} {route}"] += 1
        payload = json.loads(request.content) if request.content else {}
        if request.method == "POST" and path == "/jobs":
            if isinstance(payload, list):  # a batch: each request on its own, answers in order
                replies = [self.create(body) for body in payload]
                bad = next((r for r in replies if r.status_code != 202), None)
                return bad or httpx.Response(202, json={"jobs": [json.loads(r.content) for r in replies]})
            return self.create(payload)
        if request.method == "POST" and path == "/jobs/wait":
            return self.wait_many(payload["job_ids"], float(payload.get("timeout_s", 600)), request.url.host)
        if request.method == "GET" and path.startswith("/jobs/"):
            return await self.get(path.removeprefix("/jobs/"), float(request.url.params.get("wait", 0)))
        if path == "/cancel":
            return self.cancel(payload["job_ids"])
        if path == "/add_llm_server":
            self.backends.append(payload["address"])
            return httpx.Response(200, json={"added": True, "generation": self.generation, **payload})
        if path == "/llm_servers/version":
            return self.set_version(payload["version"], payload.get("address"))
        if path == "/clear_llm_server":
            self.generation += 1
            self.backends.clear()
            return httpx.Response(200, json={"generation": self.generation})
        return httpx.Response(404, json={"code": "not_found", "message": path})

    def create(self, body: dict[str, Any]) -> httpx.Response:
        job_id = body["job_id"]
        created = job_id not in self.jobs
        if created:
            ending, reward, delay = self.script(body)  # first: a script may change the backends' state
            job = self.jobs[job_id] = FakeJob(job_id, body, self.generation, policy_version=self.policy_version,
                                              legacy=self.legacy)
            job.status = "run"
            job.timer = asyncio.get_running_loop().call_later(delay, self.finish, job, ending, reward)
        return httpx.Response(202, json={"job_id": job_id, "status": self.jobs[job_id].status, "created": created})

    def finish(self, job: FakeJob, ending: str, reward: float) -> None:
        """End ``job`` as ``ending``: a status (its outcome the status's) or an outcome class."""
        if not job.ended.is_set():
            job.status, job.reward = STATUS_OF.get(ending, ending), reward
            job.outcome = ending if ending in STATUS_OF else OUTCOME_OF[ending]
            job.ended.set()

    def set_version(self, version: int, address: str | None) -> httpx.Response:
        """``POST /llm_servers/version``: every job created from now on records ``version``."""
        targets = [b for b in self.backends if address is None or b.rstrip("/") == address.rstrip("/")]
        if address is not None and not targets:
            return httpx.Response(400, json={"code": "bad_request", "message": f"{address} is not registered"})
        self.policy_version = version
        return httpx.Response(200, json={"versions": {target: version for target in targets}})

    async def get(self, job_id: str, wait: float) -> httpx.Response:
        job = self.jobs.get(job_id)
        if job is None:
            return httpx.Response(404, json={"code": "job_not_found", "message": f"no job with id {job_id!r}"})
        try:
            await asyncio.wait_for(job.ended.wait(), wait)
        except TimeoutError:
            return httpx.Response(202, json={"job_id": job_id, "status": job.status})
        return httpx.Response(200, json=job.result())

    def wait_many(self, job_ids: list[str], timeout_s: float, host: str) -> httpx.Response:
        """``POST /jobs/wait``: NDJSON lines as the jobs end, unknown ids first, pending ones at the
        timeout; the stream is cut (a read error) once ``host`` goes down."""
        ids = list(dict.fromkeys(job_ids))

        async def lines():
            for job_id in ids:
                if job_id not in self.jobs:
                    yield json.dumps({"job_id": job_id, "code": "job_not_found", "message": job_id}).encode() + b"\n"
            waits = {asyncio.ensure_future(self.jobs[j].ended.wait()): j for j in ids if j in self.jobs}
            deadline = time.monotonic() + timeout_s
            try:
                while waits:
                    left = deadline - time.monotonic()
                    done, _ = await asyncio.wait(waits, timeout=max(0.0, min(0.02, left)),
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if host in self.down:
                        raise httpx.ReadError("the gateway went down mid-stream")
                    if not done and left <= 0:
                        break
                    for task in done:
                        yield json.dumps(self.jobs[waits.pop(task)].result()).encode() + b"\n"
                for job_id in waits.values():
                    yield json.dumps({"job_id": job_id, "status": self.jobs[job_id].status}).encode() + b"\n"
            finally:
                for task in waits:
                    task.cancel()
        return httpx.Response(200, headers={"content-type": "application/x-ndjson"}, content=lines())

    def cancel(self, ids: list[str]) -> httpx.Response:
        cancelled, not_cancelled = [], {}
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None or job.ended.is_set():
                not_cancelled[job_id] = job.status if job else "not_found"
                continue
            job.timer.cancel()
            self.finish(job, "cancelled", 0.0)
            cancelled.append(job_id)
        return httpx.Response(200, json={"cancelled": cancelled, "not_cancelled": not_cancelled})

    def statuses(self) -> Counter[str]:
        return Counter(job.status for job in self.jobs.values())


def fake_client(fake: FakeGateway, urls: str | list[str] = "http://gw", **options) -> AsyncRolloutClient:
    return AsyncRolloutClient(urls, retry=options.pop("retry", FAST), transport=fake.transport, **options)


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
