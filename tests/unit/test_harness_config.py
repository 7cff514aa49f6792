"""The ``agent`` handler's npm harnesses (Claude Code, Codex, OpenCode): what it writes and
binds, and that a harness not installed is a missing requirement (an ``env_error``), never a
reward. Their real runs: tests/integration/test_harnesses.py."""
from __future__ import annotations

import json
import tomllib

import pytest

from handlers.agent_program.handler import AgentProgramHandler
from handlers.agent_program.harnesses import CONFIG_DIR, MOUNT
from handlers.base import JobContext
from singularity.requirements import explain, missing


def job(agent: str, **instance) -> JobContext:
    return JobContext("j1", "agent", {"data_source": "agent", "agent": agent, "swe": "prorl-swe__romanum-14",
                                      "model": "policy", **instance})


@pytest.mark.parametrize("agent", ["claude-code", "codex", "opencode"])
def test_a_harness_not_installed_is_a_missing_requirement(agent, tmp_path, monkeypatch):
    monkeypatch.setenv("PRORL_HARNESS_DIR", str(tmp_path / "none"))
    handler = AgentProgramHandler()
    absent = missing(handler.requirements(job(agent)), "run")
    binary = str(tmp_path / "none" / agent / "node_modules" / ".bin" / agent.split("-")[0])
    assert binary in [r.name for r in absent]
    assert "scripts/install_harnesses.sh" in explain("agent", absent)
    assert binary not in [r.name for r in missing(handler.requirements(job(agent)), "eval")]  # EVAL runs none


@pytest.mark.parametrize("agent", ["claude-code", "codex", "opencode"])
def test_the_harness_is_bound_read_only_for_run_only(agent, tmp_path, monkeypatch):
    monkeypatch.setenv("PRORL_HARNESS_DIR", str(tmp_path))
    handler = AgentProgramHandler()
    context = job(agent)
    assert (str(tmp_path / agent), f"{MOUNT}/{agent}") in handler.sandbox_request(context).binds
    evaluating = handler.eval_sandbox_request(context)
    assert evaluating is not None and all(MOUNT not in target for _, target in evaluating.binds)
    # the small model's calls are auxiliary samples of the endpoint
    assert handler.endpoint_request(context).auxiliary_models == ("policy-small",)


def test_claude_code_is_configured_for_the_endpoint_with_nothing_phoning_home():
    instance = AgentProgramHandler().instance_of(job("claude-code"))
    argv, env = instance.program()
    line = argv[-1]
    assert 'ANTHROPIC_BASE_URL="${base%/v1}"' in line and 'ANTHROPIC_API_KEY="$OPENAI_API_KEY"' in line
    assert "--dangerously-skip-permissions" in line and " -p " in line and env["IS_SANDBOX"] == "1"
    assert {env[k] for k in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                             "CLAUDE_CODE_SUBAGENT_MODEL")} == {"policy"}
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "policy-small"
    for switch in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"):
        assert env[switch] == "1"
    settings = json.loads(instance.harness_files()[f"{CONFIG_DIR}/claude/settings.json"])
    assert settings["permissions"]["defaultMode"] == "bypassPermissions"


def test_codex_speaks_responses_to_a_custom_provider():
    instance = AgentProgramHandler().instance_of(job("codex"))
    argv, env = instance.program()
    config = tomllib.loads(instance.harness_files()[f"{CONFIG_DIR}/codex/config.toml"])
    provider = config["model_providers"][config["model_provider"]]
    assert (provider["wire_api"], provider["env_key"], config["model"]) == ("responses", "OPENAI_API_KEY", "policy")
    assert (config["approval_policy"], config["sandbox_mode"]) == ("never", "danger-full-access")
    assert config["analytics"]["enabled"] is False and config["check_for_update_on_startup"] is False
    assert env["CODEX_HOME"] == f"{CONFIG_DIR}/codex" and " exec " in argv[-1]
    assert '-c "model_providers.prorl.base_url=\\"$base\\""' in argv[-1]


def test_opencode_has_an_openai_compatible_provider_on_the_endpoint():
    instance = AgentProgramHandler().instance_of(job("opencode"))
    argv, env = instance.program()
    config = json.loads(instance.harness_files()[f"{CONFIG_DIR}/opencode/opencode.json"])
    options = config["provider"]["prorl"]["options"]
    assert options == {"baseURL": "{env:OPENAI_BASE_URL}", "apiKey": "{env:OPENAI_API_KEY}"}
    assert (config["model"], config["small_model"]) == ("prorl/policy", "prorl/policy-small")
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "1" and " run " in argv[-1]
