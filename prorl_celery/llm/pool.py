"""The LLM backend pool: registered servers in a Redis sorted set keyed by assignments.

A job entering RUN takes the backend with the fewest assignments (one Lua script: pick and
count) and keeps it for every turn, so the backend's prefix cache serves the whole rollout.
``clear`` bumps the generation: new jobs use the new set, jobs in flight keep theirs.

Each backend also has a policy version, which the trainer sets when it loads new weights into
it; every model turn records the version of the backend that produced it.

Health. ``/add_llm_server`` probes a backend (``probe``: the protocol's models or health route,
a short timeout) and registers it either way, with what the probe found. An unhealthy backend
(one the probe could not reach, or one ``mark_unhealthy`` names after a RUN found it not
answering) is out of routing: ``acquire`` skips it, and a job with no healthy backend waits as
with none registered. ``reprobe``, on the RUN workers' reaper tick, probes each unhealthy backend
again at most once per interval across the cluster (a lock per backend) and puts it back once it
answers. ``remove`` forgets one backend (both forms of its address); jobs in flight on it finish
there.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import redis

from prorl_celery.core.event_loops import Batched, loop_local
from prorl_celery.core.status import JobStatus
from prorl_celery.llm.backends import base_url
from prorl_celery.state import keys
from prorl_celery.state.store import load_script

PROTOCOLS = ("vllm", "sglang", "llamacpp")
#: what ``probe`` asks each protocol's server for: vLLM's served models (what every job reads
#: first), SGLang's and llama.cpp's health routes
PROBE_PATHS = {"vllm": "/v1/models", "sglang": "/health", "llamacpp": "/health"}
#: most probes one ``reprobe`` runs at once
PROBE_THREADS = 16
#: the keys acquire_backend.lua routes by, before the jobs' own
ROUTE_KEYS = [keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_INFLIGHT, keys.LLM_GENERATION, keys.LLM_UNHEALTHY]


@dataclass(frozen=True)
class Assignment:
    address: str
    protocol: str
    generation: int


@dataclass(frozen=True)
class Health:
    """A backend's health: ``since`` (unix time) it has been in this state, ``detail`` the latest
    word on it (what the probe got, or why a RUN marked it)."""

    healthy: bool
    since: float | None = None
    detail: str = ""

    @classmethod
    def decode(cls, value: str | None) -> Health:
        """From the JSON the Lua scripts write; none recorded (a backend registered before health
        was): healthy, since unknown."""
        if not value:
            return cls(True)
        record = json.loads(value)
        return cls(bool(record.get("healthy", True)), record.get("since"), str(record.get("detail", "")))


@dataclass(frozen=True)
class BackendInfo:
    address: str
    protocol: str
    assigned: int
    in_flight: int
    version: int | None = None
    #: routed to (False: out of routing until a probe answers); since when, and the latest word
    healthy: bool = True
    since: float | None = None
    detail: str = ""


def probe(address: str, protocol: str = "vllm", timeout_s: float = 2.0) -> Health:
    """Ask the server at ``address`` whether it answers (``PROBE_PATHS``), within ``timeout_s``
    (connect, then each read): healthy on a 2xx answer, else unhealthy with what went wrong.

    The standard library's client, not httpx: the gateway probes under gevent, where importing
    httpcore pulls in trio when it is installed, which fails there (gevent takes select.epoll)."""
    url = base_url(address) + PROBE_PATHS.get(protocol, "/health")
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    started = time.monotonic()
    connection = kind(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        connection.request("GET", parts.path or "/", headers={"Accept": "application/json"})
        response = connection.getresponse()
        text = response.read(200).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as error:
        return Health(False, detail=f"GET {url}: {type(error).__name__}: {error or 'no answer'}")
    finally:
        connection.close()
    if not 200 <= response.status < 300:
        return Health(False, detail=f"GET {url} answered {response.status}: {text}")
    return Health(True, detail=f"GET {url} answered {response.status} in {time.monotonic() - started:.3f} s")


class BackendPool:
    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._add = load_script(client, "add_backend")
        self._acquire = load_script(client, "acquire_backend")
        self._set_health = load_script(client, "set_backend_health")

    def add(self, address: str, protocol: str = "vllm", version: int | None = None, *,
            health: Health | None = None) -> tuple[bool, int]:
        """Register ``address`` (at policy ``version`` when given) with ``health`` (what its probe
        found; default healthy); returns (newly added, current generation)."""
        health = health or Health(True)
        added, generation, _ = self._add(
            keys=[keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_GENERATION, keys.LLM_HEALTH, keys.LLM_UNHEALTHY],
            args=[address, protocol, int(health.healthy), health.detail, time.time()])
        if version is not None:
            self.redis.hset(keys.LLM_VERSIONS, address, version)
        return bool(added), int(generation)

    def clear(self) -> int:
        """Forget every backend; returns the new generation."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_VERSIONS, keys.LLM_HEALTH, keys.LLM_UNHEALTHY)
        pipe.incr(keys.LLM_GENERATION)
        return int(pipe.execute()[1])

    def remove(self, address: str) -> tuple[list[str], int]:
        """Forget one backend, under either form of its address (``base_url``); returns (the
        addresses removed, the new generation). Jobs in flight on it keep it for their remaining
        turns (their in-flight count stays until they release it). Not registered: KeyError."""
        targets = self._registered_as(address)
        if not targets:
            raise KeyError(address)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(keys.LLM_BACKENDS, *targets)
        for key in (keys.LLM_TYPES, keys.LLM_VERSIONS, keys.LLM_HEALTH):
            pipe.hdel(key, *targets)
        pipe.srem(keys.LLM_UNHEALTHY, *targets)
        pipe.incr(keys.LLM_GENERATION)
        return targets, int(pipe.execute()[-1])

    def _registered_as(self, address: str) -> list[str]:
        """The registered addresses that name the server ``address`` names (``http://h:p`` and
        ``http://h:p/v1`` are one server)."""
        registered = cast(list[str], self.redis.zrange(keys.LLM_BACKENDS, 0, -1))  # decode_responses client
        return sorted(r for r in registered if base_url(r) == base_url(address))

    # -- health --------------------------------------------------------------------------------

    def set_health(self, address: str, health: Health) -> Health | None:
        """Record ``health`` for the registered ``address`` exactly (``since`` moves only when
        the state changes); None when it is not registered."""
        written = self._set_health(keys=[keys.LLM_BACKENDS, keys.LLM_HEALTH, keys.LLM_UNHEALTHY],
                                   args=[address, int(health.healthy), health.detail, time.time()])
        return Health.decode(written) if written else None

    def mark_unhealthy(self, address: str, detail: str) -> list[str]:
        """A backend failed to answer (RUN calls this): take it out of routing until a probe
        finds it answering (``reprobe``). Either form of the address names it; returns the
        registered addresses marked (none: it is not registered, or no longer)."""
        marked = [a for a in self._registered_as(address) if self.set_health(a, Health(False, detail=detail))]
        return marked

    async def mark_unhealthy_on_loop(self, address: str, detail: str) -> list[str]:
        """``mark_unhealthy``, for a stage on an event loop (off the loop's thread)."""
        return await asyncio.to_thread(self.mark_unhealthy, address, detail)

    def health(self, address: str) -> Health:
        return Health.decode(cast(str | None, self.redis.hget(keys.LLM_HEALTH, address)))

    def reprobe(self, owner: str, *, timeout_s: float, interval_s: float) -> dict[str, Health]:
        """Probe the unhealthy backends no one has probed in the last ``interval_s`` (a lock per
        backend, so each is probed at most once per interval across the cluster) and record
        what each probe found; returns address -> health for those probed."""
        down = sorted(cast(set[str], self.redis.smembers(keys.LLM_UNHEALTHY)))
        lock_s = max(1, math.ceil(interval_s))
        mine = [a for a in down if self.redis.set(keys.llm_probe_lock(a), owner, nx=True, ex=lock_s)]
        return self._probe_and_record(mine, timeout_s)

    def probe_all(self, *, timeout_s: float) -> dict[str, Health]:
        """Probe every registered backend at once and record what each probe found: a RUN worker
        does this as it starts, so that a backend registered before a restart and gone since
        (its health in Redis still says healthy) leaves routing before any job is assigned it."""
        return self._probe_and_record(cast(list[str], self.redis.zrange(keys.LLM_BACKENDS, 0, -1)), timeout_s)

    def _probe_and_record(self, addresses: list[str], timeout_s: float) -> dict[str, Health]:
        """Probe ``addresses`` side by side and record each one's health; address -> health of
        those still registered."""
        if not addresses:
            return {}
        types = cast(dict[str, str], self.redis.hgetall(keys.LLM_TYPES))
        with ThreadPoolExecutor(max_workers=min(PROBE_THREADS, len(addresses)),
                                thread_name_prefix="prorl-probe") as probes:
            found = list(probes.map(lambda a: probe(a, types.get(a, "vllm"), timeout_s), addresses))
        recorded = {address: self.set_health(address, health) for address, health in zip(addresses, found)}
        return {address: health for address, health in recorded.items() if health is not None}

    def set_version(self, version: int, address: str | None = None) -> dict[str, int]:
        """Set the policy version of ``address``, or of every registered backend; returns the
        backends set. An address that is not registered is a KeyError."""
        if address is None:
            targets = sorted(cast(list[str], self.redis.zrange(keys.LLM_BACKENDS, 0, -1)))
        else:  # http://host:port and http://host:port/v1 name the same server
            targets = self._registered_as(address)
            if not targets:
                raise KeyError(address)
        if targets:
            self.redis.hset(keys.LLM_VERSIONS, mapping={target: version for target in targets})
        return {target: version for target in targets}

    def version(self, address: str) -> int | None:
        """The policy version ``address`` serves now (None until the trainer sets one)."""
        value = self.redis.hget(keys.LLM_VERSIONS, address)
        return int(value) if value is not None else None

    def versions(self) -> dict[str, int]:
        """Every backend's policy version (those the trainer set), in one read."""
        return {address: int(value) for address, value in
                cast(dict[str, str], self.redis.hgetall(keys.LLM_VERSIONS)).items()}

    async def current_version(self, address: str) -> int | None:
        """``version``, for a stage on an event loop: read after this call, with the other reads
        asked for in the same turn of the loop.

        Every turn reads the version as its request is sent and once its reply is in, and a RUN
        worker's thousand turns share one loop: a blocking HGET each would stall every stage for
        a Redis round trip, two thousand times a burst. The reads asked for in one iteration of
        the loop share one ``HGETALL`` at its end (``event_loops.Batched``), each caller still
        getting a value read after it asked (current at some moment between asking and getting
        it, as a blocking read right there would be)."""
        return await loop_local((self, "versions"), lambda: Batched(self._versions_of))(address)

    def _versions_of(self, addresses: list[str]) -> list[int | None]:
        versions = self.versions()
        return [versions.get(address) for address in addresses]

    def generation(self) -> int:
        return int(self.redis.get(keys.LLM_GENERATION) or 0)

    def acquire(self, job_id: str | None = None, attempt: int = 1) -> Assignment | None:
        """Take the least-assigned healthy backend for one job, or None when none is registered
        (or none of those registered is healthy).

        Given ``job_id``, the assignment is also written to the job's record in the same round
        trip, while the job is in RUN on ``attempt`` (a given-up attempt cannot overwrite the
        retried job's)."""
        if job_id is None:
            reply = self._acquire(keys=ROUTE_KEYS)
            return Assignment(reply[0], reply[1], int(reply[2])) if reply else None
        return self.acquire_many([(job_id, attempt)])[0]

    def acquire_many(self, jobs: list[tuple[str, int]]) -> list[Assignment | None]:
        """``acquire`` for several (job id, attempt) at once, in one script call: each job takes
        the least-assigned backend after the ones before it took theirs."""
        if not jobs:
            return []
        reply = self._acquire(keys=[*ROUTE_KEYS, *(keys.job(job_id) for job_id, _ in jobs)],
                              args=[JobStatus.RUN.value, *(attempt for _, attempt in jobs)])
        if not reply:
            return [None] * len(jobs)
        return [Assignment(reply[i], reply[i + 1], int(reply[i + 2])) for i in range(0, 3 * len(jobs), 3)]

    async def acquire_on_loop(self, job_id: str, attempt: int) -> Assignment | None:
        """``acquire``, for a stage on an event loop: the jobs that ask in one iteration of the
        loop share one script call (``event_loops.Batched``). A job
        whose stage was aborted meanwhile gives its backend back."""
        acquirer = loop_local((self, "acquire"), lambda: Batched(self.acquire_many, orphaned=self._give_back))
        return await acquirer((job_id, attempt))

    def _give_back(self, _job: tuple[str, int], taken: Assignment | None) -> None:
        if taken is not None:
            self.release(taken.address)

    def release(self, address: str) -> None:
        """The job's RUN is over: it no longer occupies the backend."""
        self.redis.hincrby(keys.LLM_INFLIGHT, address, -1)

    def release_many(self, addresses: list[str]) -> list[None]:
        """``release`` for several jobs' backends, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for address in addresses:
            pipe.hincrby(keys.LLM_INFLIGHT, address, -1)
        pipe.execute()
        return [None] * len(addresses)

    async def release_on_loop(self, address: str) -> None:
        """``release``, for a stage on an event loop: batched as ``acquire_on_loop``, and done
        even if the stage is aborted meanwhile (the count would stay up for good)."""
        await loop_local((self, "release"), lambda: Batched(self.release_many, shielded=True))(address)

    def list(self) -> list[BackendInfo]:
        """Every registered backend: protocol, counts, version and health, in one round trip."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrange(keys.LLM_BACKENDS, 0, -1, withscores=True)
        for key in (keys.LLM_TYPES, keys.LLM_INFLIGHT, keys.LLM_VERSIONS, keys.LLM_HEALTH):
            pipe.hgetall(key)
        members, types, inflight, versions, healths = pipe.execute()
        return [_info(address, score, types, inflight, versions, Health.decode(healths.get(address)))
                for address, score in members]


def _info(address: str, score: float, types: dict[str, str], inflight: dict[str, str], versions: dict[str, str],
          health: Health) -> BackendInfo:
    return BackendInfo(address, types.get(address, "vllm"), int(score), int(inflight.get(address, 0)),
                       int(versions[address]) if address in versions else None,
                       health.healthy, health.since, health.detail)
