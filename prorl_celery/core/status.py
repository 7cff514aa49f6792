"""Job status and the transitions allowed between them.

    pending_init ─> init ─> pending_run ─> run ─> pending_eval ─> eval ─> completed
         │  ^        │                     │            ^          │
         │  │        │                     │            └──────────┤ retry of EVAL alone
         │  └────────┴──── retry (a failure outside the policy, ───┤ (eval_error)
         │                        attempts left)                   │
         └───────────┴──── cancelled / failed / timeout <──────────┘

A stage is *claimed* by moving ``pending_<stage>`` to ``<stage>``; a redelivered message finds
the job already past ``pending_<stage>`` and does nothing. Terminal states are set exactly
once. The table below is the only definition; the Redis scripts receive it as arguments.
"""
from __future__ import annotations

from enum import Enum


class Stage(str, Enum):
    INIT = "init"
    RUN = "run"
    EVAL = "eval"

    @property
    def pending(self) -> JobStatus:
        return JobStatus(f"pending_{self.value}")

    @property
    def active(self) -> JobStatus:
        return JobStatus(self.value)

    @property
    def next(self) -> Stage | None:
        order = list(Stage)
        index = order.index(self)
        return order[index + 1] if index + 1 < len(order) else None


class JobStatus(str, Enum):
    PENDING_INIT = "pending_init"
    INIT = "init"
    PENDING_RUN = "pending_run"
    RUN = "run"
    PENDING_EVAL = "pending_eval"
    EVAL = "eval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def stage(self) -> Stage | None:
        """The stage this status waits for or executes; None once terminal."""
        if self.terminal:
            return None
        return Stage(self.value.removeprefix("pending_"))


#: the statuses in which a stage executes and holds a lease (the scripts receive them as ARGV)
EXECUTING: frozenset[JobStatus] = frozenset(stage.active for stage in Stage)
#: the one status in which a job may wait in a node's own queue (``run.<node>``, where its
#: sandbox lives): a job in it is stranded when that node has no live RUN worker
WAITING_ON_NODE = JobStatus.PENDING_RUN
TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMEOUT})
NON_TERMINAL = frozenset(set(JobStatus) - TERMINAL)

#: to-status -> the statuses it may be entered from
ALLOWED_FROM: dict[JobStatus, frozenset[JobStatus]] = {
    # by creation, or a retry from INIT after the stage's worker (or, from pending_run, the
    # node its RUN must run on) was lost
    JobStatus.PENDING_INIT: frozenset({JobStatus.INIT, JobStatus.PENDING_RUN, JobStatus.RUN, JobStatus.EVAL}),
    JobStatus.INIT: frozenset({JobStatus.PENDING_INIT}),
    JobStatus.PENDING_RUN: frozenset({JobStatus.INIT}),
    JobStatus.RUN: frozenset({JobStatus.PENDING_RUN}),
    # or from EVAL again: an evaluator that could not judge is retried alone
    JobStatus.PENDING_EVAL: frozenset({JobStatus.RUN, JobStatus.EVAL}),
    JobStatus.EVAL: frozenset({JobStatus.PENDING_EVAL}),
    JobStatus.COMPLETED: frozenset({JobStatus.EVAL}),
    # also from a pending status: a job whose hand-over message could not be enqueued
    JobStatus.FAILED: NON_TERMINAL,
    JobStatus.TIMEOUT: frozenset({JobStatus.INIT, JobStatus.RUN, JobStatus.EVAL}),
    JobStatus.CANCELLED: NON_TERMINAL,
}


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return current in ALLOWED_FROM[target]
