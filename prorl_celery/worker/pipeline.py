"""What a stage does, as plain functions that a Celery task (or a test) calls with a job id.

Every stage: claim the job (a redelivered or cancelled job is skipped), start its timer, call
the handler under the job's remaining budget and its cancel signal, store the outcome, pause
the timer and hand the job to the next stage's queue. A budget that runs out ends the job as
``timeout``.

A stage that fails is classed (``prorl_celery.core.outcomes.classify``). A failure outside the policy
(``env_error``, ``backend_error``, ``eval_error``) is retried while the job has attempts left:
from INIT, on a fresh sandbox, or, for EVAL, by EVAL alone; then it ends the job, and its reward
is not valid. The policy's own failure in RUN (``agent_error``) still goes to EVAL, which judges
what the agent did. A RUN failure out of retries also goes to EVAL (a swe patch is graded, for
the record), but keeps its own class.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from handlers import AgentHandler, EvalResult, JobContext, get_handler
from prorl_celery.celery_app import Payload, node_queue, pack_messages, publish
from prorl_celery.core.errors import (
    BackendError,
    EvalUnavailable,
    JobCancelled,
    JobNotFound,
    ReplayDiverged,
    RequirementMissing,
    StageTimeout,
    UnknownTask,
)
from prorl_celery.core.event_loops import Batched, loop_local, run_coro, thread_loop
from prorl_celery.core.outcomes import Ending, Outcome, classify, describe
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.endpoint.app import job_endpoint
from prorl_celery.llm.backends import make_backend
from prorl_celery.llm.journal import NoModel, TurnJournal
from prorl_celery.llm.pool import Assignment
from prorl_celery.llm.session import TokenSession
from prorl_celery.llm.tokenizer import load_tokenizer
from prorl_celery.services import Services, get_services
from prorl_celery.state.nodes import has_live_worker, live_queues
from prorl_celery.state.store import JobRecord, Move, Transition, outcome, retry_fields
from prorl_celery.worker.job_sandboxes import eval_sandbox_job, tool_client
from prorl_celery.worker.readiness import missing_for
from prorl_celery.worker.resume import origin_report, restarted, settle, take_journal
from singularity.requirements import explain

log = logging.getLogger(__name__)
T = TypeVar("T")


def execute_stage(stage: Stage, job_ids: Payload, services: Services | None = None) -> None:
    """Run one stage of a job, or of every job of a chunk at once, to its end on this thread's
    event loop."""
    services = services or get_services()
    loop = thread_loop()
    if isinstance(job_ids, str):
        works = [begin_stage(stage, job_ids, services, loop)]
    else:
        works = begin_stages(stage, job_ids, services, loop)
    started = [work for work in works if work is not None]
    if started:
        run_all(loop, started)


def run_all(loop: asyncio.AbstractEventLoop, works: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``works`` together on ``loop`` until every one has ended.

    A task raising SystemExit or KeyboardInterrupt (a handler's own task, which no stage's try
    can catch) stops the loop: the task keeps the exception, so the stage awaiting it ends its
    job; the others of the chunk go on when the loop runs again (as the RUN loop does)."""
    future = loop.create_task(_together(works) if len(works) > 1 else works[0])
    while True:
        try:
            loop.run_until_complete(future)
            return
        except BaseException:  # noqa: BLE001 - the chunk's other stages must still end
            if future.done():
                raise
            log.exception("a stage task stopped the loop of its worker thread; it runs on")


async def _together(works: list[Coroutine[Any, Any, None]]) -> None:
    await asyncio.gather(*works, return_exceptions=True)  # each stage ends its own job, whatever happens


def begin_stage(stage: Stage, job_id: str, services: Services,
                loop: asyncio.AbstractEventLoop) -> Coroutine[Any, Any, None] | None:
    """Claim ``job_id`` for ``stage`` and return the stage's coroutine, to be run on ``loop``
    (where its cancel signal is set); None when there is nothing to run (a redelivered or
    cancelled job is skipped, a task this worker lacks ends the job)."""
    return begin_stages(stage, [job_id], services, loop)[0]


