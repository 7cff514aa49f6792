"""Fork groups' pure logic: group ids (the gateway's check and the client's default), the conflict
rule of a repeated fork request, the shared prefix masked out of a fork's training samples, and
where the DAPO collector forks a filtered group."""
from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.errors import validation_message
from api.schemas import ForkRequest
from prorl_celery.core.forks import GROUP_ID_MAX, JOB_ID_MAX, MAX_FORKS, fork_job_id, is_group_id, new_group_id
from prorl_celery.core.status import JobStatus
from prorl_celery.dev.llm_server.engines import Rule
from prorl_celery.state.store import JobRecord
from prorl_celery.trainer import CollectorConfig, ForkPoint, Group, Rollout, before_last_turn, fork_point, samples_of
from prorl_celery.trainer import dapo_forks as forks
from prorl_celery.wire.derived import fork_conflict

# -- group ids -------------------------------------------------------------------------------------


def test_every_fork_of_a_valid_group_id_is_a_valid_job_id():
    longest = "g" * GROUP_ID_MAX
    assert is_group_id(longest) and not is_group_id(longest + "g")
    assert len(fork_job_id(longest, MAX_FORKS - 1)) == JOB_ID_MAX
    assert not is_group_id("") and not is_group_id("has space") and not is_group_id("slash/ed")


def test_a_fresh_group_id_names_its_source_when_it_fits():
    short = new_group_id("job-1", 3)
    assert short.startswith("job-1-fork3-") and is_group_id(short)
    assert new_group_id("job-1", 3) != short  # a fresh tag each time
    long = new_group_id("j" * 128, 3)  # no room for the source's id: still a valid one
    assert long.startswith("fork3-") and is_group_id(long)


@pytest.mark.parametrize("group_id", ["bad id", "x" * (GROUP_ID_MAX + 1), ""])
def test_a_malformed_group_id_is_refused_naming_the_field(group_id):
    with pytest.raises(ValidationError) as refused:
        ForkRequest.model_validate({"turn": 1, "count": 2, "group_id": group_id})
    message = validation_message(refused.value)
    assert message.startswith("group_id: ") and str(GROUP_ID_MAX) in message, message
    assert ForkRequest.model_validate({"turn": 1, "group_id": "ok.id:1-2_3"}).group_id == "ok.id:1-2_3"
    assert ForkRequest.model_validate({"turn": 1}).group_id is None


# -- the conflict rule of a repeated request ---------------------------------------------------------


def fork_record(job_id: str, **origin: Any) -> JobRecord:
    fields = {"kind": "fork", "of": "src", "turn": 2, "group": "g", "index": 0, "count": 3, **origin}
    return JobRecord(id=job_id, status=JobStatus.RUN, origin=fields)


def test_the_same_request_again_is_no_conflict():
    assert fork_conflict("g", {"of": "src", "turn": 2, "count": 3}, fork_record("g-0")) is None


@pytest.mark.parametrize(("wanted", "named"), [
    ({"of": "src", "turn": 1, "count": 3}, "turn 2 (this request: 1)"),
    ({"of": "src", "turn": 2, "count": 4}, "count 3 (this request: 4)"),
    ({"of": "other", "turn": 2, "count": 3}, "of 'src' (this request: 'other')"),
])
def test_another_request_under_the_group_id_names_what_differs(wanted, named):
    message = fork_conflict("g", wanted, fork_record("g-0"))
    assert message is not None and named in message and "group_id 'g'" in message, message


def test_a_job_that_is_no_fork_of_the_group_is_a_conflict():
    plain = JobRecord(id="g-0", status=JobStatus.COMPLETED)
    assert "is not one of its forks" in fork_conflict("g", {"of": "src", "turn": 2, "count": 3}, plain)
    elsewhere = fork_record("g-0", group="h")
    assert "is not one of its forks" in fork_conflict("g", {"of": "src", "turn": 2, "count": 3}, elsewhere)


# -- a fork's shared prefix is not trained on --------------------------------------------------------


