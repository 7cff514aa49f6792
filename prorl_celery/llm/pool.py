"""The LLM backend pool: registered servers in a Redis sorted set keyed by assignments.

A job entering RUN takes the backend with the fewest assignments (one Lua script: pick and
count) and keeps it for every turn, so the backend's prefix cache serves the whole rollout.
``clear`` bumps the generation: new jobs use the new set, jobs in flight keep theirs.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

from .. import keys
from ..store import load_script

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


class BackendPool:
    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._add = load_script(client, "add_backend")
        self._acquire = load_script(client, "acquire_backend")

    def add(self, address: str, protocol: str = "vllm") -> tuple[bool, int]:
        """Register ``address``; returns (newly added, current generation)."""
        added, generation = self._add(
            keys=[keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_GENERATION], args=[address, protocol]
        )
        return bool(added), int(generation)

    def clear(self) -> int:
        """Forget every backend; returns the new generation."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.LLM_BACKENDS, keys.LLM_TYPES)
        pipe.incr(keys.LLM_GENERATION)
        return int(pipe.execute()[1])

    def generation(self) -> int:
        return int(self.redis.get(keys.LLM_GENERATION) or 0)

    def acquire(self) -> Assignment | None:
        """Take the least-assigned backend for one job, or None when none is registered."""
        reply = self._acquire(keys=[keys.LLM_BACKENDS, keys.LLM_TYPES, keys.LLM_INFLIGHT, keys.LLM_GENERATION])
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
        members, types, inflight = pipe.execute()
        return [
            BackendInfo(address, types.get(address, "vllm"), int(score), int(inflight.get(address, 0)))
            for address, score in members
        ]