def begin_stages(stage: Stage, job_ids: list[str], services: Services,
                 loop: asyncio.AbstractEventLoop) -> list[Coroutine[Any, Any, None] | None]:
    """``begin_stage`` for the jobs of one message, claimed in one round trip: one coroutine (or
    None) per job, each job skipped or started on its own."""
    # watch before claiming: a cancel landing right after the claim still wakes the stage
    signals = [services.cancel_watcher.watch(job_id, loop) for job_id in job_ids]
    works: list[Coroutine[Any, Any, None] | None] = [None] * len(job_ids)
    try:
        node = services.settings.node  # <stage>_node: where each stage of this attempt ran
        claims = services.store.claim_stages(job_ids, stage, {"node": node, f"{stage.value}_node": node,
                                                              "worker_pid": os.getpid()})
        for i, (job_id, claim) in enumerate(zip(job_ids, claims)):
            if len(job_ids) == 1:
                works[i] = _begin_claimed(stage, job_id, claim, services, signals[i])
                continue
            try:
                works[i] = _begin_claimed(stage, job_id, claim, services, signals[i])
            except Exception:  # noqa: BLE001 - the chunk's others still start; its lease reaps this one
                log.exception("%s of job %s could not start", stage.value, job_id)
        return works
    finally:
        for job_id, work, cancelled in zip(job_ids, works, signals):
            if work is None:
                services.cancel_watcher.unwatch(job_id, cancelled)


def _begin_claimed(stage: Stage, job_id: str, claim: Transition, services: Services,
                   cancelled: asyncio.Event) -> Coroutine[Any, Any, None] | None:
    if not claim.ok:
        log.info("%s of job %s skipped: job is %s", stage.value, job_id, claim.previous or "gone")
        if stage is Stage.RUN and claim.previous:
            _close_abandoned_sandboxes(services, job_id, claim.previous)
        return None
    record = claim.record
    assert record is not None  # a successful claim carries the record
    if stage is Stage.INIT and _elsewhere(services, record):
        return _hand_to_another_node(services, record, cancelled)
    job = job_context(record, deadline=time.monotonic() + claim.budget_left_s)
    try:
        handler = get_handler(record.task)
    except UnknownTask as error:  # a plug-in missing on this worker: another may have it
        return _unavailable(stage, services, job, record, cancelled, f"this worker cannot run the task: {error}")
    return _staged(stage, services, handler, job, record, cancelled)


def _elsewhere(services: Services, record: JobRecord) -> bool:
    """Should this retried job's INIT run on another node? Once per attempt, when the failed
    attempt ran on this node and a live INIT worker of another node exists."""
    node = services.settings.node
    if record.avoid_node != node or record.deferred_attempt == record.attempt:
        return False
    live = live_queues(services.redis, services.settings.heartbeat_s)
    return any(queue == Stage.INIT.value and other != node for other, queue in live)


async def _hand_to_another_node(services: Services, record: JobRecord, cancelled: asyncio.Event) -> None:
    """Put the INIT just claimed back in the shared queue, once: Redis hands a BRPOP'd message
    to the client that has waited longest, so an idle INIT worker of another node takes it; if
    none does, this node runs it next time (``deferred_attempt``)."""
    try:
        back = Move(record.id, Stage.INIT.pending, "pause", {"deferred_attempt": record.attempt},
                    only_from=Stage.INIT.active, attempt=record.attempt)
        if (await _move(services, back)).ok:
            log.info("job %s: attempt %d handed to another node's INIT (%s ran the failed one)", record.id,
                     record.attempt, record.avoid_node)
            await _publish(services, (Stage.INIT, None, record.id, False))
    finally:
        services.cancel_watcher.unwatch(record.id, cancelled)


async def _unavailable(stage: Stage, services: Services, job: JobContext, record: JobRecord,
                       cancelled: asyncio.Event, detail: str) -> None:
    """A claimed stage this worker cannot run at all: retried elsewhere, or ended, as an
    ``env_error``."""
    try:
        await _retry_or_end(services, None, job, record, stage, Ending(Outcome.ENV_ERROR, stage.value, detail))
    finally:
        services.cancel_watcher.unwatch(job.job_id, cancelled)


