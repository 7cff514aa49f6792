"""Turning requests into jobs: validate each with its handler, create the records, enqueue INIT.

The gateway parses and answers; this module decides what a job is. ``prepare`` checks one
request (its task, instance, ``sampling_params`` split and budget) and raises ``BadRequest``
naming the field; ``submit`` stores any number of prepared jobs in one Redis round trip and
enqueues INIT for the new ones over one producer.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from handlers import JobContext, get_handler
from prorl_celery.celery_app import Message, pack_messages, publish
from prorl_celery.core.errors import BadRequest, ServiceUnavailable
from prorl_celery.core.settings import Settings, get_settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.llm.sampling import UnresolvedTokenizer, resolve_tokenizer, split
from prorl_celery.state.store import JobStore

if TYPE_CHECKING:
    from celery import Celery


@dataclass(frozen=True)
class JobSpec:
    """A checked request, ready to become a job record."""

    job_id: str
    task: str
    instance: dict[str, Any]
    sampler: dict[str, Any]
    agent: dict[str, Any]
    ignored: list[str]
    budget_s: float
    max_attempts: int
    #: a replay or fork of another job (prorl_celery.wire.derived)
    origin: dict[str, Any] | None = None
    #: the backend to route RUN to while it is registered and healthy (a fork's: its source's)
    prefer_backend: str | None = None

    def record(self) -> dict[str, Any]:
        fields = {"task": self.task, "instance": self.instance, "sampling_params": self.sampler,
                  "agent_params": self.agent, "ignored_params": self.ignored, "budget_s": self.budget_s,
                  "attempt": 1, "max_attempts": self.max_attempts}
        if self.origin is not None:
            fields["origin"] = self.origin
        if self.prefer_backend:
            fields["prefer_backend"] = self.prefer_backend
        return fields


@dataclass(frozen=True)
class Submitted:
    job_id: str
    created: bool
    status: JobStatus


def prepare(settings: Settings, instance: dict[str, Any], sampling_params: dict[str, Any], *,
            task: str, job_id: str | None = None, timeout_s: float | None = None,
            max_attempts: int | None = None) -> JobSpec:
    """Check one request; BadRequest (or UnknownTask) says what is wrong."""
    handler = get_handler(task)  # UnknownTask is a BadRequest: the gateway answers it as is
    params = split(sampling_params)
    if "max_iterations" in params.agent and "max_iterations" not in instance:
        instance = {**instance, "max_iterations": params.agent["max_iterations"]}  # the instance's wins
    try:
        handler.validate_instance(instance)
    except ValueError as error:
        raise BadRequest(f"instance: {error}") from None
    ignored = list(params.ignored)
    try:
        tokenizer = resolve_tokenizer(params.agent, None, settings.tokenizers_dir)
    except UnresolvedTokenizer as error:
        # without a directory of tokenizers a v1 trainer's model name (custom_tokenizer) cannot
        # be resolved: the service's own tokenizer serves, and the result says the key was ignored
        if settings.tokenizers_dir or not settings.tokenizer:
            raise BadRequest(str(error)) from None
        tokenizer, ignored = None, sorted([*ignored, "custom_tokenizer"])
    if handler.uses_llm and not (tokenizer or settings.tokenizer):
        raise BadRequest("sampling_params.tokenizer: required when PRORL_TOKENIZER is not set")
    # a job without its own tokenizer uses the RUN worker's PRORL_TOKENIZER (paths differ per node)
    agent = {**params.agent, "tokenizer": tokenizer} if tokenizer else dict(params.agent)
    budget = timeout_s or settings.job_timeout_s
    if budget > settings.max_job_timeout_s:
        raise BadRequest(f"timeout_s: at most {settings.max_job_timeout_s} (PRORL_MAX_JOB_TIMEOUT_S)")
    return JobSpec(job_id or uuid.uuid4().hex, handler.name or task, instance, params.sampler, agent, ignored,
                   budget, max_attempts or settings.max_attempts)


def samples(spec: JobSpec, count: int) -> list[JobSpec]:
    """``count`` rollouts of one prompt (a GRPO group): ids ``<job_id>-<i>``, and each instance's
    ``trajectory_id`` is ``i`` (or ``<trajectory_id>-<i>`` when the instance has one)."""
    own = spec.instance.get("trajectory_id")
    return [JobSpec(f"{spec.job_id}-{i}", spec.task,
                    {**spec.instance, "trajectory_id": i if own is None else f"{own}-{i}"},
                    spec.sampler, spec.agent, spec.ignored, spec.budget_s, spec.max_attempts)
            for i in range(count)]


def submit(store: JobStore, specs: list[JobSpec], *, celery: Celery | None = None,
           batch: int | None = None, replicas: int = 0, replica_wait_ms: int = 2000) -> list[Submitted]:
    """Create every job (one round trip) and enqueue INIT for the new ones (through ``celery``,
    default the environment's app) over one producer, in messages of up to ``batch`` jobs of one
    task whose handler allows it (default ``PRORL_STAGE_BATCH``). A broker that cannot be
    reached (after ``enqueue``'s retries) fails those jobs at once (never pending forever) and
    raises ServiceUnavailable (503: retry later). A Redis that cannot be reached raises
    redis-py's own error, which the gateway answers as the same 503.

    ``replicas`` (``PRORL_REDIS_WAIT_REPLICAS``): return only once that many replicas hold the
    records and the messages (``JobStore.wait_replicated``), so that a failover right after the
    202 loses none of them; fewer within ``replica_wait_ms`` raise ServiceUnavailable. The jobs
    run all the same, and a client's retry with the same job ids finds them (nothing twice)."""
    outcomes = store.create_many([(spec.job_id, spec.record()) for spec in specs])
    submitted = [Submitted(spec.job_id, created, status) for spec, (created, status) in zip(specs, outcomes)]
    new = [spec for spec, (created, _) in zip(specs, outcomes) if created]
    try:
        publish(init_messages(new, get_settings().stage_batch if batch is None else batch), celery=celery)
    except Exception as error:  # broker down: do not leave these jobs pending forever
        fail_stranded(store, new, error)
        raise ServiceUnavailable(f"the broker is unreachable, retry later: {error}") from error
    if replicas and new:
        held = store.wait_replicated(replicas, replica_wait_ms)
        if held < replicas:
            raise ServiceUnavailable(
                f"the new jobs reached {held} of the {replicas} Redis replicas PRORL_REDIS_WAIT_REPLICAS asks for "
                f"within {replica_wait_ms} ms; retry with the same job ids (the jobs are accepted on the primary)")
    return submitted


def fail_stranded(store: JobStore, specs: list[JobSpec], error: Exception) -> None:
    """Fail the new jobs whose INIT could not be published (any that was published fails too:
    its INIT is then a no-op), saying why. With Redis down as well nothing can be written: those
    jobs stay ``pending_init``, and the reaper publishes their INIT once both are back
    (``leases.republish_lost``)."""
    for stranded in specs:
        try:
            store.finish(stranded.job_id, JobStatus.FAILED, {"error": f"could not enqueue: {error}"})
        except redis.RedisError:
            return


def init_messages(specs: list[JobSpec], batch: int) -> list[Message]:
    """The INIT messages of new jobs: those of one task whose INIT may share a message (see
    ``AgentHandler.shares_messages``: never one that starts a sandbox) in chunks of ``batch``,
    every other job alone."""
    if batch <= 1:
        return [(Stage.INIT, None, spec.job_id) for spec in specs]
    jobs = []
    for spec in specs:
        job = JobContext(job_id=spec.job_id, task=spec.task, instance=spec.instance,
                         sampling_params=spec.sampler, agent_params=spec.agent)
        shares = get_handler(spec.task).shares_messages(Stage.INIT, job)
        jobs.append((Stage.INIT, None, spec.job_id, spec.task if shares else None))
    return pack_messages(jobs, batch)
