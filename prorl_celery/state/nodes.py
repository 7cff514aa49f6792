"""Which workers are alive on which node, from the heartbeats workers write every
``PRORL_HEARTBEAT_S`` (default 5 s)."""
from __future__ import annotations

import json
import time
from typing import Any, cast

import redis

from prorl_celery.state import keys
from prorl_celery.state.connection import ScoredMembers

#: a worker that missed this many heartbeats in a row is taken for dead
STALE_BEATS = 6


def stale_after_s(heartbeat_s: float) -> float:
    """Seconds without a heartbeat after which a worker (and its node's queue) counts as lost."""
    return heartbeat_s * STALE_BEATS


def live_workers(client: redis.Redis, heartbeat_s: float, now: float | None = None) -> list[dict[str, Any]]:
    """Every worker seen recently: name, node, queues, seconds since its last heartbeat, the
    tasks it refuses (task -> the requirements it lacks, ``readiness``), and an INIT worker's
    warm pool (``WarmPool.stats``) when it keeps one."""
    now = time.time() if now is None else now
    seen = cast(ScoredMembers, client.zrangebyscore(keys.WORKERS, now - stale_after_s(heartbeat_s), "+inf",
                                                    withscores=True))
    pipe = client.pipeline(transaction=False)
    for name, _ in seen:
        pipe.hgetall(keys.worker(name))
    return [{"name": name, "node": info.get("node"), "queues": (info.get("queues") or "").split(","),
             "last_seen_s": round(now - beat, 3), "refused_tasks": json.loads(info.get("refused") or "{}"),
             **({"warm_pool": json.loads(info["warm_pool"])} if info.get("warm_pool") else {})}
            for (name, beat), info in zip(seen, pipe.execute())]


def warm_pools(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The warm pools of ``workers`` (``live_workers``) added up: ready sandboxes, hits, misses,
    and the slowest of their median refill times (seconds; None before any refill)."""
    pools = [w["warm_pool"] for w in workers if w.get("warm_pool")]
    refills = [p["refill_s_p50"] for p in pools if p.get("refill_s_p50") is not None]
    return {"pools": len(pools), "ready": sum(p["ready"] for p in pools), "hits": sum(p["hits"] for p in pools),
            "misses": sum(p["misses"] for p in pools), "refill_s_p50": max(refills) if refills else None}


def live_queues(client: redis.Redis, heartbeat_s: float) -> set[tuple[str, str]]:
    """(node, queue) of every live worker: one read for many checks (the reaper)."""
    return {(w["node"], queue) for w in live_workers(client, heartbeat_s) for queue in w["queues"]}


def has_live_worker(client: redis.Redis, node: str, queue: str, heartbeat_s: float) -> bool:
    """Is a worker on ``node`` consuming ``queue`` (for example ``run.<node>``)?"""
    return (node, queue) in live_queues(client, heartbeat_s)
