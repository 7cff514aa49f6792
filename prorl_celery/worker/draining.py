"""A worker's part in its node's report and drain (``state/nodes.py``).

Each heartbeat reads whether the node is asked to drain. A draining worker stops consuming the
shared ``init`` and ``run`` queues, so it takes no new rollout, and keeps its own ``run.<node>``,
where the jobs whose sandboxes its node holds wait; EVAL works from trajectories only and runs
on. It reports how many INIT and RUN stages it holds, so the node can say when it is drained.
"""
from __future__ import annotations

import logging
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any, cast

import redis

from prorl_celery.core.status import Stage
from prorl_celery.state import keys

log = logging.getLogger(__name__)
#: the queues a drain stops: new rollouts (a job's RUN on its own node still runs)
DRAINED_QUEUES = (Stage.INIT.value, Stage.RUN.value)
_HELD_STATUSES = frozenset({Stage.INIT.value, Stage.RUN.value})


class DrainSwitch:
    """Stops and restarts a worker's consumption of the shared INIT and RUN queues."""

    def __init__(self, consumer: Any, queues: list[str]) -> None:
        self.consumer = consumer
        self.queues = [queue for queue in queues if queue in DRAINED_QUEUES]
        self.draining = False  # asked
        self.applied = False  # done on the consumer's thread: what the heartbeat reports

    def apply(self, drain: bool) -> None:
        """Drain or undrain; the consumer is changed on its own thread (the hub's), where kombu
        expects it. A worker restarted on a draining node starts drained."""
        if drain == self.draining:
            return
        self.draining = drain
        if not self.queues:
            self.applied = drain
            return

        def switch() -> None:
            for queue in self.queues:
                if drain:
                    self.consumer.cancel_task_queue(queue)
                else:
                    self.consumer.add_task_queue(queue)
            self.applied = drain
            log.warning("node %s: %s %s", "draining" if drain else "undrained",
                        "stopped consuming" if drain else "consuming again", ", ".join(self.queues))
        hub = getattr(self.consumer, "hub", None)
        if hub is not None:
            hub.call_soon(switch)
        else:  # without a hub (green pools) the consumer polls: its queues may be changed here
            switch()


def held_stages(client: redis.Redis, job_ids: list[str]) -> int:
    """How many of the jobs this process executes a stage of are in INIT or RUN (EVAL runs
    anywhere: it does not keep a node from being drained)."""
    if not job_ids:
        return 0
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "status")
    return sum(1 for status in cast(list[str | None], pipe.execute()) if status in _HELD_STATUSES)


def software_versions() -> dict[str, str]:
    """What a node reports it runs: this package, Python, Celery, redis-py, and the sandbox
    runtimes found (bubblewrap, Apptainer)."""
    versions = {"python": platform.python_version()}
    for name, dist in (("prorl_celery", "prorl-celery"), ("celery", "celery"), ("redis", "redis")):
        try:
            versions[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    for name, binary in (("bubblewrap", "bwrap"), ("apptainer", "apptainer")):
        path = shutil.which(binary)
        if path is None:
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if out.split():
            versions[name] = out.split()[-1]
    return versions
