"""Which workers are alive on which node, from the heartbeats workers write every
``PRORL_HEARTBEAT_S`` (default 5 s), and the nodes they make up: up, draining, drained or gone.

A node is known by its workers' heartbeats (``keys.NODES``: last seen). Draining is asked in
``keys.NODES_DRAIN``; each worker reads it with its heartbeat and stops consuming the shared
``init`` and ``run`` queues (never its own ``run.<node>``: the jobs whose sandboxes it holds
still run there), and says so in its heartbeat (``draining``). A node whose workers are all
silent is gone: the reaper already moves the jobs waiting in its RUN queue (``leases``)."""
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
             "concurrency": int(info.get("concurrency") or 0), "busy": int(info.get("busy") or 0),
             "draining": info.get("draining") == "1", "versions": json.loads(info.get("versions") or "{}"),
             **({"warm_pool": json.loads(info["warm_pool"])} if info.get("warm_pool") else {})}
            for (name, beat), info in zip(seen, pipe.execute()) if info]


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


#: a node whose workers have all been silent this long is no longer listed
FORGET_NODE_S = 24 * 3600.0
#: a warm pool's ready sandbox has a ledger entry whose job id starts so (``worker/warm_pool``'s
#: ``POOL_PREFIX``): it holds no rollout, so it does not keep a node from being drained
POOLED_JOB_PREFIX = "pool-"


class NodeState:
    """What ``node_states`` says a node is doing (a str enum would do; these are the wire's words)."""

    UP = "up"
    DRAINING = "draining"  # asked to drain: takes no new INIT or RUN work, finishes what it holds
    DRAINED = "drained"  # drained and holding nothing: it can be taken down without losing a rollout
    GONE = "gone"  # no live worker (a crash, a cut link, or every worker stopped)


def record_beat(pipe: redis.client.Pipeline, node: str, now: float) -> None:
    """Add the node's side of a worker's heartbeat to ``pipe``: the node was seen ``now``."""
    pipe.zadd(keys.NODES, {node: now})


def set_drain(client: redis.Redis, node: str, drain: bool, now: float | None = None) -> bool:
    """Ask ``node`` to drain (or stop draining); False when no worker of that name was ever seen.
    A drain already asked keeps its first time."""
    if client.zscore(keys.NODES, node) is None:
        return False
    if drain:
        client.hsetnx(keys.NODES_DRAIN, node, time.time() if now is None else now)
    else:
        client.hdel(keys.NODES_DRAIN, node)
    return True


def drain_asked(client: redis.Redis, node: str) -> bool:
    return bool(client.hexists(keys.NODES_DRAIN, node))


def node_states(client: redis.Redis, heartbeat_s: float, now: float | None = None) -> list[dict[str, Any]]:
    """Every node seen in the last day, by name: its state (``NodeState``), seconds since it was
    last seen, the queues its live workers consume, their slots per queue, the INIT/RUN/EVAL
    stages they hold now, the jobs waiting for it in ``run.<node>``, its jobs' sandboxes (and its
    warm pools' apart), its software versions and when a drain was asked.

    A draining node is ``drained`` once every live worker of it has applied the drain and it
    holds nothing: no stage executing on it, no job waiting in its RUN queue, no sandbox."""
    now = time.time() if now is None else now
    client.zremrangebyscore(keys.NODES, "-inf", now - FORGET_NODE_S)
    seen = sorted(cast(ScoredMembers, client.zrange(keys.NODES, 0, -1, withscores=True)))
    drains = cast(dict[str, str], client.hgetall(keys.NODES_DRAIN))
    workers: dict[str, list[dict[str, Any]]] = {}
    for worker in live_workers(client, heartbeat_s, now):
        workers.setdefault(worker["node"], []).append(worker)
    pipe = client.pipeline(transaction=False)
    for node, _ in seen:
        pipe.hvals(keys.node_sandboxes(node))
        pipe.scard(keys.waiting_run(f"run.{node}"))
    counts = pipe.execute()
    nodes = []
    for index, (node, beat) in enumerate(seen):
        entries, waiting = counts[2 * index], counts[2 * index + 1]
        pooled = sum(1 for entry in entries if _job_of(entry).startswith(POOLED_JOB_PREFIX))
        sandboxes = len(entries) - pooled
        mine = workers.get(node, [])
        slots: dict[str, int] = {}
        for worker in mine:
            for queue in worker["queues"]:
                slots[queue] = slots.get(queue, 0) + int(worker.get("concurrency") or 0)
        busy = sum(int(w.get("busy") or 0) for w in mine)
        asked = drains.get(node)
        if not mine:
            state = NodeState.GONE
        elif asked is None:
            state = NodeState.UP
        elif all(w.get("draining") for w in mine) and busy == 0 and waiting == 0 and sandboxes == 0:
            state = NodeState.DRAINED
        else:
            state = NodeState.DRAINING
        nodes.append({"node": node, "state": state, "last_seen_s": round(now - beat, 3),
                      "workers": len(mine), "queues": sorted(slots), "slots": slots, "busy": busy,
                      "waiting_run": waiting, "sandboxes": sandboxes, "pooled_sandboxes": pooled,
                      "versions": next((w["versions"] for w in mine if w.get("versions")), {}),
                      "drain_asked_at": float(asked) if asked is not None else None})
    return nodes


def _job_of(entry: str) -> str:
    """The job id of a sandbox ledger entry (JSON), "" when unreadable."""
    try:
        return str(json.loads(entry).get("job_id") or "")
    except (ValueError, AttributeError):
        return ""
