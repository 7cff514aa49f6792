"""The DAPO collector's data: configuration, rollouts, groups, batches and per-step statistics.

See :mod:`prorl_celery.trainer.dapo` for how they are produced.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prorl_celery.core.errors import ProrlError
from prorl_celery.core.forks import MAX_FORKS
from prorl_celery.trainer.samples import Sample

#: cumulative backend busy time, in seconds per unit of capacity (a float, or awaitable)
BusyProbe = Callable[[], "float | Awaitable[float]"]


def not_all_equal(rewards: Sequence[float]) -> bool:
    """The default filter: a group is informative unless every reward is the same."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-9


class RolloutsFailing(ProrlError):
    """Too many rollouts in a row ended without a valid reward: the service or a backend is broken."""

    code = "rollouts_failing"


@dataclass(frozen=True)
class CollectorConfig:
    group_size: int
    batch_groups: int
    #: rollouts kept running in the service (default 2 * B * n)
    max_in_flight: int | None = None
    group_filter: Callable[[Sequence[float]], bool] = not_all_equal
    #: a rollout whose reward is not valid (any outcome but ok and agent_error: the environment,
    #: the backend or the evaluator failed, it timed out, someone else cancelled it) is submitted
    #: again under a new job id up to this many times, then dropped from its group
    max_resubmits: int = 2
    #: a complete group left with fewer valid rollouts than this after drops is dropped
    #: (None: 2, or group_size when smaller; group_size: only whole groups are batched)
    min_group_size: int | None = None
    carry_over: bool = True
    #: a rollout lands in a batch at most this many steps after the step it was submitted in
    max_staleness: int = 1
    #: the same bound in policy versions (TRL async GRPO's and prime-rl's): a rollout any of whose
    #: tokens came from a version more than this far behind the collector's ``policy_version``
    #: is run again (None: versions are not checked)
    max_policy_lag: int | None = None
    carry_min_done: float = 0.5
    max_carry_groups: int | None = None
    #: a step returns what it has (fewer than B groups) after this long
    step_timeout_s: float | None = None
    #: raise RolloutsFailing after this many rollouts in a row had no valid reward (default 2 N)
    max_failures_in_row: int | None = None
    #: the default request: instance + these (see AsyncDAPOCollector.make_request)
    sampling_params: dict[str, Any] = field(default_factory=dict)
    task: str | None = None
    timeout_s: float | None = None
    #: train on a rollout's auxiliary samples too (calls under another model name, such as a
    #: small model's titles): they are in ``Rollout.samples`` only when this is set
    train_auxiliary: bool = False
    #: a complete group the filter rejects (all rewards equal) is sampled again, up to this many
    #: times in a row, by forking one of its members instead of being dropped: a new group of
    #: ``group_size`` forks sharing the member's first turns, which the service never generates
    #: again (0: off, a filtered group is dropped as before)
    fork_filtered: int = 0
    #: where a filtered group is forked: a fraction of the turns of its longest member (the turn
    #: is ``floor(fork_at * turns)``, at least 1 and at most ``turns - 1``, so something is
    #: shared and something sampled again; a member of one turn is not forked), or a function
    #: ``(group) -> (member, turn)`` or None (that group stays filtered), such as
    #: ``prorl_celery.trainer.dapo_forks.before_last_turn``
    fork_at: float | Callable[[Group], tuple[Rollout, int] | None] = 0.5

    def __post_init__(self) -> None:
        if self.fork_filtered < 0:
            raise ValueError(f"fork_filtered: 0 or more re-samples, got {self.fork_filtered}")
        if self.fork_filtered and self.group_size > MAX_FORKS:  # one fork request makes a whole group
            raise ValueError(f"fork_filtered: a fork group holds at most {MAX_FORKS} forks; group_size is "
                             f"{self.group_size}")
        if not callable(self.fork_at) and not 0.0 <= self.fork_at <= 1.0:
            raise ValueError(f"fork_at: a fraction of the turns, 0 to 1, or a function; got {self.fork_at!r}")

    @property
    def in_flight(self) -> int:
        return self.max_in_flight or 2 * self.batch_groups * self.group_size

    @property
    def failure_limit(self) -> int:
        return self.max_failures_in_row or 2 * self.in_flight

    @property
    def smallest_group(self) -> int:
        return min(self.group_size, 2 if self.min_group_size is None else self.min_group_size)


@dataclass(frozen=True)
class ForkOf:
    """An item of the prompt stream that asks for a fork group instead of a fresh one: the
    collector forks ``job_id`` (any ended or running job with a journal) at ``turn`` into
    ``group_size`` jobs, and groups, filters and batches them like any group (tree-shaped
    rollouts). ``prompt_id`` and ``instance`` name the group (default ``fork:<job>@<turn>``)."""

    job_id: str
    turn: int
    prompt_id: str | None = None
    instance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ForkPoint:
    """Where a fork group comes from: ``POST /jobs/<job_id>/fork`` at ``turn`` under the
    collector's ``group_id`` (so a retried request never starts a second set)."""

    job_id: str
    turn: int
    group_id: str
    #: the key of the filtered group it samples again (None: the prompt stream asked for it)
    parent: int | None = None


