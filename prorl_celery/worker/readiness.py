"""Can this worker serve a task? Its handler's requirements, checked against this process.

A worker checks every registered task at start (:func:`refused_tasks`): what it lacks is logged
and reported with its heartbeat, so ``/status`` names each task a worker refuses and why. Each
stage checks its own job again (:func:`missing_for`), since a job may need less than its task
family declares (a math job without the python tool): a job whose requirement is missing ends as
an ``env_error`` naming it, retried where attempts are left, never scored.
"""
from __future__ import annotations

import logging
from functools import cache

from handlers import AgentHandler, JobContext, load_handlers
from prorl_celery.core.status import Stage
from singularity.requirements import Requirement, explain, missing

log = logging.getLogger(__name__)


@cache
def _missing(requirements: tuple[Requirement, ...], stage: str | None = None) -> tuple[Requirement, ...]:
    """Checked once per process: an install does not change under a running worker."""
    return tuple(missing(requirements, stage))


def missing_for(handler: AgentHandler, job: JobContext, stage: Stage) -> tuple[Requirement, ...]:
    """What ``stage`` of ``job`` needs that this worker lacks (empty: it can run)."""
    return _missing(tuple(handler.requirements(job)), stage.value)


def refused_tasks() -> dict[str, list[str]]:
    """Task name -> what this worker lacks of its handler's ``requires``, for every registered
    task that lacks something; each is logged once, naming the fix."""
    refused = {}
    for task, handler_class in sorted(load_handlers().items()):
        absent = _missing(tuple(handler_class.requires))
        if absent:
            refused[task] = [r.name for r in absent]
            log.warning(explain(task, absent))
    return refused
