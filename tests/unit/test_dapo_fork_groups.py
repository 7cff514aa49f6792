"""The DAPO collector's fork groups against the in-memory gateway (``tests/support/fake_gateway.py``,
whose ``POST /jobs/<id>/fork`` is idempotent under ``group_id`` as the real one is): a filtered
group sampled again by forking, the bound on doing it again, a ``ForkOf`` in the prompt stream, and
the fault paths (a lost reply, a refused fork, an invalid reward in a fork group, an old prefix).
The same against the real service: ``tests/integration/test_fork_groups_service.py``."""
from __future__ import annotations

from typing import Any

import pytest

from prorl_celery.trainer import ForkOf, ForkPoint
from prorl_celery.trainer.client import GatewayUnavailable
from prorl_celery.trainer.dapo import AsyncDAPOCollector
from tests.support.fake_gateway import LOSE_REPLY, FakeGateway, fake_client


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def script(body: dict[str, Any]) -> tuple[str, float, float]:
    """A fresh rollout's reward is ``rewards[i]``, a fork's ``fork_rewards[slot]`` (its index in its
    group; a fork run again keeps its slot's); a job id in ``fail`` ends env_error."""
    instance = body["instance"]
    delay = float(instance.get("delay", 0.01))
    if body["job_id"] in instance.get("fail", ()):
        return "env_error", 0.0, delay
    if "fork" not in body:
        index = int(str(instance["trajectory_id"]).rsplit("-", 1)[1])
        return "completed", float(instance["rewards"][index]), delay
    # the collector's fork ids are <run>-<key>-fork-<slot>[-<n>-0]
    slot = int(body["job_id"].split("-fork-", 1)[1].split("-")[0]) if "-fork-" in body["job_id"] \
        else body["fork"]["index"]
    return "completed", float(instance["fork_rewards"][slot]), delay


def prompt(name: str, rewards: list[float], fork_rewards: list[float] | None = None, **fields: Any) -> dict[str, Any]:
    """Four model turns of one token each (``tokens``: so each rollout has a sample to mask)."""
    return {"data_source": "fake", "instance_id": name, "rewards": rewards, "fork_rewards": fork_rewards or rewards,
            "turns": 4, "tokens": 4, **fields}


def collector(fake: FakeGateway, prompts, **options) -> AsyncDAPOCollector:
    return AsyncDAPOCollector(fake_client(fake, poll_s=0.5), prompts, run_id="r", **options)


async def source_job(fake: FakeGateway, **fields: Any) -> str:
    """A finished job of the in-memory gateway to fork (``ForkOf``)."""
    client = fake_client(fake)
    job_id = await client.submit({**prompt("src", [0.0], **fields), "trajectory_id": "src-0"}, job_id="src")
    assert (await client.wait(job_id))["status"] == "completed"
    return job_id


@pytest.mark.anyio
async def test_a_filtered_group_is_sampled_again_by_forking_a_member():
    fake = FakeGateway(script)
    dapo = collector(fake, [prompt("q", [0.0, 0.0], fork_rewards=[1.0, 0.0])], group_size=2, batch_groups=1,
                     fork_filtered=1)
    batch = await dapo.next_batch()
    (group,) = batch.groups
    # the all-wrong group of q is filtered, and forked from its member 0 at half its 4 turns
    assert group.prompt_id == "q" and group.fork == ForkPoint("r-0-0-0", 2, "r-1-fork", parent=0)
    assert group.rewards == [1.0, 0.0] and [r.job_id for r in group.ordered] == ["r-1-fork-0", "r-1-fork-1"]
    assert all((r.fork_of, r.fork_turn, r.shared_turns) == ("r-0-0-0", 2, 2) for r in group.ordered)
    # the trainer gets each fork's own turns only: the two shared tokens are masked out
    assert [s.response_mask for s in batch.samples] == [[0, 0, 1, 1]] * 2
    assert all((s.fork_of, s.fork_turn, s.shared_tokens) == ("r-0-0-0", 2, 2) for s in batch.samples)
    stats = batch.stats
    assert (stats.filtered, stats.forked, stats.submitted, stats.informative) == (1, 1, 4, 1)
    assert fake.requests["POST /jobs/<id>/fork"] == 1 and len(fake.jobs) == 4