async def _staged(stage: Stage, services: Services, handler: AgentHandler, job: JobContext,
                  record: JobRecord, cancelled: asyncio.Event) -> None:
    """A claimed stage, holding the job's lease while it runs."""
    services.leases.hold(job.job_id)
    started = time.monotonic()
    try:
        absent = missing_for(handler, job, stage)
        if absent:
            raise RequirementMissing(explain(record.task, absent), missing=[r.name for r in absent])
        await _STAGES[stage](services, handler, job, record, cancelled)
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # noqa: BLE001 - outside the handler's own error paths
        # (a bug, a missing requirement, Redis away longer than a transition retries): end or
        # retry the job now rather than leave it running until its lease runs out, and keep the
        # loop other stages share
        ending = classify(stage, error)
        if not isinstance(error, RequirementMissing):
            log.exception("%s of job %s crashed", stage.value, job.job_id)
            ending = Ending(ending.outcome, ending.stage, f"{stage.value} crashed: {ending.detail}")
        try:
            await _retry_or_end(services, handler, job, record, stage, ending)
        except Exception:  # noqa: BLE001 - the lease reaper ends it once Redis answers
            log.exception("cannot end job %s after its %s crashed", job.job_id, stage.value)
    finally:
        services.leases.release(job.job_id)
        services.metrics.observe_stage(stage.value, time.monotonic() - started)
        services.cancel_watcher.unwatch(job.job_id, cancelled)


async def _retry_or_end(services: Services, handler: AgentHandler | None, job: JobContext, record: JobRecord,
                        stage: Stage, ending: Ending, **fields: Any) -> None:
    """``stage`` of this attempt failed with ``ending``: retry the job while its class is
    retryable and attempts are left (EVAL alone for an EVAL failure, else from INIT on a fresh
    sandbox), else end it ``failed`` with ``fields`` (the stage's fallback results).

    An EVAL after a RUN that failed outside the policy (out of attempts: it went to EVAL for the
    record) is not retried, and the job keeps RUN's class: no evaluation could make it valid."""
    if stage is Stage.EVAL and record.outcome is not None and not Outcome(record.outcome).reward_valid:
        extra = _handler_extras(handler, job) if handler is not None else {}
        await _move(services, Move.finish(job.job_id, JobStatus.FAILED, attempt=job.attempt,
                                          fields={**fields, "extra": extra}))
        return
    if ending.outcome.retryable and job.attempt < record.max_attempts:
        again = Stage.EVAL if stage is Stage.EVAL else Stage.INIT
        move = Move(job.job_id, again.pending, "pause", retry_fields(
            record.attempts, job.attempt, ending, services.settings.node, from_init=again is Stage.INIT),
            only_from=stage.active, attempt=job.attempt)
        if (await _move(services, move)).ok:
            log.warning("job %s: %s (%s); attempt %d from %s", job.job_id, ending.outcome.value, ending.detail,
                        job.attempt + 1, again.value)
            services.metrics.count("retries", 1)
            await _publish(services, (again, None, job.job_id, False))
        return
    extra = _handler_extras(handler, job) if handler is not None else {}
    await _move(services, Move.finish(job.job_id, _TERMINAL[ending.outcome], attempt=job.attempt, fields=outcome(
        stage.value if ending.outcome is not Outcome.TIMEOUT else "timeout", ending.detail, ending,
        extra=extra, **fields)))


#: the status a job ends in for each class (a judged rollout, agent_error included, is completed
#: only when no stage raised: EVAL decides that itself)
_TERMINAL = {Outcome.TIMEOUT: JobStatus.TIMEOUT, Outcome.CANCELLED: JobStatus.CANCELLED,
             Outcome.ENV_ERROR: JobStatus.FAILED, Outcome.BACKEND_ERROR: JobStatus.FAILED,
             Outcome.EVAL_ERROR: JobStatus.FAILED, Outcome.AGENT_ERROR: JobStatus.FAILED,
             Outcome.OK: JobStatus.COMPLETED}


