"""An in-memory gateway (an httpx transport) for the trainer-side client's tests: it answers
/jobs, /jobs/wait, /cancel and the backend routes from a script, and injects faults (statuses,
connection errors, lost replies)."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from prorl_celery.core.outcomes import Outcome
from prorl_celery.trainer.client import AsyncRolloutClient, RetryPolicy

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
        if instance.get("turns"):  # a trajectory of that many model turns (one token each)
            n = int(instance["turns"])
            # a fork's shared turns are its source's, with the version that made them
            shared = self.body["fork"]["turn"] if "fork" in self.body else 0
            versions = [self.body.get("source_version") if i < shared else self.policy_version for i in range(n)]
            trajectory = {**(trajectory or {}), "num_turns": n,
                          "policy_versions": sorted({v for v in versions if v is not None}),
                          "turns": [{"output_start": i, "output_len": 1, "policy_version": v}
                                    for i, v in enumerate(versions)]}
        if instance.get("tokens"):  # a trajectory of that many model tokens
            n = int(instance["tokens"])
            trajectory = {**(trajectory or {"policy_versions": []}), "prompt_ids": [1, 2],
                          "response_ids": list(range(10, 10 + n)), "response_mask": [1] * n,
                          "response_logprobs": [-0.5] * n}
        result = {"job_id": self.job_id, "status": self.status, "reward": self.reward,
                  "instance_id": instance.get("instance_id"), "trajectory_id": instance.get("trajectory_id"),
                  "generation": self.generation, "critical_error": None, "error": None, "trajectory": trajectory}
        if "fork" in self.body:  # a fork: what it shares (every turn up to its fork point)
            result["fork"] = {**self.body["fork"], "shared_turns": self.body["fork"]["turn"]}
        if self.legacy or self.outcome is None:
            return result
        outcome = Outcome(self.outcome)
        stage = {"env_error": "init", "backend_error": "run", "eval_error": "eval"}.get(outcome.value)
        return {**result, "outcome": outcome.value, "reward_valid": outcome.reward_valid,
                "retryable": outcome.retryable, "outcome_stage": stage, "attempts": [],
                "detail": None if outcome is Outcome.OK else f"scripted {outcome.value}",
                "reward": self.reward if outcome.reward_valid else None}


class FakeGateway:
    """The gateway's job endpoints in memory, as an httpx transport (``/jobs``, ``/cancel``,
    ``/jobs/<id>/fork``, backends).

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
        route = path if path == "/jobs/wait" else path.split("/jobs/")[0] or (
            "/jobs/<id>/fork" if path.endswith("/fork") else "/jobs/<id>")
        self.requests[f"{request.method} {route}"] += 1
        payload = json.loads(request.content) if request.content else {}
        if request.method == "POST" and path == "/jobs":
            if isinstance(payload, list):  # a batch: each request on its own, answers in order
                replies = [self.create(body) for body in payload]
                bad = next((r for r in replies if r.status_code != 202), None)
                return bad or httpx.Response(202, json={"jobs": [json.loads(r.content) for r in replies]})
            return self.create(payload)
        if request.method == "POST" and path.startswith("/jobs/") and path.endswith("/fork"):
            return self.fork(path.removeprefix("/jobs/").removesuffix("/fork"), payload)
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

    def fork(self, source_id: str, payload: dict[str, Any]) -> httpx.Response:
        """``POST /jobs/<id>/fork``: jobs ``<group_id>-<i>`` whose bodies are the source's with a
        ``fork`` field (``of``, ``turn``, ``group``, ``index``, ``count``) for the script to read;
        idempotent under ``group_id``, 409 when it names another request's forks."""
        source = self.jobs.get(source_id)
        if source is None:
            return httpx.Response(404, json={"code": "job_not_found", "message": f"no job with id {source_id!r}"})
        turn, count = int(payload["turn"]), int(payload.get("count", 1))
        group = payload.get("group_id") or f"{source_id}-fork{turn}-{uuid.uuid4().hex[:6]}"
        replies = []
        for index in range(count):
            fork = {"of": source_id, "turn": turn, "group": group, "index": index, "count": count}
            job_id = f"{group}-{index}"
            existing = self.jobs.get(job_id)
            if existing is not None and existing.body.get("fork") != fork:
                return httpx.Response(409, json={"code": "conflict", "message": f"group_id {group!r} is taken"})
            body = {**source.body, "job_id": job_id, "fork": fork, "source_version": source.policy_version,
                    "instance": {**source.body["instance"], "trajectory_id": index}}
            replies.append(json.loads(self.create(body).content))
        return httpx.Response(202, json={"group_id": group, "fork_of": source_id, "turn": turn, "jobs": replies})

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
