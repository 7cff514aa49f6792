"""The DAPO collector: its policies against an in-memory gateway, then the issue's demonstrations
against the real service (gateway, workers, Redis) and a scripted LLM server."""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import itertools
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from prorl_celery.dev.local import LocalCluster
from prorl_celery.trainer.client import AsyncRolloutClient, GatewayUnavailable, RetryPolicy, RolloutClient
from prorl_celery.trainer.dapo import (
    AsyncDAPOCollector,
    DAPOCollector,
    Group,
    PromptsExhausted,
    RolloutsFailing,
    StepStats,
    not_all_equal,
)
from tests.support.fake_gateway import FAST, LOSE_REPLY, FakeGateway
from tests.support.services import rules_file, start_llm_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- in-memory gateway ---------------------------------------------------------------------------

def scripted(body: dict[str, Any]) -> tuple[str, float, float]:
    """``kind`` easy (all right), hard (all wrong) or mixed (odd rollouts right); per-rollout
    ``delays``, and how it ends (a status or an outcome class): ``statuses`` for the first
    attempt only (``-0`` ends the job id), ``always`` for every attempt. A rollout that does not
    end ``completed`` gets reward 0.0, as a server before outcomes gave it."""
    instance = body["instance"]
    index = int(instance["trajectory_id"].rsplit("-", 1)[1])
    reward = {"easy": 1.0, "hard": 0.0, "mixed": float(index % 2)}[instance["kind"]]
    delay = instance.get("delays", {}).get(str(index), instance.get("delay", 0.01))
    first_attempt = body["job_id"].endswith("-0")
    status = instance.get("statuses", {}).get(str(index), "completed") if first_attempt else "completed"
    status = instance.get("always", {}).get(str(index), status)
    return status, reward if status in ("completed", "ok") else 0.0, delay


def prompt(kind: str, **fields) -> dict[str, Any]:
    return {"data_source": "fake", "kind": kind, **fields}


def collector(fake: FakeGateway, prompts, retry: RetryPolicy = FAST, **options) -> AsyncDAPOCollector:
    client = AsyncRolloutClient("http://gw", retry=retry, poll_s=0.5, transport=fake.transport)
    return AsyncDAPOCollector(client, prompts, **options)


@pytest.mark.anyio
async def test_exactly_b_informative_groups_per_step_and_nothing_duplicated():
    fake = FakeGateway(scripted)
    kinds = itertools.cycle(["easy", "hard", "mixed", "hard", "mixed", "easy"])
    dapo = collector(fake, (prompt(k, instance_id=f"q{i}-{k}") for i, k in enumerate(kinds)),
                     group_size=4, batch_groups=3, max_in_flight=8)
    submitted = 0
    for step in (1, 2, 3):
        batch = await dapo.next_batch()
        assert batch.step == step and len(batch.groups) == batch.stats.informative == 3
        for group in batch.groups:
            assert group.prompt_id.endswith("mixed") and group.rewards == [0.0, 1.0, 0.0, 1.0]
            assert [r.index for r in group.ordered] == [0, 1, 2, 3]
            assert all(r.status == "completed" and r.result["instance_id"] == group.prompt_id for r in group.ordered)
        assert batch.stats.filtered >= 2 and batch.stats.wall_s > 0
        if step == 1:  # submission never runs more than N ahead of the results read
            assert batch.stats.submitted <= batch.stats.completed + 8
        submitted += batch.stats.submitted
    await dapo.aclose()
    assert len(fake.jobs) == submitted  # every submission made exactly one job
    assert set(fake.statuses()) <= {"completed", "cancelled"}