def _close_abandoned_sandboxes(services: Services, job_id: str, status: JobStatus) -> None:
    """A job that ended, or was retried from INIT, while its RUN message waited here left its
    sandbox on this node: stop every sandbox of the job here but the current attempt's."""
    try:
        current = services.store.load(job_id).sandbox
    except JobNotFound:
        return
    if status.terminal and current:
        run_coro(_close_sandbox(services, current))
    keep = None if status.terminal else (current or {}).get("id")
    for entry in services.sandboxes.ledger.list(services.settings.node):
        if entry.job_id == job_id and entry.sandbox_id != keep:
            # its workspace is its own (one per sandbox), so it goes too: a later attempt has another
            run_coro(_close_sandbox(services, {"id": entry.sandbox_id, "node": entry.node}))


def job_context(record: JobRecord, deadline: float | None = None) -> JobContext:
    return JobContext(
        job_id=record.id, task=record.task, instance=record.instance, sampling_params=record.sampling_params,
        agent_params=record.agent_params, init_result=record.init_result, run_result=record.run_result,
        deadline=deadline, attempt=record.attempt,
    )


async def bounded(job: JobContext, cancelled: asyncio.Event, work: Awaitable[T], limit_s: float | None = None) -> T:
    """Await ``work`` within the job's budget (and ``limit_s``, when given); abort it the
    moment the job is cancelled."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(cancelled.wait())
    left = job.time_left()
    timeout = limit_s if left is None else (left if limit_s is None else min(left, limit_s))
    try:
        done, _ = await asyncio.wait({task, waiter}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if waiter in done:
            raise JobCancelled(f"job {job.job_id} was cancelled")
        raise StageTimeout(f"job {job.job_id} ran out of its time budget")
    finally:
        waiter.cancel()


async def _fallback(callback: Awaitable[T], default: T) -> T:
    """Run an exception callback; a callback that fails itself must not lose the job."""
    try:
        return await callback
    except Exception as error:  # noqa: BLE001 - the job must still end well-formed
        log.exception("exception callback failed: %s", describe(error))
        return default


def _handler_extras(handler: AgentHandler, job: JobContext) -> dict[str, Any]:
    try:
        return handler.final_result(job)
    except Exception as error:  # noqa: BLE001
        log.exception("final_result of %s failed", job.task)
        return {"final_result_error": describe(error)}


# -- INIT ----------------------------------------------------------------------------------------

async def _init(services: Services, handler: AgentHandler, job: JobContext, record: JobRecord,
                cancelled: asyncio.Event) -> None:
    store = services.store
    sandbox: dict[str, str] | None = None
    try:
        request = handler.sandbox_request(job)
        if request is not None:
            sandbox = await bounded(job, cancelled, services.sandboxes.start(job.job_id, request))
            if not sandbox.get("pooled"):  # a warm pool's is named by the hand-over: a round trip less
                store.update(job.job_id, {"sandbox": sandbox}, status=JobStatus.INIT, attempt=job.attempt)
        async with tool_client(sandbox) as job.sandbox:
            job.init_result = await bounded(job, cancelled, handler.init(job))
    except JobCancelled:
        await _close_sandbox(services, sandbox)
        return
    except StageTimeout as error:
        await _close_sandbox(services, sandbox)
        store.finish(job.job_id, JobStatus.TIMEOUT, attempt=job.attempt, fields=outcome(
            "timeout", str(error), Ending(Outcome.TIMEOUT, Stage.INIT.value, str(error)),
            extra=_handler_extras(handler, job)))
        return
    except Exception as error:  # noqa: BLE001 - any handler failure becomes a fallback result
        log.warning("INIT of job %s failed: %s", job.job_id, describe(error))
        await _close_sandbox(services, sandbox)
        job.init_result = await _fallback(handler.init_exception(job, error), {"error": describe(error)})
        await _retry_or_end(services, handler, job, record, Stage.INIT, classify(Stage.INIT, error),
                            init_result=job.init_result)
        return
    # a sandbox lives on this node: its RUN must run here too
    local = handler.node_local or sandbox is not None
    queue = node_queue(Stage.RUN, services.settings.node) if local else None
    if queue and not await _run_worker_appears(services, queue):
        await _close_sandbox(services, sandbox)  # nobody here would ever run it: retry, do not strand
        await _retry_or_end(services, handler, job, record, Stage.INIT, Ending(
            Outcome.ENV_ERROR, Stage.INIT.value, f"no live RUN worker on node {services.settings.node} for this "
            f"node-local job; start `celery -A prorl_celery worker -Q run` there"), init_result=job.init_result)
        return
    # run_queue tells the reaper which node must stay alive for this job to be run at all
    fields = {"init_result": job.init_result, "run_queue": queue or "", **({"sandbox": sandbox} if sandbox else {})}
    if (await _move(services, Move.hand_over(job.job_id, Stage.INIT, fields, attempt=job.attempt))).ok:
        await _publish(services, (Stage.RUN, queue, job.job_id, handler.shares_messages(Stage.RUN, job)))
    else:  # cancelled meanwhile: nobody will run it
        await _close_sandbox(services, sandbox)


#: node queue -> until when (monotonic) a RUN worker seen consuming it counts as still there
_run_worker_seen: dict[str, float] = {}


async def _run_worker_appears(services: Services, queue: str) -> bool:
    """Is a RUN worker of this node alive? Waits up to two heartbeats for one to show up, so a
    missed beat (or a Redis restart) does not fail a job. One seen is taken as there for a
    heartbeat more without asking again (the workers' list and each one's entry: three round
    trips a job); a worker that died meanwhile is the reaper's case as ever (stranded jobs)."""
    heartbeat_s = services.settings.heartbeat_s
    now = time.monotonic()
    if _run_worker_seen.get(queue, 0.0) > now:
        return True
    deadline = now + 2 * heartbeat_s
    while not has_live_worker(services.redis, services.settings.node, queue, heartbeat_s):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.5)
    _run_worker_seen[queue] = time.monotonic() + heartbeat_s
    return True


