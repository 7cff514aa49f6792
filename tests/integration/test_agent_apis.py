"""Agent programs on Anthropic's Messages API and OpenAI's Responses API through the service: the
official SDKs in a bubblewrap sandbox (the gateway app in this process, real workers), against
the job's own endpoint, driven by a scripted LLM server (real Qwen3 token ids). Every id is
checked against what the backend saw (its ``/_log``)."""
from __future__ import annotations

import pytest

from tests.support.agents import ANTHROPIC_AGENT, API_AGENT_RULES, RESPONSES_AGENT
from tests.support.endpoint import check_exact
from tests.support.services import rules_file, start_llm_server

pytestmark = pytest.mark.timeout(300)


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
