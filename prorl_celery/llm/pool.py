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

    def generation(self) -> int:
        return int(self.redis.get(keys.LLM_GENERATION) or 0)

    def acquire(self, job_id: str | None = None, attempt: int = 1) -> Assignment | None:
        """Take the least-assigned backend for one job, or None when none is registered.

        Given ``job_id``, the assignment is also written to the job's record in the same round
        trip, while the job is in RUN on ``attempt`` (a given-up attempt cannot overwrite the
        retried job's)."""
        route = [keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_INFLIGHT, keys.LLM_GENERATION]
        if job_id is None:
            reply = self._acquire(keys=route)
        else:
            reply = self._acquire(keys=[*route, keys.job(job_id)], args=[JobStatus.RUN.value, attempt])
        if not reply:
            return None
        address, protocol, generation = reply
        return Assignment(address, protocol, int(generation))

    def release(self, address: str) -> None:
        """The job's RUN is over: it no longer occupies the backend."""
        self.redis.hincrby(keys.LLM_INFLIGHT, address, -1)

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