async def _close_sandbox(services: Services, sandbox: dict[str, str] | None) -> None:
    if sandbox is not None:
        try:
            await services.sandboxes.stop(sandbox)
        except Exception:  # noqa: BLE001 - the reaper retries; the job must still end
            log.exception("cannot stop sandbox %s", sandbox.get("id"))


# -- RUN -----------------------------------------------------------------------------------------

async def wait_for_backend(services: Services, job: JobContext) -> Assignment:
    """Take a backend for the job, waiting while none is registered.

    Called under ``bounded``: the job's budget ends the wait as a timeout whose error says
    that no backend was registered.
    """
    while (assignment := await services.pool.acquire_on_loop(job.job_id, job.attempt)) is None:
        await asyncio.sleep(services.settings.backend_wait_poll_s)
    return assignment


def open_session(services: Services, job: JobContext, assignment: Assignment | None,
                 journal: TurnJournal | None = None) -> TokenSession:
    """The job's token session on its backend; without an assignment (a replay), on none: every
    model turn then comes from the journal."""
    settings = services.settings
    agent = job.agent_params
    tokenizer_path = agent.get("tokenizer") or settings.tokenizer
    if not tokenizer_path:
        raise ValueError("no tokenizer: set PRORL_TOKENIZER or sampling_params.tokenizer")
    backend = make_backend(assignment.address, assignment.protocol, timeout_s=settings.llm_timeout_s) \
        if assignment is not None else NoModel()
    return TokenSession(tokenizer=load_tokenizer(tokenizer_path), backend=backend,
                        sampling_params=job.sampling_params,
                        max_model_len=min(settings.max_model_len, agent.get("max_model_len") or settings.max_model_len),
                        default_max_tokens=settings.default_max_tokens,
                        max_output_tokens=agent.get("max_output_tokens"),
                        max_input_tokens=agent.get("max_input_tokens"),
                        policy_version=partial(services.pool.current_version, assignment.address)
                        if assignment is not None else None,
                        journal=journal)


