"""The DAPO collector's fork groups: where to fork a filtered group, and the ids it forks under.

A group whose rewards are all equal teaches nothing (dynamic sampling drops it). With
``CollectorConfig.fork_filtered``, the collector samples it again from part-way instead of from
zero: it forks one member at a turn (``fork_point``: a fraction of its turns; or
``before_last_turn``; or a function of the trainer's own) into a new group of ``group_size`` jobs
that share that member's first turns, which the service takes from its journal and never
generates again. The new group's rewards then compare what its members did after the fork.

Every fork request goes out under a group id made here from the collector's run id and the
group's key, before the first attempt, so a retried request (a lost reply, a 503, a step run
again after an error) finds its forks instead of starting a second set.
"""
from __future__ import annotations

import math
from typing import Any

from prorl_celery.core.forks import fork_job_id
from prorl_celery.trainer.dapo_types import CollectorConfig, Group, Rollout


def turns_of(rollout: Rollout) -> int:
    """The model turns of a finished rollout's trajectory (0 without one)."""
    trajectory = (rollout.result or {}).get("trajectory") or {}
    return int(trajectory.get("num_turns") or len(trajectory.get("turns") or ()))


def longest_member(group: Group, least_turns: int = 1) -> Rollout | None:
    """The finished member with the most turns (the most to share), the lowest index on ties;
    None when none has ``least_turns``."""
    members = [r for r in group.finished if turns_of(r) >= least_turns]
    return max(members, key=lambda r: (turns_of(r), -r.index)) if members else None


def fork_point(group: Group, fraction: float) -> tuple[Rollout, int] | None:
    """Fork the longest member at ``floor(fraction * turns)``, kept within 1 .. turns - 1 (some
    turns shared, at least the last sampled again); None when no member has two turns."""
    member = longest_member(group, least_turns=2)
    if member is None:
        return None
    turns = turns_of(member)
    return member, min(turns - 1, max(1, math.floor(fraction * turns)))


def before_last_turn(group: Group) -> tuple[Rollout, int] | None:
    """Fork the longest member before its last turn, the one that gave the answer: only that turn
    is sampled again (``CollectorConfig(fork_at=before_last_turn)``)."""
    return fork_point(group, 1.0)


def choose_fork(config: CollectorConfig, group: Group) -> tuple[Rollout, int] | None:
    """Where to fork a filtered ``group`` under ``config.fork_at``."""
    if callable(config.fork_at):
        return config.fork_at(group)
    return fork_point(group, config.fork_at)


def group_id_of(run_id: str, key: int) -> str:
    """The service group id of the collector's fork group ``key``: its jobs are ``<id>-<i>``."""
    return f"{run_id}-{key}-fork"


def refork_group_id(group: Group, index: int, resubmits: int) -> str:
    """The group id of one fork run again for slot ``index`` of a fork group (its reward was not
    valid, or its policy too old): a group of one, ``<group id>-<index>-<n>[-r<k>]``."""
    assert group.fork is not None
    suffix = f"-r{group.reruns}" if group.reruns else ""
    return f"{group.fork.group_id}-{index}-{resubmits}{suffix}"


def refork_group_of(job_id: str) -> str:
    """The group id a one-fork job id was made under (``fork_job_id(group, 0)``)."""
    group, index = job_id.rsplit("-", 1)
    assert index == "0", job_id
    return group


def one_fork_job_id(group_id: str) -> str:
    return fork_job_id(group_id, 0)


def fork_fields(result: dict[str, Any]) -> tuple[str | None, int | None, int]:
    """A result's ``fork``: the job it forked from, the turn, and the turns it really shares."""
    fork = result.get("fork") or {}
    return fork.get("of"), fork.get("turn"), int(fork.get("shared_turns") or 0)


def trained_versions(rollout: Rollout) -> list[int]:
    """The policy versions of the tokens a trainer learns from: a fork's own turns only (its
    shared prefix is masked out and may be far older: judging the fork by it would run it again
    for ever), every turn's for any other rollout."""
    if not rollout.shared_turns:
        return rollout.policy_versions
    turns = ((rollout.result or {}).get("trajectory") or {}).get("turns") or []
    own = turns[rollout.shared_turns:]
    return sorted({v for t in own for v in (t.get("policy_version"), t.get("policy_version_start")) if v is not None})