@pytest.mark.anyio
async def test_a_group_is_forked_again_at_most_fork_filtered_times():
    fake = FakeGateway(script)
    # "same" stays all wrong however it is forked; "late" ends the step once the forks are done
    prompts = [prompt("same", [0.0, 0.0]), prompt("late", [0.0, 1.0], delay=1.0)]
    dapo = collector(fake, prompts, group_size=2, batch_groups=1, fork_filtered=2)
    batch = await dapo.next_batch()
    assert [g.prompt_id for g in batch.groups] == ["late"]
    assert (batch.stats.filtered, batch.stats.forked) == (3, 2)  # same, its fork, its fork's fork
    forked = [job for job in fake.jobs.values() if "fork" in job.body]
    assert sorted({job.body["fork"]["of"] for job in forked}) == ["r-0-0-0", "r-2-fork-0"]  # a fork of a fork
    assert fake.requests["POST /jobs/<id>/fork"] == 2 and len(fake.jobs) == 8


@pytest.mark.anyio
async def test_a_fork_of_the_prompt_stream_is_a_group_like_any_other():
    fake = FakeGateway(script)
    source = await source_job(fake, fork_rewards=[0.0, 1.0, 1.0])
    dapo = collector(fake, [ForkOf(source, 3, prompt_id="tree")], group_size=3, batch_groups=1)
    batch = await dapo.next_batch()
    (group,) = batch.groups
    assert group.prompt_id == "tree" and group.fork == ForkPoint("src", 3, "r-0-fork")
    assert group.rewards == [0.0, 1.0, 1.0] and all(r.shared_turns == 3 for r in group.ordered)
    with pytest.raises(Exception, match="prompt stream ended"):
        await dapo.next_batch()


@pytest.mark.anyio
async def test_a_lost_fork_reply_and_a_step_run_again_never_double_a_group():
    fake = FakeGateway(script)
    source = await source_job(fake, fork_rewards=[0.0, 1.0])
    dapo = collector(fake, [ForkOf(source, 2)], group_size=2, batch_groups=1)
    fake.faults = [LOSE_REPLY] * 6  # every attempt of the client is served, and its reply lost
    with pytest.raises(GatewayUnavailable):
        await dapo.next_batch()
    batch = await dapo.next_batch()  # the step again: the same fork request, under the same group id
    assert batch.step == 1 and batch.groups[0].rewards == [0.0, 1.0]
    assert fake.requests["POST /jobs/<id>/fork"] == 7
    assert sorted(j for j in fake.jobs if j != "src") == ["r-0-fork-0", "r-0-fork-1"]  # one set


@pytest.mark.anyio
async def test_a_refused_fork_drops_its_group_and_the_step_goes_on():
    fake = FakeGateway(script)
    dapo = collector(fake, [ForkOf("no-such-job", 1), prompt("q", [0.0, 1.0])], group_size=2, batch_groups=1)
    batch = await dapo.next_batch()
    assert [g.prompt_id for g in batch.groups] == ["q"] and batch.stats.failed_groups == 1
    assert not any("fork" in job.body for job in fake.jobs.values())


@pytest.mark.anyio
async def test_an_invalid_reward_in_a_fork_group_is_forked_again_never_run_from_zero():
    fake = FakeGateway(script)
    source = await source_job(fake, fork_rewards=[1.0, 0.0], fail=["r-0-fork-1"])
    dapo = collector(fake, [ForkOf(source, 2)], group_size=2, batch_groups=1)
    batch = await dapo.next_batch()
    (group,) = batch.groups
    assert group.rewards == [1.0, 0.0] and batch.stats.resubmitted == {"env_error": 1}
    again = group.ordered[1]
    assert again.job_id == "r-0-fork-1-1-0" and (again.fork_of, again.shared_turns) == ("src", 2)
    assert fake.jobs[again.job_id].body["fork"]["of"] == "src"
    assert fake.requests["POST /jobs"] == 1  # the source's: nothing was submitted from zero


@pytest.mark.anyio
async def test_a_fork_is_judged_stale_by_its_own_turns_not_its_sources():
    fake = FakeGateway(script)
    fake.policy_version = 0
    source = await source_job(fake, fork_rewards=[0.0, 1.0])
    fake.policy_version = 5  # new weights since the source ran
    dapo = collector(fake, [ForkOf(source, 2)], group_size=2, batch_groups=1, max_policy_lag=1, step_timeout_s=5)
    dapo.set_policy_version(5)
    batch = await dapo.next_batch()
    (group,) = batch.groups
    # the shared turns came from version 0, which is masked out: the forks' own turns are fresh
    assert batch.stats.stale_rollouts == 0 and all(r.policy_versions == [0, 5] for r in group.ordered)
