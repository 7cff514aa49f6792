"""Several training samples per rollout, on the trainer's side: ``samples_of`` (order, rewards,
auxiliary calls), the result's per-sample rewards, and TRL's rows (``samples_per_rollout``)."""
from __future__ import annotations

from typing import Any

import pytest

from prorl_celery.trainer import samples_of
from prorl_celery.trainer.integrations.trl import ProrlRollout
from prorl_celery.wire.results import with_sample_rewards


def sample(index: int, origin: str, model: str = "policy", n: int = 2, **extra: Any) -> dict[str, Any]:
    return {"sample": index, "origin": origin, "model": model, "parent": extra.pop("parent", None),
            "prompt_ids": [100 + index] * 3, "response_ids": [index] * n, "response_mask": [1] * n,
            "response_logprobs": [-0.5] * n, "policy_versions": [7], "num_turns": 1, **extra}


def result(samples: list[dict[str, Any]] | None, reward: float | None = 1.0, primary: int = 0,
           job_id: str = "job-1") -> dict[str, Any]:
    trajectory: dict[str, Any] = {"prompt_ids": [9, 9], "response_ids": [5, 6, 7], "response_mask": [1, 0, 1],
                                  "response_logprobs": [-1.0, 0.0, -2.0], "policy_versions": [3], "turns": [{}, {}]}
    if samples is not None:
        trajectory.update(samples=samples, primary_sample=primary)
    return {"job_id": job_id, "status": "completed", "outcome": "ok", "reward_valid": reward is not None,
            "reward": reward, "trajectory": trajectory}


SUBAGENT_RUN = [sample(0, "auxiliary", model="policy-small"), sample(1, "main", n=4), sample(2, "subagent", n=3),
                sample(3, "rewrite", parent=1, n=5)]


def test_a_trajectory_without_samples_is_one_sample():
    [only] = samples_of(result(None, 0.5))
    assert (only.origin, only.primary, only.reward) == ("main", True, 0.5)
    assert (only.prompt_ids, only.response_ids, only.response_mask) == ([9, 9], [5, 6, 7], [1, 0, 1])
    assert only.policy_versions == [3] and only.num_turns == 2 and only.trainable


def test_samples_come_primary_first_without_auxiliary_calls_unless_asked():
    ordered = samples_of(result(SUBAGENT_RUN, primary=3))
    assert [(s.index, s.origin, s.primary) for s in ordered] == [
        (3, "rewrite", True), (1, "main", False), (2, "subagent", False)]
    assert all(s.reward == 1.0 for s in ordered)
    assert [s.index for s in samples_of(result(SUBAGENT_RUN, primary=3), include_auxiliary=True)] == [3, 0, 1, 2]
    empty = [*SUBAGENT_RUN, sample(4, "subagent", n=0)]  # a call that failed before its reply
    assert [s.index for s in samples_of(result(empty, primary=3))] == [3, 1, 2]


def test_a_reward_that_is_not_valid_is_no_samples_reward():
    samples = samples_of(result([{**s, "reward": 1.0} for s in SUBAGENT_RUN], reward=None, primary=1))
    assert samples and all(s.reward is None and not s.trainable for s in samples)


def test_the_result_gives_each_sample_its_handlers_reward_or_the_rollouts():
    trajectory = result(SUBAGENT_RUN)["trajectory"]
    rewarded = with_sample_rewards(trajectory, 1.0, {"sample_rewards": {"2": 0.25}})
    assert [s["reward"] for s in rewarded["samples"]] == [1.0, 1.0, 0.25, 1.0]
    assert "reward" not in trajectory["samples"][0]  # the record as stored is left alone
    assert [s["reward"] for s in with_sample_rewards(trajectory, None, {})["samples"]] == [None] * 4
    one = result(None)["trajectory"]
    assert with_sample_rewards(one, 1.0, {}) is one
    by_sample = {s.index: s.reward for s in samples_of({**result(SUBAGENT_RUN, primary=1), "trajectory": rewarded})}
    assert by_sample == {1: 1.0, 2: 0.25, 3: 1.0}


def test_trl_rows_are_the_samples_of_each_rollout_padded_to_samples_per_rollout():
    results = [result(SUBAGENT_RUN, primary=3, job_id="a"), result(None, 0.0, job_id="b"),
               result(None, None, job_id="c")]
    out = ProrlRollout.to_trl(results, eos_id=2, samples_per_rollout=2)
    assert out["job_id"] == ["a", "a", "b", "b", "c", "c"]
    assert out["sample_origin"] == ["rewrite", "main", "main", None, None, None]
    assert out["completion_ids"][:3] == [[3] * 5, [1] * 4, [5, 6, 7]]
    assert out["prompt_ids"][1] == [101, 101, 101] and out["env_mask"][2] == [1, 0, 1]
    assert out["service_reward"] == [1.0, 1.0, 0.0, None, None, None]
    assert out["reward_valid"] == [True, True, True, False, False, False]
    assert out["completion_ids"][3] == [2] and out["env_mask"][3] == [0] and out["logprobs"][3] == [0.0]
    assert out["prompt_ids"][4] == [9, 9]  # an invalid rollout's first row keeps its prompt, as before
    # one row per rollout: the main agent's latest sample, the trajectory's top level before samples
    one = ProrlRollout.to_trl(results[:1], samples_per_rollout=1)
    assert one["sample_origin"] == ["rewrite"] and one["completion_ids"] == [[3] * 5]
    aux = ProrlRollout.to_trl(results[:1], samples_per_rollout=4, train_auxiliary=True)
    assert aux["sample_origin"] == ["rewrite", "auxiliary", "main", "subagent"]


def test_trl_runs_one_job_per_samples_per_rollout_rows():
    rollout = ProrlRollout("http://gw", instance_for=lambda prompt: {"p": prompt}, samples_per_rollout=2)
    try:
        requests = rollout.requests(["x"] * 4 + ["y"] * 2, {"max_tokens": 8})
        assert [(r.instance["p"], r.instance["trajectory_id"]) for r in requests] == [("x", 0), ("x", 1), ("y", 0)]
        with pytest.raises(ValueError, match="multiple"):
            rollout.requests(["x"] * 3, {})
    finally:
        rollout.close()
    with pytest.raises(ValueError, match="text path"):
        ProrlRollout("http://gw", samples_per_rollout=2, path="text", text_tokenizer=object())


def test_a_handlers_sample_rewards_are_kept_with_its_judgement():
    from handlers import EvalResult
    from prorl_celery.worker.pipeline import _eval_details

    plain = EvalResult(1.0, {"resolved": True})
    assert _eval_details(plain) == {"resolved": True}
    own = _eval_details(EvalResult(1.0, {"resolved": True}, sample_rewards={2: 0}))
    assert own == {"resolved": True, "sample_rewards": {"2": 0.0}}
    rewarded = with_sample_rewards(result(SUBAGENT_RUN)["trajectory"], 1.0, own)
    assert [s["reward"] for s in rewarded["samples"]] == [1.0, 1.0, 0.0, 1.0]