def fork_result(shared_turns: int | None, *, samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Three turns: model [10, 11], tool [20, 21, 22], model [12, 13, 14], tool [23], model [15]."""
    turns = [{"output_start": 0, "output_len": 2, "sample": 0, "policy_version": 1},
             {"output_start": 5, "output_len": 3, "sample": 0, "policy_version": 1},
             {"output_start": 9, "output_len": 1, "sample": 0, "policy_version": 4}]
    trajectory: dict[str, Any] = {
        "prompt_ids": [1, 2, 3], "response_ids": [10, 11, 20, 21, 22, 12, 13, 14, 23, 15],
        "response_mask": [1, 1, 0, 0, 0, 1, 1, 1, 0, 1], "response_logprobs": [-0.5] * 10,
        "policy_versions": [1, 4], "num_turns": 3, "turns": turns}
    if samples is not None:
        trajectory.update(samples=samples, primary_sample=0)
    result = {"job_id": "g-1", "status": "completed", "outcome": "ok", "reward_valid": True, "reward": 1.0,
              "trajectory": trajectory}
    if shared_turns is not None:
        result["fork"] = {"of": "src", "turn": 2, "group": "g", "index": 1, "count": 2, "shared_turns": shared_turns}
    return result


def test_a_forks_shared_turns_are_masked_out_and_its_source_named():
    [sample] = samples_of(fork_result(2))
    assert sample.response_mask == [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]  # only turn 3 is its own
    assert (sample.fork_of, sample.fork_turn, sample.shared_tokens) == ("src", 2, 5)
    assert sample.response_ids == fork_result(2)["trajectory"]["response_ids"] and sample.trainable


def test_a_job_of_its_own_and_a_fork_that_started_again_keep_every_model_token():
    for result in (fork_result(None), fork_result(0)):
        [sample] = samples_of(result)
        assert sample.response_mask == [1, 1, 0, 0, 0, 1, 1, 1, 0, 1] and sample.shared_tokens == 0
    assert samples_of(fork_result(None))[0].fork_of is None


def test_a_fork_that_shares_every_turn_has_nothing_to_train():
    [sample] = samples_of(fork_result(3))
    assert not any(sample.response_mask) and sample.shared_tokens == 6 and not sample.trainable


def test_each_sample_loses_only_its_own_shared_turns():
    main = {"sample": 0, "origin": "main", "prompt_ids": [1], "response_ids": [10, 11, 12], "response_mask": [1, 1, 1],
            "response_logprobs": [-1.0] * 3, "num_turns": 2}
    sub = {"sample": 1, "origin": "subagent", "prompt_ids": [2], "response_ids": [30, 31], "response_mask": [1, 1],
           "response_logprobs": [-1.0] * 2, "num_turns": 1}
    result = fork_result(2, samples=[main, sub])
    # turn 1 was the main agent's, turn 2 the sub-agent's, turn 3 the main agent's again
    result["trajectory"]["turns"] = [{"output_start": 0, "output_len": 1, "sample": 0},
                                     {"output_start": 0, "output_len": 2, "sample": 1},
                                     {"output_start": 1, "output_len": 2, "sample": 0}]
    by_index = {s.index: s for s in samples_of(result)}
    assert by_index[0].response_mask == [0, 1, 1] and by_index[0].shared_tokens == 1
    assert by_index[1].response_mask == [0, 0] and by_index[1].shared_tokens == 2


# -- where the collector forks a filtered group ------------------------------------------------------


def member(index: int, turns: int, reward: float = 0.0) -> Rollout:
    result = {"trajectory": {"num_turns": turns}}
    return Rollout(f"job-{index}", 0, index, 1, status="completed", reward=reward, result=result)


def group_of(*members: Rollout) -> Group:
    return Group(0, "p0", {}, len(members), 1, rollouts={m.index: m for m in members})


def test_the_longest_member_is_forked_at_a_fraction_of_its_turns():
    group = group_of(member(0, 4), member(1, 8), member(2, 8))
    chosen, turn = fork_point(group, 0.5)
    assert (chosen.index, turn) == (1, 4)  # the most turns, the lowest index on ties
    assert fork_point(group, 0.0)[1] == 1  # at least one turn shared
    assert fork_point(group, 1.0)[1] == 7 == before_last_turn(group)[1]  # at least the last one sampled again
    assert fork_point(group_of(member(0, 1), member(1, 1)), 0.5) is None  # nothing to share


def test_a_function_chooses_where_to_fork():
    group = group_of(member(0, 3), member(1, 5))
    config = CollectorConfig(2, 1, fork_filtered=1, fork_at=lambda g: (g.rollouts[0], 2))
    assert forks.choose_fork(config, group) == (group.rollouts[0], 2)
    assert forks.choose_fork(CollectorConfig(2, 1, fork_filtered=1, fork_at=0.5), group)[1] == 2
    with pytest.raises(ValueError, match="fork_at"):
        CollectorConfig(2, 1, fork_at=1.5)
    with pytest.raises(ValueError, match="fork_filtered"):
        CollectorConfig(2, 1, fork_filtered=-1)
    with pytest.raises(ValueError, match=f"at most {MAX_FORKS} forks"):
        CollectorConfig(MAX_FORKS + 1, 1, fork_filtered=1)
    assert CollectorConfig(MAX_FORKS + 1, 1).fork_filtered == 0  # without forks, any group size


def test_a_forks_staleness_is_judged_by_its_own_turns():
    fork = Rollout("g-0", 0, 0, 1, policy_versions=[1, 4], shared_turns=2, result=fork_result(2))
    assert forks.trained_versions(fork) == [4]  # turns 1 and 2 (version 1) are the source's
    plain = Rollout("j-0", 0, 0, 1, policy_versions=[1, 4], result=fork_result(None))
    assert forks.trained_versions(plain) == [1, 4]


def test_a_fork_run_again_has_an_id_of_its_own_that_names_its_group():
    group = Group(3, "p", {}, 2, 1, fork=ForkPoint("src", 2, forks.group_id_of("run", 3)))
    first = forks.refork_group_id(group, 1, 1)
    group.reruns = 1
    rerun = forks.refork_group_id(group, 1, 1)
    assert first == "run-3-fork-1-1" and rerun == "run-3-fork-1-1-r1"
    assert forks.refork_group_of(forks.one_fork_job_id(rerun)) == rerun


def test_a_scripted_rule_can_answer_by_the_requests_seed():
    odd = Rule(match="x", replies=["a"], seed_mod=(2, 1))
    assert odd.takes_seed(3) and not odd.takes_seed(4) and not odd.takes_seed(None)
    assert Rule(match="x", replies=["a"]).takes_seed(None)
    with pytest.raises(ValidationError, match="seed_mod"):
        Rule(match="x", replies=["a"], seed_mod=(2, 2))