async def _run(services: Services, handler: AgentHandler, job: JobContext, record: JobRecord,
                cancelled: asyncio.Event) -> None:
    store = services.store
    session: TokenSession | None = None
    assignment: Assignment | None = None
    ended = outcome(None, None)
    failure: Ending | None = None
    sandbox = record.sandbox  # a fresh one replaces it when a resume diverges
    resume: dict[str, Any] | None = None
    report: dict[str, Any] | None = None  # a replay's or a fork's
    replay = (record.origin or {}).get("kind") == "replay"
    try:
        if handler.uses_llm and replay:  # the recorded model outputs only: no backend is asked
            journal, resume = await bounded(job, cancelled, take_journal(services, handler, job, record.origin))
            session = open_session(services, job, None, journal)
        elif handler.uses_llm:
            # the assignment is written to the job's record as it is taken (one round trip)
            assignment = await bounded(job, cancelled, wait_for_backend(services, job))
            journal, resume = await bounded(job, cancelled, take_journal(services, handler, job, record.origin))
            session = open_session(services, job, assignment, journal)
            await bounded(job, cancelled, session.fit_backend_context())
        if sandbox:
            # off the loop: during a failover its retries would stall every job this process runs
            await asyncio.to_thread(services.sandboxes.adopt, sandbox)
        await _run_handler(services, handler, job, session, sandbox, cancelled)
        if record.origin and session is not None and session.journal is not None:
            report = origin_report(session.journal, record.origin)
        if session is not None and session.journal is not None and session.journal.diverged is not None:
            # a replayed observation differs: from turn zero, on a fresh sandbox (INIT's steps)
            assert assignment is not None
            log.warning("job %s: resume diverged after turn %d; restarting from turn zero", job.job_id,
                        session.journal.diverged.turn)
            resume = restarted(session.journal)
            sandbox = await _fresh_start(services, handler, job, sandbox, cancelled)
            journal, _ = await bounded(job, cancelled, take_journal(services, handler, job, None, fresh=True))
            session = open_session(services, job, assignment, journal)
            await bounded(job, cancelled, session.fit_backend_context())
            await _run_handler(services, handler, job, session, sandbox, cancelled)
            if record.origin:
                # a fork started again from turn zero shares nothing with its source any more (a
                # trainer masks a fork's shared prefix by this report: prorl_celery.trainer.samples)
                report = {"shared_turns": 0, "shared_tokens": 0, "observations_checked": 0, "restarted": True}
        elif session is not None and session.journal is not None:
            resume = await settle(services, session.journal) or resume
    except JobCancelled:
        return
    except StageTimeout as error:
        reason = str(error) if assignment or not handler.uses_llm else (
            "no healthy LLM backend was registered within the job's time budget: POST /add_llm_server, "
            "and see /status for the health of those registered")
        store.finish(job.job_id, JobStatus.TIMEOUT, attempt=job.attempt, fields=outcome(
            "timeout", reason, Ending(Outcome.TIMEOUT, Stage.RUN.value, reason), extra=_handler_extras(handler, job),
            trajectory=session.trajectory() if session else None, resume=resume, origin_report=report))
        return
    except Exception as error:  # noqa: BLE001 - classed: retried, or judged by EVAL
        log.warning("RUN of job %s failed: %s", job.job_id, describe(error))
        failure = classify(Stage.RUN, error)
        if assignment is not None and isinstance(error, BackendError) and failure.outcome is Outcome.BACKEND_ERROR:
            await _report_backend(services, assignment.address, error)
        job.run_result = await _fallback(handler.run_exception(job, error), {"error": describe(error)})
        ended = outcome("run", describe(error), failure)
    finally:
        if assignment is not None:
            await services.pool.release_on_loop(assignment.address)
        await _close_sandbox(services, sandbox)  # closed right after RUN, before EVAL
    if failure is not None and failure.outcome.retryable and job.attempt < record.max_attempts:
        await _retry_or_end(services, handler, job, record, Stage.RUN, failure)
        return
    if session is not None:
        _count_tokens(services, session)
    fields = {"run_result": job.run_result, "trajectory": session.trajectory() if session else None,
              "resume": resume, "origin_report": report, **ended}
    if session is not None and session.unsupported_params:  # sampler keys this backend's protocol lacks
        fields["ignored_params"] = sorted({*record.ignored_params, *session.unsupported_params})
    if (await _move(services, Move.hand_over(job.job_id, Stage.RUN, fields, attempt=job.attempt))).ok:
        await _publish(services, (Stage.EVAL, None, job.job_id, handler.shares_messages(Stage.EVAL, job)))


