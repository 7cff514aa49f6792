"""DAPO batch collection over the rollout service: continuous replenishment, early termination
and carry-over.

The trainer calls ``batch = collector.next_batch()`` once per step and gets exactly
``batch_groups`` (B) *informative* groups of ``group_size`` (n) rollouts of one prompt each:

* **replenishment**: ``max_in_flight`` (N) rollouts are kept running in the service; the moment
  one ends another is submitted (the rest of the current prompt's group, then the next prompt
  from the stream), never waiting for a batch;
* **filtering**: a complete group whose rewards the ``group_filter`` rejects (by default: all
  equal, i.e. all right or all wrong) is dropped and counted as ``filtered``;
* **fork groups** (:mod:`prorl_celery.trainer.dapo_forks`): a ``ForkOf`` in the prompt stream is
  a group of ``group_size`` forks of a job at a turn (``POST /jobs/<id>/fork``), grouped,
  filtered and batched like any group; with ``fork_filtered``, a filtered group is sampled again
  by forking one of its members at ``fork_at`` instead of being dropped (counted as ``forked``
  too), so its first turns are not generated again. Each rollout says what it forked from
  (``fork_of``, ``fork_turn``, ``shared_turns``), its group where (``Group.fork``), and its
  samples leave the shared prefix out of the loss mask;
* **early termination**: when the B-th informative group completes, the step ends. Groups still
  unfinished are either *carried over* (kept running; their results count in the next step) or
  *cancelled* with ``POST /cancel``. A group is carried over when it is young enough
  (``max_staleness``), already proven useful (the filter accepts its partial rewards) or at least
  ``carry_min_done`` finished, and within ``max_carry_groups`` (default B), proven ones first;
* **tags**: every :class:`Rollout` keeps the ``step`` it was submitted in, the ``batch_step`` of
  the batch it is returned in (``carried_over`` when later), the backend ``generation`` the
  service ran it under (bumped by ``/clear_llm_server``) and the ``policy_versions`` that
  produced its tokens, so the trainer can weigh or drop stale samples;
* **policy lag**: with ``max_policy_lag`` set and the trainer calling ``set_policy_version``
  after each weight update, a rollout produced (even in part) by a version more than that many
  versions old is run again, and a completed group waiting for the next batch that holds one
  is dropped as stale.

Only a valid reward is a reward (DESIGN decision 16; :func:`prorl_celery.trainer.client.reward_of`): a
rollout whose result says its reward is not valid (outcome ``env_error``, ``backend_error``,
``eval_error``, ``timeout``, or ``cancelled`` by someone else; from a server older than
outcomes: any status but ``completed``) is submitted again under a new job id, up to
``max_resubmits`` times per rollout, and then *dropped*: it is in no group's rewards, no filter
decision and no batch (``Group.dropped``). A complete group left with fewer than
``min_group_size`` valid rollouts (default 2) is dropped as ``failed_groups``. ``StepStats``
counts ``resubmitted`` and ``dropped`` rollouts per outcome class. ``agent_error`` (the policy's
own failure, judged by the evaluator) is a valid reward and stays. Rollouts the collector
cancelled itself (early termination, dropped groups) are discarded as before, never resubmitted.

Job ids (and fork group ids) are made by the collector before submission, so a submit, a fork
or a wait interrupted by a gateway restart is resumed by id: nothing runs twice and no result is
lost. Each step's
:class:`StepStats` records submitted, completed, cancelled, filtered, carried over, wall time
and, given a ``busy_probe``, the fraction of the step the backends were busy.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, TypeGuard

from prorl_celery.core.errors import BadRequest, Conflict, JobNotFound, PromptsExhausted
from prorl_celery.trainer import dapo_forks as forks
from prorl_celery.trainer.client import AsyncRolloutClient, JobRequest, RequestRejected, RolloutClient, RolloutOutcome
from prorl_celery.trainer.dapo_types import (
    Batch,
    BusyProbe,
    CollectorConfig,
    ForkOf,
    ForkPoint,
    Group,
    Rollout,
    RolloutsFailing,
    StepStats,
    not_all_equal,
)
from prorl_celery.trainer.samples import samples_of

__all__ = ["AsyncDAPOCollector", "Batch", "CollectorConfig", "DAPOCollector", "ForkOf", "ForkPoint", "Group",
           "PromptsExhausted", "Rollout", "RolloutsFailing", "StepStats", "not_all_equal"]

log = logging.getLogger(__name__)
#: what the gateway answers a submission it will never accept: its group is dropped (a fork's
#: source unknown or expired, or its group id taken by another request, included)
REJECTED = (BadRequest, RequestRejected, Conflict, JobNotFound)


class AsyncDAPOCollector:
    """See the module docstring. ``prompts`` yields task instances (dicts) or ``ForkOf``; ``make_request``
    (group, rollout index) -> ``{"instance", "sampling_params"?, "task"?, "timeout_s"?}``
    replaces the default request, e.g. to vary the seed per rollout."""

    def __init__(self, client: AsyncRolloutClient, prompts: Iterable[dict[str, Any] | ForkOf],
                 config: CollectorConfig | None = None, *,
                 make_request: Callable[[Group, int], dict[str, Any]] | None = None,
                 busy_probe: BusyProbe | None = None, run_id: str | None = None, **options: Any) -> None:
        self.client = client
        self.config = config or CollectorConfig(**options)
        self.make_request = make_request or self.default_request
        self.busy_probe = busy_probe
        self.run_id = run_id or uuid.uuid4().hex[:10]
        self.step = 0
        self._prompts: Iterator[dict[str, Any] | ForkOf] = iter(prompts)
        self._exhausted = False
        self._next_key = 0
        self._groups: dict[int, Group] = {}
        #: (group key, index, job id if one was already tried) of rollouts not yet submitted
        self._pending: deque[tuple[int, int, str | None]] = deque()
        #: keys of fork groups whose fork request is still to be made
        self._fork_queue: deque[int] = deque()
        #: job id -> (rollout, the task of the POST /jobs/wait stream watching it: one per batch)
        self._watchers: dict[str, tuple[Rollout, asyncio.Task]] = {}
        self._unwatched: list[Rollout] = []  # submitted, their stream not yet started
        self._results: asyncio.Queue[tuple[Rollout, dict[str, Any] | Exception]] = asyncio.Queue()
        self._orphans: list[Rollout] = []  # rollouts whose wait failed; watched again next step
        self._ready: list[Group] = []  # informative groups completed beyond the last batch
        self._to_cancel: list[str] = []
        self._cancelled_ids: list[str] = []
        self._failures_in_row = 0
        self._interrupted: tuple[StepStats, float, float | None] | None = None
        #: the policy version the trainer holds now (set_policy_version after each weight update)
        self.policy_version: int | None = None

    def set_policy_version(self, version: int) -> None:
        """The trainer pushed new weights: rollouts are judged against ``max_policy_lag`` now."""
        self.policy_version = version

    def _too_old(self, rollout: Rollout) -> bool:
        lag = self.config.max_policy_lag
        versions = forks.trained_versions(rollout)
        if lag is None or self.policy_version is None or not versions:
            return False
        return min(versions) < self.policy_version - lag

    def default_request(self, group: Group, index: int) -> dict[str, Any]:
        """The prompt's instance with ``instance_id``/``trajectory_id`` and the config's fields."""
        instance = {**group.instance, "instance_id": group.prompt_id,
                    "trajectory_id": f"{group.prompt_id}-{index}"}
        return {"instance": instance, "sampling_params": dict(self.config.sampling_params),
                "task": self.config.task, "timeout_s": self.config.timeout_s}

    # -- one step ----------------------------------------------------------------------------------

    async def next_batch(self) -> Batch:
        """Collect B informative groups (fewer only on step timeout or an exhausted stream)."""
        self.step += 1
        if self._interrupted is not None:  # the same step again, after an error
            stats, started, busy_before = self._interrupted
            self._interrupted = None
        else:
            carried_in = len(self._watchers) + self._results.qsize() + sum(g.size for g in self._ready)
            stats = StepStats(self.step, carried_in=carried_in)
            started, busy_before = time.monotonic(), await self._busy()
            self._cancelled_ids = []
        self._rewatch_failed_waits()
        groups = self._take_ready(stats)
        try:
            await self._fill(groups, stats, started)
        except BaseException:  # gateway gone, cancelled: keep what is in hand for the retried step
            self._ready[:0] = groups
            self._interrupted = (stats, started, busy_before)
            self.step -= 1
            raise
        await self._end_step(stats)
        for rollout in (r for g in groups for r in g.rollouts.values()):
            rollout.batch_step = self.step
        stats.informative, stats.wall_s = len(groups), time.monotonic() - started
        busy_after = await self._busy()
        if busy_before is not None and busy_after is not None and stats.wall_s > 0:
            stats.busy_fraction = (busy_after - busy_before) / stats.wall_s
        if not groups and self._exhausted and not self._watchers and not self._ready and not self._fork_queue:
            raise PromptsExhausted(f"the prompt stream ended (step {self.step})")
        return Batch(self.step, groups, stats, self._cancelled_ids)

    async def _fill(self, groups: list[Group], stats: StepStats, started: float) -> None:
        """Submit and read results until ``groups`` holds B informative groups."""
        while len(groups) < self.config.batch_groups:
            await self._flush_cancels(stats)
            await self._replenish(stats)
            if not self._watchers and self._results.empty():
                return  # nothing running and nothing left to submit
            item = await self._next_result(started)
            while item is not None:  # everything already in, before submitting more
                group = self._collect(*item, stats)
                if group is not None:
                    groups.append(group)
                item = None if len(groups) >= self.config.batch_groups or self._results.empty() \
                    else self._results.get_nowait()
            if self._timed_out(started):
                return

    def _timed_out(self, started: float) -> bool:
        limit = self.config.step_timeout_s
        return limit is not None and time.monotonic() - started >= limit

    async def _next_result(self, started: float) -> tuple[Rollout, Any] | None:
        timeout = self.config.step_timeout_s
        if timeout is None:
            return await self._results.get()
        try:
            return await asyncio.wait_for(self._results.get(), max(0.0, started + timeout - time.monotonic()))
        except TimeoutError:
            return None

    def _rewatch_failed_waits(self) -> None:
        """Watch again every rollout whose wait gave up (the gateway was unreachable): the job
        itself went on in the service, and its result is still there to read."""
        queued = [self._results.get_nowait() for _ in range(self._results.qsize())]
        for rollout, outcome in queued:
            if _wait_failed(outcome):
                self._orphans.append(rollout)
            else:
                self._results.put_nowait((rollout, outcome))
        for rollout in self._orphans:
            self._watch(rollout)
        self._orphans.clear()
        self._start_watching()

    def _take_ready(self, stats: StepStats) -> list[Group]:
        """Groups completed after the last batch was cut, if still fresh enough."""
        ready, self._ready = self._ready, []
        fresh = [g for g in ready if self.step - g.first_step <= self.config.max_staleness
                 and not any(self._too_old(r) for r in g.rollouts.values())]
        stats.stale += len(ready) - len(fresh)
        self._ready = fresh[self.config.batch_groups:]
        return fresh[:self.config.batch_groups]

    # -- submitting ----------------------------------------------------------------------------------

    async def _replenish(self, stats: StepStats) -> None:
        """Submit until ``max_in_flight`` rollouts are running or ended but not yet read.

        Counting the unread results too keeps submission from running ahead of collection. A
        fork group goes out whole, in one request, as soon as a slot is free.
        """
        batch: list[Rollout] = []
        errors: list[BaseException] = []
        while not errors and len(self._watchers) + self._results.qsize() + len(batch) < self.config.in_flight:
            if self._fork_queue:
                error = await self._submit_fork_group(self._fork_queue.popleft(), stats)
                errors += [error] if error is not None else []
                continue
            slot = self._next_slot()
            if slot is None:
                if self._fork_queue:  # the stream asked for a fork group: submitted next time round
                    continue
                break
            batch.append(self._slot_rollout(*slot))
        if batch:
            outcomes = await self._submit_all(batch)
            submitted = (self._submitted(r, outcome, stats) for r, outcome in zip(batch, outcomes, strict=True))
            errors += [error for error in submitted if error is not None]
        self._start_watching()
        if errors:
            raise errors[0]

    def _slot_rollout(self, group: Group, index: int, job_id: str | None) -> Rollout:
        """The rollout of slot ``index``: a fresh job id, or that of a submission that failed
        (repeated under its id: the job may exist already)."""
        resubmits = group.resubmits.get(index, 0)
        if job_id is None and group.fork is not None:  # run again as a fork too, never from zero
            job_id = forks.one_fork_job_id(forks.refork_group_id(group, index, resubmits))
        job_id = job_id or f"{self.run_id}-{group.key}-{index}-{resubmits}" + (
            f"-r{group.reruns}" if group.reruns else "")
        rollout = Rollout(job_id, group.key, index, self.step)
        group.rollouts[index] = rollout
        return rollout

    def _next_slot(self) -> tuple[Group, int, str | None] | None:
        """The next rollout to submit: a slot left pending, else the first of a new prompt's group;
        None when there is none (or the stream gave a ``ForkOf``: its group is queued)."""
        while self._pending:
            key, index, job_id = self._pending.popleft()
            if key in self._groups:
                return self._groups[key], index, job_id
        if self._exhausted:
            return None
        try:
            instance = next(self._prompts)
        except StopIteration:
            self._exhausted = True
            return None
        key, self._next_key = self._next_key, self._next_key + 1
        if isinstance(instance, ForkOf):
            self._new_fork_group(key, instance.prompt_id or f"fork:{instance.job_id}@{instance.turn}",
                                 instance.instance, ForkPoint(instance.job_id, instance.turn,
                                                              forks.group_id_of(self.run_id, key)))
            return None
        prompt_id = str(instance.get("instance_id") or f"p{key}")
        group = self._groups[key] = Group(key, prompt_id, instance, self.config.group_size, self.step)
        self._pending.extend((key, i, None) for i in range(1, group.size))
        return group, 0, None

    # -- fork groups ---------------------------------------------------------------------------------

    def _new_fork_group(self, key: int, prompt_id: str, instance: dict[str, Any], point: ForkPoint,
                        resamples: int = 0) -> Group:
        """A fork group, queued for its one fork request (``_submit_fork_group``)."""
        group = self._groups[key] = Group(key, prompt_id, instance, self.config.group_size, self.step,
                                          fork=point, resamples=resamples)
        self._fork_queue.append(key)
        return group

    def _fork_filtered(self, group: Group, stats: StepStats) -> bool:
        """Sample a filtered group again by forking one of its members (``fork_filtered``,
        ``fork_at``); False when it is not to be, or cannot be (no member to fork)."""
        if group.resamples >= self.config.fork_filtered:
            return False
        chosen = forks.choose_fork(self.config, group)
        if chosen is None:
            return False
        member, turn = chosen
        key, self._next_key = self._next_key, self._next_key + 1
        point = ForkPoint(member.job_id, turn, forks.group_id_of(self.run_id, key), parent=group.key)
        self._new_fork_group(key, group.prompt_id, group.instance, point, group.resamples + 1)
        stats.forked += 1
        return True

    async def _submit_fork_group(self, key: int, stats: StepStats) -> BaseException | None:
        """One ``POST /jobs/<id>/fork`` for a whole fork group; returns the error to raise when
        the gateway failed (the group stays queued: the retry, under the same group id, finds
        any fork the lost attempt started). A fork the gateway refuses (the source or its
        journal expired, a conflict) drops the group."""
        group = self._groups.get(key)
        if group is None:  # dropped meanwhile
            return None
        point = group.fork
        assert point is not None
        try:
            ids = await self.client.fork(point.job_id, point.turn, group.size, group_id=point.group_id)
        except REJECTED as error:
            log.warning("fork of %s at turn %d refused, dropping its group: %s", point.job_id, point.turn, error)
            self._drop(group, stats)
            return None
        except Exception as error:  # noqa: BLE001 - the gateway is unreachable: the same request later
            self._fork_queue.appendleft(key)
            return error
        group.first_step = self.step  # its staleness counts from when its rollouts started
        for index, job_id in enumerate(ids):
            rollout = group.rollouts[index] = Rollout(job_id, key, index, self.step)
            stats.submitted += 1
            self._watch(rollout)
        return None

    def _request(self, rollout: Rollout) -> JobRequest:
        group = self._groups[rollout.group_key]
        fields = {k: v for k, v in self.make_request(group, rollout.index).items() if v is not None}
        return JobRequest(job_id=rollout.job_id, **fields)

    async def _submit_all(self, rollouts: list[Rollout]) -> list[str | BaseException]:
        """Every rollout in one batch request; when the gateway rejects the batch, one by one, so
        only the rejected rollout's group is dropped. A fork group's rollout run again is a fork
        of its own (a group of one, under its own group id)."""
        forked = [r for r in rollouts if self._fork_of(r) is not None]
        plain = [r for r in rollouts if self._fork_of(r) is None]
        outcomes: dict[str, str | BaseException] = {}
        if plain:
            outcomes.update(zip((r.job_id for r in plain), await self._submit_plain(plain), strict=True))
        if forked:
            replies = await asyncio.gather(*(self._refork(r) for r in forked), return_exceptions=True)
            outcomes.update(zip((r.job_id for r in forked), replies, strict=True))
        return [outcomes[r.job_id] for r in rollouts]

    async def _submit_plain(self, rollouts: list[Rollout]) -> list[str | BaseException]:
        requests = [self._request(r) for r in rollouts]
        try:
            return list(await self.client.submit_many(requests))
        except (BadRequest, RequestRejected):
            return list(await asyncio.gather(*(self.client.submit_request(r) for r in requests),
                                             return_exceptions=True))
        except Exception as error:  # noqa: BLE001 - the gateway is unreachable: every one waits
            return [error] * len(rollouts)

    def _fork_of(self, rollout: Rollout) -> ForkPoint | None:
        group = self._groups.get(rollout.group_key)
        return group.fork if group is not None else None

    async def _refork(self, rollout: Rollout) -> str:
        point = self._fork_of(rollout)
        assert point is not None
        (job_id,) = await self.client.fork(point.job_id, point.turn, 1,
                                           group_id=forks.refork_group_of(rollout.job_id))
        return job_id

    def _submitted(self, rollout: Rollout, outcome: str | BaseException,
                   stats: StepStats) -> BaseException | None:
        """Watch a submitted rollout; returns the error to raise when the gateway failed."""
        group = self._groups.get(rollout.group_key)
        if isinstance(outcome, REJECTED):
            log.warning("rollout %s rejected, dropping its group: %s", rollout.job_id, outcome)
            if group is not None:
                self._drop(group, stats)
            return None
        if isinstance(outcome, BaseException):  # unreachable gateway, stopped service: resubmit later
            if group is not None:
                self._pending.appendleft((group.key, rollout.index, rollout.job_id))
                group.rollouts.pop(rollout.index, None)
            return outcome
        stats.submitted += 1
        if group is None:  # dropped while its siblings were being submitted
            self._to_cancel.append(rollout.job_id)
        else:
            self._watch(rollout)
        return None

    def _watch(self, rollout: Rollout) -> None:
        """Watch from the next ``_start_watching``: the rollouts of one submission share a stream."""
        self._unwatched.append(rollout)

    def _start_watching(self) -> None:
        """One ``POST /jobs/wait`` stream (the client's ``wait_stream``) for every rollout
        submitted since the last call, instead of a long-poll each."""
        rollouts, self._unwatched = self._unwatched, []
        if rollouts:
            task = asyncio.ensure_future(self._wait(rollouts))
            self._watchers.update((r.job_id, (r, task)) for r in rollouts)

    async def _wait(self, rollouts: list[Rollout]) -> None:
        left = {r.job_id: r for r in rollouts}
        try:
            async with contextlib.aclosing(self.client.wait_stream(list(left))) as outcomes:
                async for job_id, outcome in outcomes:
                    self._deliver(left.pop(job_id), outcome)
        except Exception as error:  # noqa: BLE001 - the gateway is gone: next_batch decides for each
            for rollout in left.values():
                self._deliver(rollout, error)

    def _deliver(self, rollout: Rollout, outcome: dict[str, Any] | Exception) -> None:
        watched = self._watchers.get(rollout.job_id)
        if watched is None or watched[0] is not rollout:  # cancelled or dropped meanwhile
            return
        del self._watchers[rollout.job_id]
        self._results.put_nowait((rollout, outcome))

    # -- results -------------------------------------------------------------------------------------

    def _collect(self, rollout: Rollout, outcome: dict[str, Any] | Exception, stats: StepStats) -> Group | None:
        """Record one result; returns its group when that completes informative."""
        if _wait_failed(outcome):
            self._orphans.append(rollout)  # the job still runs; watched again by the next call
            raise outcome
        group = self._groups.get(rollout.group_key)
        if group is None or group.rollouts.get(rollout.index) is not rollout:
            stats.discarded += 1
            return None
        stats.completed += 1
        # an unknown job id (JobNotFound) is a lost rollout: an env_error like a failed job
        result: dict[str, Any] = outcome if isinstance(outcome, dict) else {"status": "failed", "error": str(outcome)}
        ending = RolloutOutcome.of(result)
        rollout.result, rollout.status, rollout.outcome = result, result["status"], ending.outcome
        rollout.generation = result.get("generation")
        rollout.policy_versions = list((result.get("trajectory") or {}).get("policy_versions") or [])
        rollout.fork_of, rollout.fork_turn, rollout.shared_turns = forks.fork_fields(result)
        # a fork's shared prefix is masked out of its samples (prorl_celery.trainer.samples)
        rollout.samples = samples_of(result, include_auxiliary=self.config.train_auxiliary)
        self._failures_in_row = 0 if ending.reward_valid else self._failures_in_row + 1
        if self._failures_in_row > self.config.failure_limit:
            raise RolloutsFailing(f"{self._failures_in_row} rollouts in a row ended without a valid reward; "
                                  f"last: {ending.describe()}")
        if ending.reward_valid and self._too_old(rollout):
            stats.stale_rollouts += 1  # produced by weights too far behind: run it again
            group.reruns += 1
            self._pending.appendleft((group.key, rollout.index, None))
            return None
        if ending.reward_valid:
            rollout.reward = ending.reward
        else:
            self._resubmit_or_drop(group, rollout, ending, stats)
        return self._completed(group, stats)

    def _resubmit_or_drop(self, group: Group, rollout: Rollout, ending: RolloutOutcome, stats: StepStats) -> None:
        """A rollout whose reward is not valid: submitted again while it has resubmissions left,
        else dropped from its group (counted per outcome class either way)."""
        kind = ending.outcome or "unknown"
        done = group.resubmits.get(rollout.index, 0)
        if done < self.config.max_resubmits:
            group.resubmits[rollout.index] = done + 1
            stats.resubmitted[kind] = stats.resubmitted.get(kind, 0) + 1
            self._pending.appendleft((group.key, rollout.index, None))
            return
        log.warning("dropping rollout %s after %d resubmissions: %s", rollout.job_id, done, ending.describe())
        stats.dropped[kind] = stats.dropped.get(kind, 0) + 1
        group.dropped[rollout.index] = group.rollouts.pop(rollout.index)

    def _completed(self, group: Group, stats: StepStats) -> Group | None:
        """The group, once complete and informative; a complete group is forgotten either way."""
        if not group.complete:
            return None
        del self._groups[group.key]
        if len(group.finished) < self.config.smallest_group:
            stats.failed_groups += 1  # too few valid rollouts left to compare
            return None
        if self.config.group_filter(group.rewards):
            return group
        stats.filtered += 1
        if self.config.fork_filtered:
            self._fork_filtered(group, stats)
        return None

    def _drop(self, group: Group, stats: StepStats) -> None:
        """Forget a group and cancel its rollouts still running."""
        self._groups.pop(group.key, None)
        stats.failed_groups += 1
        self._cancel_rollouts(group)

    def _cancel_rollouts(self, group: Group) -> None:
        streams = set()
        for rollout in group.rollouts.values():
            watched = self._watchers.pop(rollout.job_id, None)
            if watched is not None:
                streams.add(watched[1])
                self._to_cancel.append(rollout.job_id)
        # a stream that watches nobody else any more is closed (its lines would be dropped)
        for stream in streams - {task for _, task in self._watchers.values()}:
            stream.cancel()

    async def _flush_cancels(self, stats: StepStats) -> list[str]:
        ids, self._to_cancel = self._to_cancel, []
        if not ids:
            return []
        outcome = await self.client.cancel(ids)
        stats.cancelled += len(outcome.cancelled)
        stats.discarded += len(outcome.not_cancelled)
        self._cancelled_ids.extend(outcome.cancelled)
        return outcome.cancelled

    # -- the end of a step ---------------------------------------------------------------------------

    async def _end_step(self, stats: StepStats) -> None:
        """Read results already in, carry over the useful unfinished groups, cancel the rest."""
        while not self._results.empty():
            rollout, outcome = self._results.get_nowait()
            if _wait_failed(outcome):
                self._orphans.append(rollout)
                continue
            group = self._collect(rollout, outcome, stats)
            if group is not None:
                self._ready.append(group)
        # a fork group not yet submitted costs nothing: it waits for a free slot of the next step
        keep = self._carry_candidates() | set(self._fork_queue)
        for group in list(self._groups.values()):
            if group.key not in keep:
                del self._groups[group.key]
                self._cancel_rollouts(group)
        stats.carried_groups = len(keep - set(self._fork_queue))
        stats.carried_over = sum(1 for r, _ in self._watchers.values() if r.group_key in keep)
        await self._flush_cancels(stats)

    def _carry_candidates(self) -> set[int]:
        config = self.config
        if not config.carry_over:
            return set()
        limit = config.batch_groups if config.max_carry_groups is None else config.max_carry_groups
        scored = []
        for group in self._groups.values():
            if self.step + 1 - group.first_step > config.max_staleness:
                continue
            proven = len(group.finished) >= 2 and config.group_filter(group.rewards)
            progress = (len(group.finished) + len(group.dropped)) / group.size
            if proven or progress >= config.carry_min_done:
                scored.append((not proven, -progress, group.key))
        return {key for _, _, key in sorted(scored)[:limit]}

    async def _busy(self) -> float | None:
        if self.busy_probe is None:
            return None
        value = self.busy_probe()
        return float(await value) if inspect.isawaitable(value) else float(value)

    # -- lifetime --------------------------------------------------------------------------------------

    async def batches(self) -> AsyncIterator[Batch]:
        """``async for batch in collector.batches()`` until the prompt stream is used up."""
        while True:
            try:
                yield await self.next_batch()
            except PromptsExhausted:
                return

    async def aclose(self, cancel: bool = True) -> None:
        """Stop watching; with ``cancel``, cancel every rollout still running in the service."""
        ids = list(self._watchers)
        for _, task in self._watchers.values():
            task.cancel()
        self._watchers.clear()
        self._groups.clear()
        self._pending.clear()
        self._fork_queue.clear()
        if cancel and ids:
            await self.client.cancel(ids)


class DAPOCollector:
    """Blocking :class:`AsyncDAPOCollector`, on the loop of a :class:`RolloutClient`: results keep
    arriving while the trainer computes its update between two ``next_batch`` calls."""

    def __init__(self, client: RolloutClient, prompts: Iterable[dict[str, Any] | ForkOf],
                 config: CollectorConfig | None = None, **options: Any) -> None:
        self.client = client
        self.aio: AsyncDAPOCollector = client.run(_make_async(client.aio, prompts, config, options))

    def __enter__(self) -> DAPOCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def step(self) -> int:
        return self.aio.step

    def set_policy_version(self, version: int) -> None:
        self.aio.set_policy_version(version)

    def next_batch(self) -> Batch:
        return self.client.run(self.aio.next_batch())

    def __iter__(self) -> Iterator[Batch]:
        while True:
            try:
                yield self.next_batch()
            except PromptsExhausted:
                return

    def close(self, cancel: bool = True) -> None:
        self.client.run(self.aio.aclose(cancel))


def _wait_failed(outcome: dict[str, Any] | Exception) -> TypeGuard[Exception]:
    """The wait for a job gave up (not: the job is unknown, which is a lost rollout)."""
    return isinstance(outcome, Exception) and not isinstance(outcome, JobNotFound)


async def _make_async(client: AsyncRolloutClient, prompts: Iterable[dict[str, Any] | ForkOf],
                      config: CollectorConfig | None, options: dict[str, Any]) -> AsyncDAPOCollector:
    return AsyncDAPOCollector(client, prompts, config, **options)