@pytest.mark.anyio
async def test_carry_over_is_tagged_and_hopeless_groups_are_cancelled():
    fake = FakeGateway(scripted)
    prompts = [prompt("mixed", instance_id="carry", delays={"2": 0.8, "3": 0.8}),
               prompt("mixed", instance_id="stuck", delay=60),
               prompt("mixed", instance_id="fast")]
    dapo = collector(fake, prompts, group_size=4, batch_groups=1, max_in_flight=12)
    first = await dapo.next_batch()
    assert [g.prompt_id for g in first.groups] == ["fast"]
    assert not any(r.carried_over for r in first.rollouts)
    stuck = sorted(j for j in fake.jobs if fake.jobs[j].body["instance"]["instance_id"] == "stuck")
    assert sorted(first.cancelled_job_ids) == stuck and first.stats.cancelled == 4
    assert all(fake.jobs[j].status == "cancelled" for j in stuck)
    assert (first.stats.carried_groups, first.stats.carried_over) == (1, 2)
    second = await dapo.next_batch()
    (carried,) = second.groups
    assert carried.prompt_id == "carry" and carried.rewards == [0.0, 1.0, 0.0, 1.0]
    assert {(r.step, r.batch_step, r.carried_over) for r in carried.ordered} == {(1, 2, True)}
    assert second.stats.carried_in == 2 and second.stats.submitted == 0
    with pytest.raises(PromptsExhausted):
        await dapo.next_batch()


@pytest.mark.anyio
async def test_no_carry_over_beyond_max_staleness():
    fake = FakeGateway(scripted)
    prompts = [prompt("mixed", instance_id="carry", delays={"2": 0.5, "3": 0.5}),
               prompt("mixed", instance_id="fast")]
    dapo = collector(fake, prompts, group_size=4, batch_groups=1, max_in_flight=8, max_staleness=0)
    batch = await dapo.next_batch()
    assert [g.prompt_id for g in batch.groups] == ["fast"]
    assert batch.stats.carried_groups == 0 and len(batch.cancelled_job_ids) == 2
    with pytest.raises(PromptsExhausted):
        await dapo.next_batch()


@pytest.mark.anyio
@pytest.mark.parametrize("ending", ["env_error", "eval_error", "cancelled", "failed"])  # cancelled by someone else
async def test_an_invalid_reward_is_resubmitted_never_scored(ending):
    fake = FakeGateway(scripted)
    # scored 0, flaky's failure would make its all-right group look informative
    prompts = [prompt("easy", instance_id="flaky", statuses={"1": ending}), prompt("mixed", instance_id="ok")]
    dapo = collector(fake, prompts, group_size=2, batch_groups=2, max_in_flight=4)
    batch = await dapo.next_batch()
    assert [g.prompt_id for g in batch.groups] == ["ok"] and batch.stats.filtered == 1
    outcome = "env_error" if ending == "failed" else ending
    assert batch.stats.resubmitted == {outcome: 1} and batch.stats.dropped == {}
    flaky = sorted(j for j in fake.jobs if fake.jobs[j].body["instance"]["instance_id"] == "flaky")
    assert [fake.jobs[j].outcome for j in flaky] == ["ok", outcome, "ok"]  # -0-0, -1-0, then -1-1


async def run_out(dapo: AsyncDAPOCollector) -> tuple[list[Group], list[StepStats]]:
    """Every batch until the prompts are used up: the groups and each step's stats."""
    groups, stats = [], []
    async for batch in dapo.batches():
        groups += batch.groups
        stats.append(batch.stats)
    return groups, stats