async def _run_handler(services: Services, handler: AgentHandler, job: JobContext, session: TokenSession | None,
                       sandbox: dict[str, str] | None, cancelled: asyncio.Event) -> None:
    """The handler's RUN with its sandbox and endpoint; the journal's last events written
    whatever happens. A replay that diverged returns (``session.journal.diverged`` says so),
    whatever the handler made of it (an agent program's endpoint call that failed)."""
    journal = session.journal if session is not None else None
    socket_dir = str(Path(sandbox["socket_path"]).parent) if sandbox else None
    try:
        async with tool_client(sandbox) as job.sandbox, \
                job_endpoint(session, handler.endpoint_request(job), socket_dir, job.time_left) as job.endpoint:
            job.run_result = await bounded(job, cancelled, handler.run(job, session))
    except ReplayDiverged as error:
        if journal is None or (journal.strict and journal.diverged is None):
            raise
        if not journal.strict:  # a replay whose agent asked for a turn past the journal: it ends there
            job.run_result = await _fallback(handler.run_exception(job, error), {"error": describe(error)})
    except Exception:
        if journal is None or journal.diverged is None:
            raise
    finally:
        if journal is not None and journal.diverged is None:
            try:
                await journal.flush()
            except Exception:  # noqa: BLE001 - the turn stays the rollout's; a retry regenerates it
                log.exception("job %s: cannot write the journal's last events", job.job_id)


async def _fresh_start(services: Services, handler: AgentHandler, job: JobContext, sandbox: dict[str, str] | None,
                       cancelled: asyncio.Event) -> dict[str, str] | None:
    """INIT's steps again, within RUN on this node: the old sandbox closed, a fresh one started
    and recorded, the handler's ``init`` run on it."""
    await _close_sandbox(services, sandbox)
    request = handler.sandbox_request(job)
    fresh = None
    if request is not None:
        fresh = await bounded(job, cancelled, services.sandboxes.start(job.job_id, request))
        await asyncio.to_thread(services.store.update, job.job_id, {"sandbox": fresh}, status=JobStatus.RUN,
                                attempt=job.attempt)
    async with tool_client(fresh) as job.sandbox:
        job.init_result = await bounded(job, cancelled, handler.init(job))
    return fresh


#: a backend's answers that say it is down (not that this one request was wrong)
DOWN_STATUSES = frozenset({502, 503, 504})


async def _report_backend(services: Services, address: str, error: BackendError) -> None:
    """A backend that failed a job's turn because it could not be reached, or said it is down,
    leaves the routing until a probe finds it answering (``BackendPool.mark_unhealthy``); the
    job's retry then goes to another."""
    if error.status_code is not None and error.status_code not in DOWN_STATUSES:
        return
    try:
        await services.pool.mark_unhealthy_on_loop(address, describe(error))
    except Exception:  # noqa: BLE001 - the job's own failure matters more
        log.exception("cannot mark backend %s unhealthy", address)


def _count_tokens(services: Services, session: TokenSession) -> None:
    services.metrics.count("tokens_generated", session.generated_tokens)
    services.metrics.count("tokens_observed", session.observed_tokens)
    services.metrics.count("llm_requests", session.num_turns)


# -- EVAL ----------------------------------------------------------------------------------------