@dataclass
class Rollout:
    job_id: str
    group_key: int
    index: int
    #: step the rollout was submitted in
    step: int
    status: str | None = None
    #: how it ended (``prorl_celery.core.outcomes``: ok, agent_error, env_error, ...)
    outcome: str | None = None
    #: its valid reward (``client.reward_of``); None for a rollout whose reward is not valid
    reward: float | None = None
    generation: int | None = None
    #: every policy version that produced a token of it (the trajectory's ``policy_versions``)
    policy_versions: list[int] = field(default_factory=list)
    #: step of the batch the rollout's group was returned in
    batch_step: int | None = None
    result: dict[str, Any] | None = None
    #: its training samples (``prorl_celery.trainer.samples.samples_of``): the main agent's
    #: first, then sub-agents' and rewrites' (auxiliary ones with ``train_auxiliary``), each
    #: with the rollout's reward unless the handler gave it its own
    samples: list[Sample] = field(default_factory=list)
    #: a fork's (its result's ``fork``): the job it forked from, at which turn, and the turns it
    #: really shares (0 when it had to start again from turn zero); those are masked out of its
    #: samples (``prorl_celery.trainer.samples``)
    fork_of: str | None = None
    fork_turn: int | None = None
    shared_turns: int = 0

    @property
    def carried_over(self) -> bool:
        """Submitted in an earlier step than the batch it is returned in."""
        return self.batch_step is not None and self.batch_step > self.step


@dataclass
class Group:
    key: int
    prompt_id: str
    instance: dict[str, Any]
    size: int
    first_step: int
    #: index -> the rollout of that slot now (a resubmission replaces the one before)
    rollouts: dict[int, Rollout] = field(default_factory=dict)
    #: index -> the last rollout of a slot whose reward stayed invalid after max_resubmits; a
    #: dropped rollout is in no reward, no variance and no batch
    dropped: dict[int, Rollout] = field(default_factory=dict)
    #: index -> how many times that slot was resubmitted for an invalid reward
    resubmits: dict[int, int] = field(default_factory=dict)
    #: rollouts run again for their policy lag (not failures: max_resubmits does not count them)
    reruns: int = 0
    #: a fork group's origin (None: a fresh group of the prompt)
    fork: ForkPoint | None = None
    #: how many filtered groups before it this one samples again (``fork_filtered`` bounds it)
    resamples: int = 0

    @property
    def finished(self) -> list[Rollout]:
        """The rollouts with a valid reward."""
        return [r for r in self.rollouts.values() if r.reward is not None]

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in sorted(self.finished, key=lambda r: r.index)]  # type: ignore[misc]

    @property
    def complete(self) -> bool:
        """Every slot has a valid reward or was dropped."""
        return len(self.finished) + len(self.dropped) == self.size

    @property
    def ordered(self) -> list[Rollout]:
        """The group's rollouts by index (in a batch: those with a valid reward, dropped ones left out)."""
        return [self.rollouts[i] for i in sorted(self.rollouts)]


@dataclass
class StepStats:
    step: int
    submitted: int = 0
    #: results received (any status or outcome)
    completed: int = 0
    #: rollouts the service confirmed cancelled at the end of the step (or with a dropped group)
    cancelled: int = 0
    #: complete groups dropped by the filter
    filtered: int = 0
    #: of those, the groups sampled again by forking one of their members (``fork_filtered``)
    forked: int = 0
    #: groups dropped: a submission the gateway rejected, or fewer than min_group_size valid
    #: rollouts left after drops
    failed_groups: int = 0
    #: outcome class -> rollouts submitted again because their reward was not valid
    resubmitted: dict[str, int] = field(default_factory=dict)
    #: outcome class -> rollouts dropped from their group, their resubmissions spent
    dropped: dict[str, int] = field(default_factory=dict)
    #: complete informative groups dropped for exceeding max_staleness or max_policy_lag
    stale: int = 0
    #: completed rollouts run again because their policy was older than max_policy_lag allows
    stale_rollouts: int = 0
    #: results of groups already dropped, or of jobs ended before their cancel arrived
    discarded: int = 0
    #: rollouts from earlier steps still in flight (or unread) when this step began
    carried_in: int = 0
    #: rollouts left running into the next step, and their groups
    carried_over: int = 0
    carried_groups: int = 0
    informative: int = 0
    wall_s: float = 0.0
    busy_fraction: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Batch:
    step: int
    groups: list[Group]
    stats: StepStats
    cancelled_job_ids: list[str] = field(default_factory=list)

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.ordered]

    @property
    def samples(self) -> list[Sample]:
        """Every training sample of the batch's rollouts, rollout by rollout."""
        return [s for r in self.rollouts for s in r.samples]
