"""How a job ended, as one class that every result carries (DESIGN decision 16).

A reward is the one number RL trains on, so a result says whether its reward measures the
policy at all:

=============  ============  =========  ==================================================
outcome        reward_valid  retryable  meaning
=============  ============  =========  ==================================================
ok             yes           no         every stage ran; the evaluator judged the rollout
agent_error    yes           no         the policy's own failure (it filled its context, the
                                        handler named an action it cannot carry out); the
                                        evaluator still judged what the agent did
env_error      no            yes        the sandbox, its tool server, the image, a missing
                                        requirement, a worker or Redis failed
backend_error  no            yes        the LLM server was unreachable, answered an error, or
                                        returned malformed ids or logprobs
eval_error     no            yes        the evaluator could not judge: a missing test runner,
                                        an unreadable report, a judge that crashed or hung
timeout        no            no         the job's time budget ran out
cancelled      no            no         the trainer cancelled it
=============  ============  =========  ==================================================

``retryable`` classes are retried by the service itself while the job has attempts left
(``max_attempts``); a result that still carries one tells the trainer that a resubmission may
end differently. Only ``reward_valid`` rewards are rewards: the others are ``null`` in our
fields (v1's ``score`` stays a number, with ``filter: true``).

:func:`classify` is the one place an exception becomes a class. It knows the error trees of
the project's parts by their classes, never by message text.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from prorl_celery.core.errors import (
    AgentFailure,
    BackendError,
    ContextExhausted,
    EvalUnavailable,
    JobCancelled,
    StageTimeout,
)
from prorl_celery.core.status import JobStatus, Stage


class Outcome(str, Enum):
    OK = "ok"
    AGENT_ERROR = "agent_error"
    ENV_ERROR = "env_error"
    BACKEND_ERROR = "backend_error"
    EVAL_ERROR = "eval_error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def reward_valid(self) -> bool:
        """Does a reward under this outcome measure the policy?"""
        return self in REWARD_VALID

    @property
    def retryable(self) -> bool:
        """May another attempt end differently (the failure was outside the policy)?"""
        return self in RETRYABLE


REWARD_VALID = frozenset({Outcome.OK, Outcome.AGENT_ERROR})
RETRYABLE = frozenset({Outcome.ENV_ERROR, Outcome.BACKEND_ERROR, Outcome.EVAL_ERROR})


@dataclass(frozen=True)
class Ending:
    """How one attempt (or the job) ended: the class, the stage it came from and what caused it."""

    outcome: Outcome
    stage: str | None = None
    detail: str | None = None

    def fields(self) -> dict[str, Any]:
        """The job record's fields for it (``store.JobRecord``)."""
        return {"outcome": self.outcome.value, "outcome_stage": self.stage, "detail": self.detail}


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def classify(stage: Stage | str, error: BaseException) -> Ending:
    """The class of ``error`` raised by ``stage`` of a job, and the detail that names its cause.

    Order matters: ``ContextExhausted`` is a ``BackendError`` by inheritance but the policy's
    own doing; in EVAL anything that is not the policy's is the evaluator's failure to judge.
    """
    stage_name = stage.value if isinstance(stage, Stage) else stage
    detail = describe(error)
    if isinstance(error, JobCancelled):
        return Ending(Outcome.CANCELLED, stage_name, detail)
    if isinstance(error, StageTimeout):
        return Ending(Outcome.TIMEOUT, stage_name, detail)
    if isinstance(error, (AgentFailure, ContextExhausted)):
        return Ending(Outcome.AGENT_ERROR, stage_name, detail)
    if isinstance(error, BackendError):
        if error.status_code is not None:
            detail = f"{detail} (HTTP {error.status_code})"
        return Ending(Outcome.BACKEND_ERROR, stage_name, detail)
    if isinstance(error, EvalUnavailable) or stage_name == Stage.EVAL.value:
        return Ending(Outcome.EVAL_ERROR, stage_name, detail)
    # EnvironmentFailure, the sandbox's and tool server's trees, Redis and the broker, and any
    # other exception of INIT or RUN: none is the policy's doing, so none may become a reward
    return Ending(Outcome.ENV_ERROR, stage_name, detail)


def of_status(status: JobStatus, *, critical: str | None = None) -> Outcome:
    """The outcome of a record written before outcomes existed (or by the lease reaper): from
    its status and failed stage alone."""
    if status is JobStatus.COMPLETED:
        return Outcome.OK
    if status is JobStatus.CANCELLED:
        return Outcome.CANCELLED
    if status is JobStatus.TIMEOUT:
        return Outcome.TIMEOUT
    if critical == Stage.EVAL.value:
        return Outcome.EVAL_ERROR
    return Outcome.ENV_ERROR