def per_class(stats: list[StepStats], field: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for step in stats:
        for kind, count in getattr(step, field).items():
            total[kind] = total.get(kind, 0) + count
    return total


@pytest.mark.anyio
@pytest.mark.parametrize("legacy", [False, True], ids=["outcomes", "older-server"])
async def test_rollouts_invalid_after_every_resubmission_are_dropped_from_rewards_and_batches(legacy):
    fake = FakeGateway(scripted)
    fake.legacy = legacy  # a server before outcomes: failed jobs have reward 0.0, and no reward_valid
    prompts = [prompt("easy", instance_id="broken", always={"2": "eval_error"}),
               prompt("mixed", instance_id="partial", always={"2": "backend_error"})]
    dapo = collector(fake, prompts, group_size=3, batch_groups=1, max_in_flight=6, max_resubmits=1)
    groups, stats = await run_out(dapo)
    # partial keeps its two valid rollouts; broken's two are all right, so not informative: its
    # invalid third, scored 0, would have made it so
    (partial,) = groups
    assert partial.prompt_id == "partial" and partial.rewards == [0.0, 1.0]
    assert [r.index for r in partial.ordered] == [0, 1] and list(partial.dropped) == [2]
    assert partial.dropped[2].job_id.endswith("-2-1") and partial.dropped[2].reward is None
    assert sum(s.filtered for s in stats) == 1 and sum(s.failed_groups for s in stats) == 0
    classes = {"eval_error": 1, "backend_error": 1} if not legacy else {"env_error": 2}
    assert per_class(stats, "resubmitted") == per_class(stats, "dropped") == classes
    assert len(fake.jobs) == 8  # 3 + 3 + one resubmission each


@pytest.mark.anyio
async def test_a_group_left_too_small_is_dropped_and_timeouts_are_resubmitted():
    fake = FakeGateway(scripted)
    # index 1 (the right answer) times out once: resubmitted, it completes the group
    dapo = collector(fake, [prompt("mixed", statuses={"1": "timeout"})], group_size=2, batch_groups=1)
    batch = await dapo.next_batch()
    (group,) = batch.groups
    assert group.rewards == [0.0, 1.0] and group.ordered[1].job_id.endswith("-1-1")
    assert batch.stats.resubmitted == {"timeout": 1} and group.ordered[1].outcome == "ok"
    # with no resubmission it is dropped, and one valid rollout is no group (the step ends with
    # "later", long after)
    once = collector(fake, [prompt("mixed", instance_id="cut", statuses={"1": "timeout"}),
                            prompt("mixed", instance_id="later", delay=0.3)],
                     group_size=2, batch_groups=1, max_resubmits=0)
    batch = await once.next_batch()
    assert [g.prompt_id for g in batch.groups] == ["later"]
    assert batch.stats.failed_groups == 1 and batch.stats.dropped == {"timeout": 1} and not batch.stats.resubmitted


@pytest.mark.anyio
async def test_a_broken_service_raises_instead_of_spinning():
    fake = FakeGateway(scripted)
    endless = itertools.repeat(prompt("mixed", always={"0": "failed", "1": "backend_error"}))
    dapo = collector(fake, endless, group_size=2, batch_groups=1, max_in_flight=4, max_failures_in_row=6)
    with pytest.raises(RolloutsFailing, match="7 rollouts in a row ended without a valid reward; last: job .* ended"):
        await dapo.next_batch()


@pytest.mark.anyio
async def test_lost_replies_and_outages_resume_by_job_id():
    fake = FakeGateway(scripted)
    kinds = itertools.cycle(["mixed", "hard"])
    faults = [LOSE_REPLY, httpx.ConnectError, 503, None, LOSE_REPLY, httpx.ReadError, LOSE_REPLY, None] * 3
    # concurrent requests draw from one fault list, so one request may meet every fault in a row
    # while the others take the successes: a budget above the number of faults can never run out
    budget = dataclasses.replace(FAST, attempts=sum(fault is not None for fault in faults) + 1)
    dapo = collector(fake, (prompt(k, delay=0.05) for k in kinds), retry=budget, group_size=2, batch_groups=4,
                     max_in_flight=4)
    fake.faults = faults
    batch = await dapo.next_batch()
    assert len(batch.groups) == 4 and not fake.faults
    await dapo.aclose()
    assert len(fake.jobs) == batch.stats.submitted  # a lost reply never made a second job


@pytest.mark.anyio
async def test_an_outage_beyond_the_retry_budget_raises_and_the_retried_step_keeps_everything():
    def script(body):
        if body["instance"]["instance_id"] == "b":  # the gateway dies while b's rollouts run (0.8 s:
            # their stream is cut, and its reconnections find it gone)
            asyncio.get_running_loop().call_later(0.05, fake.down.add, "gw")
        return scripted(body)

    fake = FakeGateway(script)
    prompts = [prompt("mixed", instance_id="a"), prompt("mixed", instance_id="b", delay=0.8)]
    dapo = collector(fake, prompts, group_size=2, batch_groups=2, max_in_flight=2)
    with pytest.raises(GatewayUnavailable):
        await dapo.next_batch()
    fake.down.clear()
    batch = await dapo.next_batch()
    assert batch.step == 1 and sorted(g.prompt_id for g in batch.groups) == ["a", "b"]
    assert len(fake.jobs) == batch.stats.submitted == 4  # b's rollouts were watched again, not resubmitted


@pytest.mark.anyio
async def test_exhausted_stream_and_step_timeout_return_what_there_is():
    fake = FakeGateway(scripted)
    dapo = collector(fake, [prompt("mixed"), prompt("easy")], group_size=2, batch_groups=3)
    partial = await dapo.next_batch()
    assert len(partial.groups) == 1 and partial.stats.filtered == 1
    with pytest.raises(PromptsExhausted):
        await dapo.next_batch()
    slow = collector(fake, itertools.repeat(prompt("mixed", delay=60)), group_size=2, batch_groups=1,
                     max_in_flight=4, step_timeout_s=0.3, carry_over=False)
    empty = await slow.next_batch()
    assert empty.groups == [] and empty.stats.submitted == 4 and empty.stats.cancelled == 4


@pytest.mark.anyio
async def test_custom_filter_request_and_busy_probe():
    fake = FakeGateway(scripted)
    ticks = itertools.count()

    def request(group, index):  # the mixed pattern flips with the index offset
        instance = {**group.instance, "trajectory_id": f"x-{index + 1}"}
        return {"instance": instance, "sampling_params": {"seed": index}}

    dapo = collector(fake, [prompt("mixed"), prompt("easy")], group_size=2, batch_groups=1,
                     group_filter=lambda rewards: sum(rewards) == len(rewards), make_request=request,
                     busy_probe=lambda: float(next(ticks)))
    batch = await dapo.next_batch()
    (group,) = batch.groups
    assert group.rewards == [1.0, 1.0] and group.instance["kind"] == "easy"
    assert {r.result["trajectory_id"] for r in group.ordered} == {"x-1", "x-2"}
    assert batch.stats.busy_fraction == pytest.approx(1 / batch.stats.wall_s)
    assert not_all_equal([1, 0]) and not not_all_equal([1, 1]) and not not_all_equal([0.5])


@pytest.mark.anyio
async def test_rollouts_older_than_max_policy_lag_run_again():
    def script(body):
        if "-r" in body["job_id"]:  # the backends serve the pushed weights by the time a rerun arrives
            fake.policy_version = 2
        return scripted(body)

    fake = FakeGateway(script)
    fake.policy_version = 0
    dapo = collector(fake, itertools.repeat(prompt("mixed", delay=0.05)), group_size=2, batch_groups=1,
                     max_in_flight=2, max_policy_lag=1)
    first = await dapo.next_batch()
    assert first.stats.stale_rollouts == 0 and [r.policy_versions for r in first.rollouts] == [[0], [0]]

    dapo.set_policy_version(2)  # the trainer pushed two updates; the backends still serve version 0
    second = await dapo.next_batch()
    # both rollouts of the step came from version 0, two behind: each ran again, on version 2
    assert second.stats.stale_rollouts == 2 and [r.policy_versions for r in second.rollouts] == [[2], [2]]
    reruns = [job_id for job_id in fake.jobs if "-r" in job_id]
    assert len(reruns) == 2 and len(set(reruns)) == 2 and {r.job_id for r in second.rollouts} == set(reruns)


# -- the real service ----------------------------------------------------------------------------

def load_example():
    spec = importlib.util.spec_from_file_location("train_loop", ROOT / "examples" / "train_loop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_loop = load_example()

#: how long LATE's marks 2 and 3 take to reply. The carry-over step ends when mixed-2 completes,
#: after easy, hard and both mixed groups have gone through the 2 RUN slots (of the test
#: cluster's 8) that stuck and late leave free: 6.4-8.7 s measured on a loaded 2-core machine.
#: LATE must reply well after that: at 8 s it sometimes completed first and was batched.
LATE_S = 20.0

#: right when the rollout mark is even ("#r0", "#r2"), wrong when odd; EASY always right, HARD
#: never; STUCK, LATE (marks 2 and 3), MIXED and PAUSE reply after a delay. The scripted server
#: matches on the whole prompt; the example training loop's rules come first.
RULES = train_loop.scripted_rules() + [
    {"match": "STUCK", "replies": ["\\boxed{1}"], "delay_s": 60, "scope": "prompt"},
    {"match": "LATE.*#r[23]", "replies": ["\\boxed{1}"], "delay_s": LATE_S, "scope": "prompt"},
    {"match": "MIXED.*#r[02468]", "replies": ["\\boxed{1}"], "delay_s": 0.5, "scope": "prompt"},
    {"match": "MIXED", "replies": ["\\boxed{2}"], "delay_s": 0.5, "scope": "prompt"},
    {"match": "PAUSE.*#r[02468]", "replies": ["\\boxed{1}"], "delay_s": 1.5, "scope": "prompt"},
    {"match": "PAUSE", "replies": ["\\boxed{2}"], "delay_s": 1.5, "scope": "prompt"},
    {"match": "EASY", "replies": ["\\boxed{1}"], "scope": "prompt"},
    {"match": "HARD", "replies": ["\\boxed{2}"], "scope": "prompt"},
    {"match": "#r[02468]\\b", "replies": ["So \\boxed{1}."], "scope": "prompt"},
    {"match": "#r[13579]\\b", "replies": ["So \\boxed{2}."], "scope": "prompt"},
]


def mark_rollout(group, index: int) -> dict[str, Any]:
    """Each rollout of a prompt sees its own mark, so the scripted answers differ within a group."""
    instance = {**group.instance, "problem": f"{group.instance['problem']} #r{index}",
                "instance_id": group.prompt_id, "trajectory_id": f"{group.prompt_id}-{index}"}
    return {"instance": instance, "sampling_params": {"max_tokens": 32}}


def math_prompt(name: str, tag: str) -> dict[str, Any]:
    return {"data_source": "math", "instance_id": name, "problem": f"{tag}: what is 3 - 2?", "answer": "1"}


@pytest.fixture(scope="module")
def scripted_backend(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("dapo-llm"), "dapo-llm",
                              rules=rules_file(RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(gateway, scripted_backend):
    gateway.post("/add_llm_server", json={"address": scripted_backend.address()}).raise_for_status()
    gateway.cluster_backend = scripted_backend.address()
    return gateway


def job_status(service, job_id: str) -> str:
    return service.get(f"/jobs/{job_id}").json()["status"]


# ~20 s by construction (late's rollouts reply LATE_S after the step began): the default run keeps
# these policies against the in-memory gateway above and the real service's two other tests;
# CI runs this one with -m extended
@pytest.mark.extended
def test_real_service_b_informative_groups_cancel_and_carry_over(service):
    prompts = [math_prompt("late", "LATE"), math_prompt("stuck", "STUCK"), math_prompt("easy", "EASY"),
               math_prompt("hard", "HARD"), math_prompt("mixed-1", "MIXED"), math_prompt("mixed-2", "MIXED")]
    with RolloutClient(service.cluster.gateway_url, poll_s=5) as client, \
            DAPOCollector(client, prompts, group_size=4, batch_groups=2, max_in_flight=24,
                          make_request=mark_rollout) as dapo:
        first = dapo.next_batch()
        # the collector batches the first two informative groups to complete; which ones those
        # are is the service's timing: late's can only complete LATE_S after the step began
        assert first.stats.wall_s < LATE_S, f"the service took {first.stats.wall_s:.1f} s for the " \
            "quick groups: late's slow rollouts may have ended first (raise LATE_S)"
        assert sorted(g.prompt_id for g in first.groups) == ["mixed-1", "mixed-2"]
        assert all(g.rewards == [1.0, 0.0, 1.0, 0.0] for g in first.groups)
        # easy and hard are dropped once complete: usually before the cut, but the 24 submits
        # race, so on a loaded machine one may still be running and is carried into step 2
        unfinished_uninformative = 2 - first.stats.filtered
        # "stuck" had no result: cancelled, in the service too; "late" is half done and proven
        assert len(first.cancelled_job_ids) == 4 and first.stats.cancelled == 4
        assert {service.get(f"/jobs/{j}").json()["instance_id"] for j in first.cancelled_job_ids} == {"stuck"}
        assert {job_status(service, j) for j in first.cancelled_job_ids} == {"cancelled"}
        assert first.stats.carried_groups == 1 + unfinished_uninformative
        if unfinished_uninformative == 0:
            assert first.stats.carried_over == 2  # late's two quick rollouts
        old_generation = first.rollouts[0].generation
        # a weight update: the backend is registered again, under a new generation
        assert client.clear_llm_servers() == old_generation + 1
        client.add_llm_server(service.cluster_backend)
        second = dapo.next_batch()
        (late,) = second.groups
        assert late.prompt_id == "late" and late.rewards == [1.0, 0.0, 1.0, 1.0]
        assert first.stats.filtered + second.stats.filtered == 2  # easy and hard, dropped
        assert all(r.step == 1 and r.batch_step == 2 and r.carried_over for r in late.ordered)
        assert {r.generation for r in late.ordered} == {old_generation}  # produced before the update
        with pytest.raises(PromptsExhausted):
            dapo.next_batch()
    counts = service.get("/status").json()["jobs"]
    assert (counts["completed"], counts["cancelled"]) == (20, 4)  # 24 jobs: none ran twice


def restart_gateway(cluster: LocalCluster) -> None:
    """Kill the gateway (SIGKILL, no graceful drain); clients see refused connections for 1 s."""
    cluster.restart_gateway(kill=True, down_s=1.0)


def test_real_service_gateway_restart_mid_step_loses_nothing(service):
    cluster = service.cluster
    prompts = [math_prompt(f"pause-{i}", "PAUSE") for i in range(6)]
    retry = RetryPolicy(attempts=60, backoff_s=0.1, max_backoff_s=1.0, deadline_s=90)
    with RolloutClient(cluster.gateway_url, retry=retry, poll_s=5) as client, \
            DAPOCollector(client, prompts, group_size=2, batch_groups=5, max_in_flight=4,
                          make_request=mark_rollout) as dapo:
        restarter = threading.Timer(0.8, restart_gateway, args=(cluster,))
        restarter.start()
        try:
            batch = dapo.next_batch()
        finally:
            restarter.join()
        assert client.aio.retried > 0  # the step really ran into the dead gateway
        assert len(batch.groups) == 5 and all(g.rewards == [1.0, 0.0] for g in batch.groups)
        assert all(r.status == "completed" for r in batch.rollouts)
    jobs = service.get("/status").json()["jobs"]
    # every job once (a retried submit found its job), none left behind: completed or cancelled
    assert sum(jobs.values()) == batch.stats.submitted == jobs["completed"] + jobs["cancelled"]
    assert jobs["completed"] >= 10


def test_example_training_loop_runs(service, scripted_backend):
    history = train_loop.train([service.cluster.gateway_url], scripted_backend.address(), steps=2,
                               group_size=2, batch_groups=2, update_s=0, log=lambda line: None)
    assert [h["step"] for h in history] == [1, 2] and all(h["informative"] == 2 for h in history)
    assert history[1]["generation"] == history[0]["generation"] + 1  # re-registered after each update
    assert all(h["tokens"] > 0 and h["mean_abs_advantage"] > 0 for h in history)
