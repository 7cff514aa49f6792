"""Agent programs on Anthropic's Messages API and OpenAI's Responses API through the service: the
official SDKs in a bubblewrap sandbox (the gateway app in this process, real workers), against
the job's own endpoint, driven by a scripted LLM server (real Qwen3 token ids). Every id is
checked against what the backend saw (its ``/_log``)."""
from __future__ import annotations

import pytest

from tests.support.agents import ANTHROPIC_AGENT, API_AGENT_RULES, RESPONSES_AGENT
from tests.support.endpoint import check_exact
from tests.support.services import rules_file, start_llm_server

# kept out of the default run's 10 minutes (CI's extended phase runs it every time)
pytestmark = [pytest.mark.extended, pytest.mark.timeout(300)]


@pytest.fixture
def gateway(app_gateway):
    return app_gateway


@pytest.fixture(scope="module")
def api_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("api-llm"), "api-llm",
                              rules=rules_file(API_AGENT_RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(gateway, api_llm):
    api_llm.reset()
    assert gateway.post("/add_llm_server", json={"address": api_llm.address()}).status_code == 200
    return gateway


@pytest.mark.parametrize("agent", ["anthropic", "responses"])
def test_sdk_agent_on_its_own_api_is_token_exact(service, api_llm, agent):
    pytest.importorskip("anthropic")
    script = ANTHROPIC_AGENT if agent == "anthropic" else RESPONSES_AGENT
    result = service.process({"data_source": "agent", "command": "python3 agent.py", "task": "6 * 7?",
                              "files": {"agent.py": script},
                              "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}},
                             timeout_s=120)
    assert (result["status"], result["reward"]) == ("completed", 1.0), (result["error"], result.get("run_result"))
    endpoint = result["endpoint"]
    assert endpoint["calls"] == 2 and endpoint["drift_events"] == [], endpoint
    trajectory = result["trajectory"]
    assert [m["role"] for m in trajectory["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    check_exact(trajectory, api_llm.log())


#: writes a right answer, then calls past its max_iterations and crashes on the refusal
CRASHING_AGENT = r"""
from openai import OpenAI
open("answer.txt", "w").write("\\boxed{42}")
client = OpenAI()
for _ in range(3):
    client.responses.create(model="policy", input="RESPONSES-AGENT 6 * 7?")
"""


def test_a_program_stopped_at_its_limit_is_judged_and_its_exit_reaches_the_result(service, api_llm):
    result = service.process({"data_source": "agent", "command": "python3 agent.py", "task": "6 * 7?",
                              "files": {"agent.py": CRASHING_AGENT}, "max_iterations": 1,
                              "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}},
                             timeout_s=120)
    # out of calls, as an agent loop at max_iterations: judged on what it left (the answer it wrote)
    assert result["endpoint"]["refused"] == {"max_iterations": 1} and result["reward"] == 1.0
    program = result["program"]
    assert program["exit_code"] not in (0, None)
    # the job stopped it, or it crashed first on the refusal: either way the result says which
    assert program.get("stopped") == "max_iterations" or "PermissionDeniedError" in program["log_tail"]
    if not program.get("stopped"):
        assert result["outcome"] == "agent_error" and "exited with code" in result["error"]


def test_a_program_that_crashes_on_its_own_fails_the_rollout(service, api_llm):
    result = service.process({"data_source": "agent", "command": "python3 agent.py", "task": "6 * 7?",
                              "files": {"agent.py": "open('answer.txt', 'w').write('42')\nraise SystemExit('boom')"},
                              "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}},
                             timeout_s=120, max_attempts=1)
    assert (result["status"], result["reward"]) != ("completed", 1.0)
    assert "exited with code 1" in result["error"] and "boom" in result["error"]
