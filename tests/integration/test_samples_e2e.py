"""Several training samples from one rollout, through the service: an agent program in a
bubblewrap sandbox whose main conversation runs a sub-agent (a conversation of its own) and asks
a small model for a title, as Claude Code does. The result's samples are each exactly what the
backend saw and produced (its ``/_log``), and TRL's own ``GRPOTrainer`` receives both trained
samples as rows of the rollout's group (``ProrlRollout(samples_per_rollout=2)``, a tiny model on
CPU: no vLLM needed)."""
from __future__ import annotations

import pytest

from tests.support.agents import SUBAGENT_AGENT, SUBAGENT_RULES
from tests.support.endpoint import check_samples
from tests.support.services import rules_file, start_llm_server
from tests.support.trl_step import grpo_step_on_samples

# kept out of the default run's 10 minutes (CI's extended phase runs it every time)
pytestmark = [pytest.mark.extended, pytest.mark.timeout(300)]

INSTANCE = {"data_source": "agent", "command": "python3 agent.py", "task": "List the workspace.",
            "files": {"agent.py": SUBAGENT_AGENT, "a.txt": "x"},
            "evaluator": {"type": "command", "command": "grep -q 'holds a.txt' answer.txt"}}


@pytest.fixture(scope="module")
def samples_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("samples-llm"), "samples-llm",
                              rules=rules_file(SUBAGENT_RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(app_gateway, samples_llm):
    samples_llm.reset()
    assert app_gateway.post("/add_llm_server", json={"address": samples_llm.address()}).status_code == 200
    return app_gateway


def test_a_sub_agent_and_a_title_call_are_samples_each_exact(service, samples_llm):
    result = service.process(INSTANCE, timeout_s=120)
    assert (result["status"], result["reward"]) == ("completed", 1.0), (result["error"], result.get("eval"))
    trajectory = result["trajectory"]
    assert [(s["origin"], s["model"], s["num_turns"]) for s in trajectory["samples"]] == [
        ("auxiliary", "policy-small", 1), ("main", "policy", 2), ("subagent", "policy", 2)]
    assert [s["reward"] for s in trajectory["samples"]] == [1.0, 1.0, 1.0]
    assert trajectory["drift_events"] == [] and result["endpoint"]["drift_events"] == []
    check_samples(trajectory, samples_llm.log())
    assert trajectory["primary_sample"] == 1 and trajectory["prompt_ids"] == trajectory["samples"][1]["prompt_ids"]
    # the v1 dialect keeps its one-sample shape: the main agent's messages
    assert [m["role"] for m in result["messages"]] == ["system", "user", "assistant", "tool", "assistant"]


def test_trl_grpo_trainer_receives_the_main_and_the_sub_agent_sample(service, samples_llm, tmp_path):
    pytest.importorskip("trl", reason="TRL is the 'trl' extra")
    step = grpo_step_on_samples(service.cluster.gateway_url, INSTANCE, tmp_path / "trl",
                                prompt="List the workspace.", max_completion_length=256)
    out, result, logged = step.out, step.result, step.logged
    assert out["sample_origin"] == ["main", "subagent"] and out["service_reward"] == [1.0, 1.0]
    samples = {s["origin"]: s for s in result["trajectory"]["samples"]}
    for row, origin in enumerate(out["sample_origin"]):
        assert out["prompt_ids"][row] == samples[origin]["prompt_ids"]
        assert out["completion_ids"][row] == samples[origin]["response_ids"]
        assert out["env_mask"][row] == samples[origin]["response_mask"]
    check_samples(result["trajectory"], samples_llm.log())
    # TRL trained on both rows: its logged completion lengths are the two samples' model tokens
    lengths = [sum(samples[o]["response_mask"]) for o in ("main", "subagent")]
    assert logged["completions/mean_length"] == pytest.approx(sum(lengths) / 2)
    assert logged["completions/max_length"] == max(lengths) and logged["reward"] == 1.0
    assert step.timing.samples == 2 and step.timing.samples_left_out == 0


def test_the_dapo_collector_hands_over_every_sample(service, samples_llm):
    from prorl_celery.trainer import CollectorConfig, DAPOCollector, RolloutClient

    config = CollectorConfig(group_size=1, batch_groups=1, group_filter=lambda rewards: True, train_auxiliary=True)
    with RolloutClient(service.cluster.gateway_url) as client, DAPOCollector(client, [INSTANCE], config) as dapo:
        batch = dapo.next_batch()
    [rollout] = batch.rollouts
    assert [(s.origin, s.primary, s.reward) for s in batch.samples] == [
        ("main", True, 1.0), ("auxiliary", False, 1.0), ("subagent", False, 1.0)]
    assert rollout.samples == batch.samples
    check_samples(rollout.result["trajectory"], samples_llm.log())
