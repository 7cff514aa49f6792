"""``ProrlRollout`` (the TRL rollout_func) against an in-memory gateway: a reward that is not
valid never reaches TRL as a reward, and the first step's rollouts record policy version 0.
TRL itself is not needed: the rollout_func's output is what TRL would receive."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from prorl_celery.core.errors import BadRequest
from prorl_celery.trainer.client import RewardInvalid
from prorl_celery.trainer.integrations.trl import ProrlRollout, service_reward
from tests.support.fake_gateway import FakeGateway

SERVER = "http://vllm:8000/v1"


def trainer_at(step: int) -> SimpleNamespace:
    """What ProrlRollout reads of a TRL trainer: the step and the tokenizer's eos."""
    return SimpleNamespace(state=SimpleNamespace(global_step=step), args=None, processing_class=None)


def planned(body: dict[str, Any]) -> tuple[str, float, float]:
    """Rollout ``i`` of a group ends as ``plan[i][k]`` on its ``k``-th resubmission (the last
    entry from then on), with reward ``rewards[i]`` when that is ``ok``."""
    instance, job_id = body["instance"], body["job_id"]
    index = int(instance["trajectory_id"])
    attempt = int(job_id.rsplit("-re", 1)[1]) if "-re" in job_id else 0
    plan = instance["plan"][index]
    ending = plan[min(attempt, len(plan) - 1)]
    return ending, instance["rewards"][index] if ending == "ok" else 0.0, 0.0


def rollout_for(fake: FakeGateway, instance: dict[str, Any], **options) -> ProrlRollout:
    return ProrlRollout("http://gw", instance_for=lambda _: dict(instance), sampling_params={"max_tokens": 8},
                        transport=fake.transport, **options)


#: a group of four: a real wrong answer (0.0 is a reward), an evaluator that fails once, a
#: rollout whose every attempt fails, a right answer
GROUP = {"tokens": 3, "rewards": [0.0, 1.0, 1.0, 1.0],
         "plan": [["ok"], ["eval_error", "ok"], ["env_error", "backend_error", "timeout"], ["ok"]]}


@pytest.mark.parametrize("on_invalid", ["resubmit", "drop"])
def test_an_invalid_reward_never_reaches_trl(on_invalid):
    fake = FakeGateway(planned)
    rollout = rollout_for(fake, GROUP, on_invalid=on_invalid, max_resubmits=2)
    try:
        out = rollout(["p"] * 4, trainer_at(0))
    finally:
        rollout.close()
    valid = [True, True, False, True] if on_invalid == "resubmit" else [True, False, False, True]
    assert out["reward_valid"] == valid
    # what TRL's reward function hands on: a number only for a valid reward, None (left out of
    # the group's baseline by TRL, advantage 0) otherwise, never a 0 for a failure
    assert service_reward(completions=["c"] * 4, **out) == [0.0, 1.0 if valid[1] else None, None, 1.0]
    for row, ok in enumerate(valid):
        assert rollout.results[row]["reward_valid"] is ok  # the last attempt, as TRL got it
        if not ok:  # a placeholder: one token, masked out, although the job had a trajectory
            assert out["env_mask"][row] == [0] and out["completion_ids"][row] == [0]
            assert rollout.results[row]["trajectory"]["response_ids"]
        else:
            assert out["env_mask"][row] == [1, 1, 1] and len(out["logprobs"][row]) == 3
    (timing,) = rollout.timings
    if on_invalid == "resubmit":
        assert out["outcome"] == ["ok", "ok", "timeout", "ok"]
        assert (timing.failed, timing.resubmitted) == (1, 3)
        assert timing.invalid == {"eval_error": 1, "env_error": 1, "backend_error": 1, "timeout": 1}
        assert sorted(j.rsplit("-", 1)[1] for j in fake.jobs if "-re" in j) == ["re1", "re1", "re2"]
    else:
        assert out["outcome"] == ["ok", "eval_error", "env_error", "ok"] and len(fake.jobs) == 4
        assert (timing.failed, timing.resubmitted, timing.invalid) == (2, 0, {"eval_error": 1, "env_error": 1})


def test_a_call_without_one_valid_reward_fails_loudly():
    fake = FakeGateway(planned)
    broken = {"tokens": 2, "rewards": [1.0, 1.0], "plan": [["env_error"], ["eval_error"]]}
    rollout = rollout_for(fake, broken, max_resubmits=1)
    try:
        with pytest.raises(RewardInvalid, match="not one of 2 rollouts has a valid reward") as caught:
            rollout(["p"] * 2, trainer_at(3))
    finally:
        rollout.close()
    assert caught.value.outcome is not None and caught.value.outcome.detail == "scripted eval_error"
    assert len(fake.jobs) == 4  # each resubmitted once before giving up


def test_the_first_step_records_policy_version_zero():
    fake = FakeGateway(planned)
    fake.backends.append(SERVER)  # registered, but nobody told the gateway which weights it holds
    ok = {"tokens": 2, "rewards": [1.0, 0.0], "plan": [["ok"], ["ok"]]}
    rollout = rollout_for(fake, ok, servers=[SERVER])
    try:
        first = rollout(["p"] * 2, trainer_at(0))
        again = rollout(["p"] * 2, trainer_at(0))  # e.g. gradient accumulation: the same step
    finally:
        rollout.close()
    assert first["policy_versions"] == again["policy_versions"] == [[0], [0]]
    assert fake.requests["POST /llm_servers/version"] == 1


def test_servers_the_gateway_does_not_know_are_refused_by_name():
    fake = FakeGateway(planned)
    rollout = rollout_for(fake, {"tokens": 1, "rewards": [1.0], "plan": [["ok"]]}, servers=[SERVER])
    try:
        with pytest.raises(BadRequest, match="register servers= with the gateway"):
            rollout(["p"], trainer_at(0))
    finally:
        rollout.close()
    assert not fake.jobs
