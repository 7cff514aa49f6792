"""The LLM backend pool: registered servers in a Redis sorted set keyed by assignments.

A job entering RUN takes the backend with the fewest assignments (one Lua script: pick and
count) and keeps it for every turn, so the backend's prefix cache serves the whole rollout.
``clear`` bumps the generation: new jobs use the new set, jobs in flight keep theirs.

Each backend also has a policy version, which the trainer sets when it loads new weights into
it; every model turn records the version of the backend that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import redis

from .. import keys
from ..event_loops import Batched, loop_local
from ..status import JobStatus
from ..store import load_script
from .backends import base_url

PROTOCOLS = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class Assignment:
    address: str
    protocol: str
    generation: int


@dataclass(frozen=True)
class BackendInfo:
    address: str
    protocol: str
    assigned: int
    in_flight: int
    version: int | None = None


class BackendPool:
    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._add = load_script(client, "add_backend")
        self._acquire = load_script(client, "acquire_backend")

    def add(self, address: str, protocol: str = "vllm", version: int | None = None) -> tuple[bool, int]:
        """Register ``address`` (at policy ``version`` when given); returns (newly added, current
        generation)."""
        added, generation = self._add(
            keys=[keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_GENERATION], args=[address, protocol]
        )
        if version is not None:
            self.redis.hset(keys.LLM_VERSIONS, address, version)
        return bool(added), int(generation)

    def clear(self) -> int:
        """Forget every backend; returns the new generation."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_VERSIONS)
        pipe.incr(keys.LLM_GENERATION)
        return int(pipe.execute()[1])

    def set_version(self, version: int, address: str | None = None) -> dict[str, int]:
        """Set the policy version of ``address``, or of every registered backend; returns the
        backends set. An address that is not registered is a KeyError."""
        registered = cast(list[str], self.redis.zrange(keys.LLM_BACKENDS, 0, -1))  # decode_responses client
        if address is None:
            targets = sorted(registered)
        else:  # http://host:port and http://host:port/v1 name the same server
            targets = [r for r in registered if base_url(r) == base_url(address)]
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
        """Take the least-assigned backend for one job, or None when none is registered.

        Given ``job_id``, the assignment is also written to the job's record in the same round
        trip, while the job is in RUN on ``attempt`` (a given-up attempt cannot overwrite the
        retried job's)."""
        if job_id is None:
            reply = self._acquire(keys=[keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_INFLIGHT, keys.LLM_GENERATION])
            return Assignment(reply[0], reply[1], int(reply[2])) if reply else None
        return self.acquire_many([(job_id, attempt)])[0]

    def acquire_many(self, jobs: list[tuple[str, int]]) -> list[Assignment | None]:
        """``acquire`` for several (job id, attempt) at once, in one script call: each job takes
        the least-assigned backend after the ones before it took theirs."""
        if not jobs:
            return []
        route = [keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_INFLIGHT, keys.LLM_GENERATION]
        reply = self._acquire(keys=[*route, *(keys.job(job_id) for job_id, _ in jobs)],
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
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrange(keys.LLM_BACKENDS, 0, -1, withscores=True)
        pipe.hgetall(keys.LLM_TYPES)
        pipe.hgetall(keys.LLM_INFLIGHT)
        pipe.hgetall(keys.LLM_VERSIONS)
        members, types, inflight, versions = pipe.execute()
        return [
            BackendInfo(address, types.get(address, "vllm"), int(score), int(inflight.get(address, 0)),
                        int(versions[address]) if address in versions else None)
            for address, score in members
        ]
