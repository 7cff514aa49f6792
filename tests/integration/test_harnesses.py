"""The real agent harnesses (Claude Code, Codex, OpenCode from npm: scripts/install_harnesses.sh)
run unchanged in a bubblewrap sandbox, configured by the ``agent`` handler, against the job's
endpoint (Anthropic Messages, OpenAI Responses, chat), driven by a scripted LLM server that
answers in the Qwen3 template's tool-call format. Each solves ``prorl-swe__romanum-14`` (reward 1
from the hidden tests), and every training sample's ids are exactly what the backend saw and
produced (its ``/_log``). The Claude Code run with a sub-agent is in the default run; the others,
and TRL's GRPOTrainer on Claude Code's two samples (a 12k-id prompt on CPU), in the extended one."""
from __future__ import annotations

import json

import pytest

from tests.support.agents import ROMANUM_ID
from tests.support.endpoint import check_samples
from tests.support.harnesses import DELEGATE, HARNESS_RULES, require_harness
from tests.support.services import rules_file, start_llm_server
from tests.support.swe import ROMANUM
from tests.support.trl_step import grpo_step_on_samples

pytestmark = [pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def harness_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("harness-llm"), "harness-llm",
                              rules=rules_file(HARNESS_RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(app_gateway, harness_llm):
    harness_llm.reset()
    assert app_gateway.post("/add_llm_server", json={"address": harness_llm.address()}).status_code == 200
    return app_gateway


def as_samples(trajectory: dict) -> dict:
    """The trajectory with ``samples`` even when it has one (the top level is that one)."""
    if trajectory.get("samples"):
        return trajectory
    return {**trajectory, "samples": [{**trajectory, "sample": 0, "origin": "main",
                                       "num_turns": len(trajectory["turns"])}]}


def solve(service, harness_llm, agent: str, **instance) -> tuple[dict, dict]:
    require_harness(agent)
    result = service.process({"data_source": "agent", "agent": agent, "swe": ROMANUM_ID, "max_iterations": 12,
                              **instance}, timeout_s=300)
    detail = (result["error"], result.get("detail"), (result.get("run_result") or {}).get("program"),
              result.get("endpoint"))
    assert (result["status"], result["reward"]) == ("completed", 1.0), detail
    assert '+    (900, "CM"),' in result["git_patch"]
    trajectory = as_samples(result["trajectory"])
    check_samples(trajectory, harness_llm.log())
    assert result["endpoint"]["drifted_tokens"] == 0, result["endpoint"]["drift_events"]
    print(agent.upper(), json.dumps({"timing": result["timing"], "calls": result["endpoint"]["calls"],
                                     "samples": [(s["origin"], s["num_turns"], len(s["prompt_ids"]))
                                                 for s in trajectory["samples"]]}))
    return result, trajectory


@pytest.mark.extended
def test_claude_code_fixes_romanum(service, harness_llm):
    result, trajectory = solve(service, harness_llm, "claude-code")
    assert result["endpoint"]["calls"] >= 2
    assert trajectory["samples"][trajectory.get("primary_sample", 0)]["origin"] == "main"


@pytest.mark.extended  # kept out of the default run's 10 minutes (CI's extended phase runs it every time)
def test_claude_code_task_tool_gives_a_sample_per_agent(service, harness_llm):
    result, trajectory = solve(service, harness_llm, "claude-code", task=DELEGATE + ROMANUM["problem_statement"])
    origins = [s["origin"] for s in trajectory["samples"]]
    assert "main" in origins and "subagent" in origins, origins
    sub = next(s for s in trajectory["samples"] if s["origin"] == "subagent")
    assert sub["num_turns"] == 2 and "SUBTASK-900" in json.dumps(sub["messages"])


@pytest.mark.extended
def test_codex_fixes_romanum(service, harness_llm):
    result, trajectory = solve(service, harness_llm, "codex")
    assert [s["origin"] for s in trajectory["samples"]] == ["main"]


@pytest.mark.extended
def test_opencode_fixes_romanum(service, harness_llm):
    result, trajectory = solve(service, harness_llm, "opencode")
    origins = [s["origin"] for s in trajectory["samples"]]
    assert origins.count("main") == 1 and "auxiliary" in origins, origins  # its title, by the small model


@pytest.mark.extended
@pytest.mark.timeout(1500)
def test_trl_grpo_trainer_receives_both_claude_code_samples(service, harness_llm, tmp_path):
    """TRL's own GRPOTrainer (a tiny model on CPU: no vLLM) with ``ProrlRollout`` as its
    rollout_func: one Claude Code rollout fills the group's two rows, the main agent's sample and
    the sub-agent's, each exactly the ids the backend saw and produced."""
    require_harness("claude-code")
    pytest.importorskip("trl", reason="TRL is the 'trl' extra")
    instance = {"data_source": "agent", "agent": "claude-code", "swe": ROMANUM_ID, "max_iterations": 12,
                "task": DELEGATE + ROMANUM["problem_statement"]}
    step = grpo_step_on_samples(service.cluster.gateway_url, instance, tmp_path / "trl", prompt="fix romanum-14",
                                max_completion_length=512, sampling_params={"max_tokens": 256})
    out, result, logged = step.out, step.result, step.logged
    assert result["reward"] == 1.0 and out["sample_origin"] == ["main", "subagent"]
    samples = {s["origin"]: s for s in result["trajectory"]["samples"]}
    for row, origin in enumerate(out["sample_origin"]):
        assert out["prompt_ids"][row] == samples[origin]["prompt_ids"]
        assert out["completion_ids"][row] == samples[origin]["response_ids"]
        assert out["env_mask"][row] == samples[origin]["response_mask"]
        assert out["logprobs"][row] == samples[origin]["response_logprobs"]
    check_samples(result["trajectory"], harness_llm.log())
    lengths = [sum(samples[o]["response_mask"]) for o in ("main", "subagent")]
    assert logged["completions/mean_length"] == pytest.approx(sum(lengths) / 2) and logged["reward"] == 1.0
