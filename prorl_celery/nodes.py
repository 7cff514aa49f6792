"""Which workers are alive on which node, from the heartbeats workers write every 5 s."""
from __future__ import annotations

import time
from typing import Any

import redis

from . import keys

#: how often a worker writes its heartbeat
HEARTBEAT_S = 5.0
#: a worker whose last heartbeat is older than this is taken for dead
WORKER_STALE_S = 30.0


def live_workers(client: redis.Redis, now: float | None = None) -> list[dict[str, Any]]:
    """Every worker seen recently: name, node, queues and seconds since its last heartbeat."""
    now = time.time() if now is None else now
    seen = client.zrangebyscore(keys.WORKERS, now - WORKER_STALE_S, "+inf", withscores=True)
    pipe = client.pipeline(transaction=False)
    for name, _ in seen:
        pipe.hgetall(keys.worker(name))
    return [{"name": name, "node": info.get("node"), "queues": (info.get("queues") or "").split(","),
             "last_seen_s": round(now - beat, 3)} for (name, beat), info in zip(seen, pipe.execute())]


def has_live_worker(client: redis.Redis, node: str, queue: str) -> bool:
    """Is a worker on ``node`` consuming ``queue`` (for example ``run.<node>``)?"""
    return any(w["node"] == node and queue in w["queues"] for w in live_workers(client))
