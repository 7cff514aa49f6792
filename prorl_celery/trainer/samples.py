"""The training samples of a rollout's result, as a trainer takes them (DESIGN decision 19).

A rollout through the per-job endpoint may give several samples: the main agent's conversation,
a sub-agent's (Claude Code's Task tool), a call of a small model under another model name
(titles), and a segment started when the agent rewrote its history. Each has its own
``prompt_ids``, ``response_ids``, mask, logprobs and policy versions, and its ``origin``. The
result's ``trajectory.samples`` lists them when there is more than one; a trajectory without
``samples`` (one sample, or a server from before samples) is its own one sample.

    for sample in samples_of(result):            # the main agent's first
        train(sample.prompt_ids, sample.response_ids, sample.response_mask, sample.reward)

Rewards: a sample's ``reward`` is the rollout's (``client.reward_of``) unless the handler gave it
one of its own; None when the rollout's reward is not valid, and a trainer never trains on it.
Auxiliary samples (another model name) are left out unless ``include_auxiliary``: a small model's
titles are usually not what is being trained.

Forks (``POST /jobs/<id>/fork``, ``docs/journal.md``): a fork's trajectory begins with the turns
it shares with its source, taken from the source's journal. Those model tokens are not trained
on: ``samples_of`` sets their ``response_mask`` to 0 (``Sample.shared_tokens`` counts them) and
names the source (``fork_of``, ``fork_turn``). Why: every member of a fork group holds the same
prefix, so it cannot tell them apart: the group's advantages sum to zero, and on the same tokens
they cancel (exactly with a token-level loss, before clipping; as noise with a per-sequence one).
Kept in, the prefix would only count n times in the loss's token normaliser, diluting the tokens
the group does compare, and n times in a KL term. The prefix is the source's own output: it is
trained, if at all, with the source's group. The trajectory in the result keeps the mask as
generated (1 = a model token, DESIGN decision 7): masking is the trainer side's call.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prorl_celery.trainer.client import reward_of

#: the origin of a sample under a model name other than the job's (a small, fast model's call)
AUXILIARY = "auxiliary"


@dataclass(frozen=True)
class Sample:
    """One training sample of a rollout."""

    job_id: str | None
    index: int  # its place in the trajectory's ``samples`` (0 for a one-sample trajectory)
    origin: str  # main, subagent, auxiliary or rewrite
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1: a model token (trained), 0: an observation
    response_logprobs: list[float]
    reward: float | None
    policy_versions: list[int] = field(default_factory=list)
    model: str | None = None
    parent: int | None = None  # a rewrite: the sample it rewrote
    primary: bool = True  # the trajectory's top level (the main agent's latest sample)
    num_turns: int = 0
    #: a fork's: the job it forked from and the turn (its first ``fork_turn`` turns are that job's)
    fork_of: str | None = None
    fork_turn: int | None = None
    #: model tokens of the shared prefix, masked out of ``response_mask`` (not trained on)
    shared_tokens: int = 0

    @property
    def trainable(self) -> bool:
        """It has a valid reward and at least one model token."""
        return self.reward is not None and any(self.response_mask)


def samples_of(result: Mapping[str, Any], *, include_auxiliary: bool = False) -> list[Sample]:
    """The result's samples, the primary (main agent's) first, then the others in the order they
    started; samples without ids (a call that failed before its reply) are left out, and
    auxiliary ones unless asked for."""
    trajectory = result.get("trajectory") or {}
    reward = reward_of(result)
    records = trajectory.get("samples")
    shared = shared_turns(result)
    if not records:
        one = _sample(result, trajectory, 0, reward, primary=True, shared=shared)
        return [one] if one.response_ids else []
    primary = trajectory.get("primary_sample", 0)
    samples = [_sample(result, record, record.get("sample", i), _own_reward(record, reward),
                       primary=record.get("sample", i) == primary, shared=shared) for i, record in enumerate(records)]
    samples.sort(key=lambda s: (not s.primary, s.index))
    return [s for s in samples if s.response_ids and (include_auxiliary or s.origin != AUXILIARY)]


def shared_turns(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The turns a fork's trajectory shares with its source (the first ``fork.shared_turns`` of
    ``trajectory.turns``, every sample's); none for a job that is not a fork, or a fork that
    started again from turn zero."""
    fork = result.get("fork") or {}
    count = int(fork.get("shared_turns") or 0)
    return list(((result.get("trajectory") or {}).get("turns") or [])[:count])


def mask_turns(mask: list[int], turns: list[dict[str, Any]]) -> tuple[list[int], int]:
    """``mask`` with the model tokens of ``turns`` (each ``output_start``, ``output_len`` in the
    sample's response) set to 0, and how many were 1 before."""
    masked = list(mask)
    for turn in turns:
        start, length = turn.get("output_start"), turn.get("output_len")
        if start is None or length is None:  # a record without positions: train on nothing of it
            start, length = 0, len(masked)
        for position in range(max(0, int(start)), min(len(masked), int(start) + int(length))):
            masked[position] = 0
    return masked, sum(mask) - sum(masked)


def _own_reward(record: Mapping[str, Any], rollout: float | None) -> float | None:
    if rollout is None:
        return None  # not valid for the rollout: for none of its samples either
    own = record.get("reward")
    return float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) else rollout


def _sample(result: Mapping[str, Any], record: Mapping[str, Any], index: int, reward: float | None, *,
            primary: bool, shared: list[dict[str, Any]]) -> Sample:
    fork = result.get("fork") or {}
    mask, shared_tokens = mask_turns([int(m) for m in record.get("response_mask") or []],
                                     [t for t in shared if t.get("sample", 0) == index])
    return Sample(job_id=result.get("job_id"), index=index, origin=record.get("origin") or "main",
                  prompt_ids=list(record.get("prompt_ids") or []), response_ids=list(record.get("response_ids") or []),
                  response_mask=mask,
                  response_logprobs=[float(x) for x in record.get("response_logprobs") or []], reward=reward,
                  policy_versions=list(record.get("policy_versions") or []), model=record.get("model"),
                  parent=record.get("parent"), primary=primary,
                  num_turns=int(record.get("num_turns") or len(record.get("turns") or ())),
                  fork_of=fork.get("of"), fork_turn=fork.get("turn"), shared_tokens=shared_tokens)