async def _eval(services: Services, handler: AgentHandler, job: JobContext, record: JobRecord,
                cancelled: asyncio.Event) -> None:
    sandbox: dict[str, str] | None = None
    limit_s = services.settings.eval_timeout_s
    try:
        try:
            request = handler.eval_sandbox_request(job)
            if request is not None:  # a fresh one, never the agent's: it was closed after RUN
                sandbox = await bounded(job, cancelled, services.sandboxes.start(eval_sandbox_job(job.job_id), request),
                                        limit_s)
            async with tool_client(sandbox) as job.sandbox:
                result: EvalResult = await bounded(job, cancelled, handler.eval(job), limit_s)
        except StageTimeout as error:
            # the rollout is over: an evaluator that outlives its limit (or what is left of the
            # budget) could not judge it, which is no timeout of the policy's
            raise EvalUnavailable(f"the evaluator did not finish within its limit "
                                  f"(PRORL_EVAL_TIMEOUT_S={limit_s:g} s, or the job's budget): {error}") from error
    except JobCancelled:
        return
    except Exception as error:  # noqa: BLE001 - a failed evaluation is never a score
        log.warning("EVAL of job %s failed: %s", job.job_id, describe(error))
        failed = await _fallback(handler.eval_exception(job, error), EvalResult(0.0, {"error": describe(error)}))
        await _retry_or_end(services, handler, job, record, Stage.EVAL, classify(Stage.EVAL, error),
                            eval=failed.details)
        return
    finally:
        await _close_sandbox(services, sandbox)
    # RUN's failure, if it had one, stays the job's: its reward is recorded, valid only when
    # the failure was the policy's own
    status = JobStatus.FAILED if record.critical_error else JobStatus.COMPLETED
    ending = Ending(Outcome.OK, None, None) if record.outcome is None else None
    await _move(services, Move.finish(job.job_id, status, attempt=job.attempt, fields=outcome(
        record.critical_error, record.error, ending,
        reward=None if result.reward is None else float(result.reward), eval=_eval_details(result),
        extra=_handler_extras(handler, job))))


def _eval_details(result: EvalResult) -> dict[str, Any]:
    """The judgement's details, with the samples' own rewards (``sample_rewards``, by index)."""
    if not result.sample_rewards:
        return result.details
    return {**result.details, "sample_rewards": {str(int(i)): float(r) for i, r in result.sample_rewards.items()}}


# -- the end of a stage, batched per loop ---------------------------------------------------------

#: a stage's next message: (stage, queue or None for the shared one, job id, may share a message)
Publish = tuple[Stage, str | None, str, bool]


async def _move(services: Services, move: Move) -> Transition:
    """A stage's last transition (its hand-over, or EVAL's end), sent with those of every stage
    of this loop that ends in the same turn: one round trip for an INIT or EVAL chunk, or for
    the RUN loop's stages that end together. Shielded: a hand-over that took place must be
    followed by its publish, so its stage waits for it even when cancelled."""
    store = services.store
    return await loop_local((store, "moves"), lambda: Batched(store.transition_many, shielded=True))(move)


async def _publish(services: Services, message: Publish) -> None:
    """A handed-over job's next message, published with those of every stage of this loop that
    hands over in the same turn (one producer, one pipeline; Celery's ``send_task`` per job was
    a seventh of the RUN worker's time and a quarter of the INIT worker's), packed into chunks of
    ``PRORL_STAGE_BATCH`` ids for jobs whose handler allows it. Shielded: a job handed over
    whose message were lost would stay ``pending_<stage>`` for good; its stage ends only once
    the message is out, so a worker draining at SIGTERM (it waits for every stage) publishes
    all of them."""
    batch = services.settings.stage_batch
    await loop_local(("publish", batch), lambda: Batched(partial(_publish_batch, batch), shielded=True))(message)


def _publish_batch(batch: int, messages: list[Publish]) -> list[None]:
    publish(pack_messages([(stage, queue, job_id, True if shares else None)
                           for stage, queue, job_id, shares in messages], batch))
    return [None] * len(messages)


_STAGES = {Stage.INIT: _init, Stage.RUN: _run, Stage.EVAL: _eval}
