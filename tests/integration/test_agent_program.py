"""The ``agent`` task through the service (the gateway app in this process, real workers): agent
programs no one here wrote (mini-swe-agent from PyPI, plain ``openai`` SDK scripts) run in a
bubblewrap sandbox against the job's own OpenAI-compatible endpoint, driven by a scripted LLM
server (real Qwen3 token ids). Every id of every segment is checked against what the backend saw
(its ``/_log``)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.agents import (
    MINI_SWE_RULES,
    PROBE_AGENT,
    REWRITE_AGENT,
    ROMANUM_ID,
    SDK_AGENT,
    SDK_RULES,
    SLOW_AGENT,
    THINK_AGENT,
)
from tests.support.services import rules_file, start_llm_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture(scope="module")
def agent_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("agent-llm"), "agent-llm",
                              rules=rules_file(MINI_SWE_RULES + SDK_RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(gateway, agent_llm):
    agent_llm.reset()
    assert gateway.post("/add_llm_server", json={"address": agent_llm.address()}).status_code == 200
    return gateway


def whole(segment: dict) -> list[int]:
    return segment["prompt_ids"] + segment["response_ids"]


def segments_of(trajectory: dict) -> list[dict]:
    return trajectory.get("segments") or [trajectory]


def check_ids_are_what_the_backend_saw(trajectory: dict, log: list[dict]) -> None:
    """Each segment's ids are exactly the last backend request of that segment (prompt + output),
    every model token is the backend's, with its logprob; the invariant holds per segment."""
    segments = segments_of(trajectory)
    by_segment: dict[int, list[dict]] = {}
    for turn, entry in zip(trajectory["turns"], log):
        by_segment.setdefault(turn.get("segment", 0), []).append(entry)
    assert len(trajectory["turns"]) == len(log)
    for index, segment in enumerate(segments):
        entries = by_segment[index]
        assert whole(segment) == entries[-1]["prompt_ids"] + entries[-1]["output_ids"]
        assert segment["prompt_ids"] == entries[0]["prompt_ids"]
        model = [t for t, m in zip(segment["response_ids"], segment["response_mask"]) if m]
        assert model == [t for e in entries for t in e["output_ids"]]
        logprobs = [x for x, m in zip(segment["response_logprobs"], segment["response_mask"]) if m]
        assert logprobs == [x for e in entries for x in e["logprobs"]]
        assert len(segment["response_ids"]) == len(segment["response_mask"]) == len(segment["response_logprobs"])


def tokens_check(tmp_path, result: dict, tokenizer: str) -> subprocess.CompletedProcess:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    return subprocess.run([sys.executable, "-m", "prorl_celery.cli", "tokens", "check", str(path),
                           "--tokenizer", tokenizer], capture_output=True, text=True, timeout=120)


def test_mini_swe_agent_fixes_romanum(service, agent_llm, qwen3_tokenizer, tmp_path):
    result = service.process({"data_source": "agent", "agent": "mini-swe-agent", "swe": ROMANUM_ID,
                              "max_iterations": 10}, timeout_s=240)
    assert (result["status"], result["reward"], result["critical_error"]) == ("completed", 1.0, None), \
        (result["error"], result.get("run_result"))
    assert result["eval"]["resolved"]
    assert '+    (900, "CM"),' in result["git_patch"]
    endpoint = result["endpoint"]
    assert endpoint["calls"] == 4 and endpoint["drift_events"] == [] and endpoint["drifted_tokens"] == 0
    trajectory = result["trajectory"]
    assert "segments" not in trajectory and trajectory["num_turns"] == 4
    check_ids_are_what_the_backend_saw(trajectory, agent_llm.log())
    # its bash blocks are in the trajectory's messages (what the trajectory viewer shows)
    assistant = [m["content"] for m in trajectory["messages"] if m["role"] == "assistant"]
    assert "```mswea_bash_command" in assistant[1] and '(900, "CM")' in assistant[1]
    observations = [m["content"] for m in trajectory["messages"] if m["role"] == "user"]
    assert any("MCMXCIV 1994" in text for text in observations)
    page = service.get(f"/dashboard/jobs/{result['job_id']}")
    assert page.status_code == 200 and "mswea_bash_command" in page.text and "COMPLETE_TASK_AND_SUBMIT" in page.text
    check = tokens_check(tmp_path, result, qwen3_tokenizer)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 drift" in check.stdout
    (tmp_path / "mini.json").write_text(json.dumps(result))
    print("MINI", json.dumps({"timing": result["timing"], "endpoint": {k: v for k, v in endpoint.items()},
                              "tokens": len(trajectory["prompt_ids"]) + len(trajectory["response_ids"]),
                              "model_tokens": sum(trajectory["response_mask"]), "check": check.stdout}))


def test_openai_sdk_agent_with_function_tools_and_streaming(service, agent_llm, qwen3_tokenizer, tmp_path):
    result = service.process({"data_source": "agent", "command": "python3 agent.py", "task": "SDK-AGENT: 6 * 7?",
                              "files": {"agent.py": SDK_AGENT},
                              "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}},
                             timeout_s=120)
    assert (result["status"], result["reward"]) == ("completed", 1.0), (result["error"], result.get("eval"))
    assert result["endpoint"]["calls"] == 2 and result["endpoint"]["drift_events"] == []
    trajectory = result["trajectory"]
    assert [m["role"] for m in trajectory["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory["tools"][0]["function"]["name"] == "python"
    check_ids_are_what_the_backend_saw(trajectory, agent_llm.log())
    assert tokens_check(tmp_path, result, qwen3_tokenizer).returncode == 0


def test_history_rewriting_agent_records_a_drift_event(service, agent_llm, qwen3_tokenizer, tmp_path):
    result = service.process({"data_source": "agent", "command": ["python3", "agent.py"], "task": "rewrite",
                              "files": {"agent.py": REWRITE_AGENT}}, timeout_s=120)
    assert result["status"] == "completed", result["error"]
    [event] = result["endpoint"]["drift_events"]
    assert event["message"] == 0 and "rewritten" in event["reason"] and event["call"] == 3
    assert event["drifted_tokens"] > 0
    trajectory = result["trajectory"]
    assert len(trajectory["segments"]) == 2 and trajectory["drift_events"] == [event]
    check_ids_are_what_the_backend_saw(trajectory, agent_llm.log())
    check = tokens_check(tmp_path, result, qwen3_tokenizer)
    assert check.returncode == 1 and "sample 1 started at call 3" in check.stdout
    assert "rewritten" in check.stdout and "drift: 1 event(s)" in check.stdout and ", 2 samples" in check.stdout


def test_qwen3_think_conversation_records_a_drift_event(service, agent_llm, qwen3_tokenizer, tmp_path):
    result = service.process({"data_source": "agent", "command": "python3 agent.py", "task": "think",
                              "files": {"agent.py": THINK_AGENT},
                              "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "5"}},
                             timeout_s=120)
    assert (result["status"], result["reward"]) == ("completed", 1.0), (result["error"], result.get("eval"))
    [event] = result["endpoint"]["drift_events"]
    assert event["message"] == 1 and "<think>" in event["reason"]
    trajectory = result["trajectory"]
    check_ids_are_what_the_backend_saw(trajectory, agent_llm.log())
    first, second = trajectory["segments"]
    assert "A greeting." in json.dumps(first["messages"]) and "A greeting." not in \
        agent_llm.log()[1]["prompt_ids"].__repr__()
    check = tokens_check(tmp_path, result, qwen3_tokenizer)
    assert check.returncode == 1 and "<think>" in check.stdout


def test_the_key_opens_only_this_jobs_endpoint(service, agent_llm):
    gateway = service.cluster.gateway_url  # handed to the agent as its task: it tries the service with its key
    result = service.process({"data_source": "agent", "command": "python3 agent.py", "task": gateway,
                              "files": {"agent.py": PROBE_AGENT},
                              "evaluator": {"type": "command", "command": "cat answer.txt"}}, timeout_s=120)
    assert (result["status"], result["reward"]) == ("completed", 1.0), (result["error"], result["eval"])
    report = json.loads(result["eval"]["output_tail"].strip().splitlines()[-1])
    assert report["run_dir"] == ["llm.sock", "tool.sock"] and report["other_sockets"] == []
    assert (report["no_key"], report["wrong_key"], report["own_key"]) == (401, 401, 200)
    assert report["gateway"] in ("URLError", "ConnectionRefusedError", "OSError")  # no network in the sandbox
    assert result["endpoint"]["calls"] == 0
    assert agent_llm.log() == []
    # the key reached the program only: no field of the job's record holds it
    assert len(report["key"]) >= 32 and report["key"] not in json.dumps({**result, "eval": None})
    record = service.get(f"/jobs/{result['job_id']}").json
    assert report["key"] not in json.dumps({**record, "eval": None})


def test_cancelling_the_job_ends_the_pending_call_at_once(service, agent_llm):
    job_id = service.submit({"data_source": "agent", "command": "python3 agent.py", "task": "slow",
                             "files": {"agent.py": SLOW_AGENT}}, timeout_s=240)
    deadline = time.monotonic() + 60
    while not agent_llm.log():
        assert time.monotonic() < deadline, "the agent never called its endpoint"
        time.sleep(0.1)
    started = time.monotonic()
    assert service.post("/cancel", json={"job_id": job_id}).json["cancelled"] == [job_id]
    result = service.result(job_id, wait=30)
    assert result["status"] == "cancelled"
    deadline = time.monotonic() + 10
    while not agent_llm.log()[0]["aborted"]:  # the backend saw the request aborted
        assert time.monotonic() < deadline, agent_llm.log()
        time.sleep(0.1)
    assert time.monotonic() - started < 15


#: the SDK agent, but its first message holds the time: it cannot be re-run to the same calls
CLOCK_AGENT = SDK_AGENT.replace('open(os.environ["PRORL_TASK_FILE"]).read()',
                                'open(os.environ["PRORL_TASK_FILE"]).read() + " " + str(__import__("time").time_ns())')


def sdk_job(agent: str = SDK_AGENT) -> dict:
    return {"data_source": "agent", "command": "python3 agent.py", "task": "SDK-AGENT: 6 * 7?",
            "files": {"agent.py": agent},
            "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}}


def test_an_agent_program_is_replayed_and_forked_against_its_journaled_answers(service, agent_llm):
    """The program runs again in a fresh sandbox; its endpoint calls get the journaled answers
    (a replay asks no model; a fork at turn 1 asks only for turn 2), checked call by call."""
    source = service.process(sdk_job(), timeout_s=120)
    assert (source["status"], source["reward"]) == ("completed", 1.0), source["error"]
    asked = len(agent_llm.log())
    replay = service.post(f"/jobs/{source['job_id']}/replay")
    assert replay.status_code == 202, replay.get_data(as_text=True)
    replayed = service.result(replay.get_json()["job_id"], wait=120)
    assert replayed["replay"]["identical"] is True and replayed["replay"]["turns_replayed"] == 2, replayed["replay"]
    assert replayed["reward"] == 1.0 and len(agent_llm.log()) == asked
    assert replayed["trajectory"]["response_ids"] == source["trajectory"]["response_ids"]
    fork = service.post(f"/jobs/{source['job_id']}/fork", json={"turn": 1, "count": 1})
    forked = service.result(fork.get_json()["jobs"][0]["job_id"], wait=120)
    assert (forked["status"], forked["reward"], forked["fork"]["shared_turns"]) == ("completed", 1.0, 1), forked
    assert forked["resume"] is None and len(agent_llm.log()) == asked + 1  # turn 2 only


def test_an_agent_program_that_asks_otherwise_restarts_from_turn_zero_and_says_so(service, agent_llm):
    source = service.process(sdk_job(CLOCK_AGENT), timeout_s=120)
    assert source["status"] == "completed", source["error"]
    fork = service.post(f"/jobs/{source['job_id']}/fork", json={"turn": 1, "count": 1})
    forked = service.result(fork.get_json()["jobs"][0]["job_id"], wait=120)
    assert forked["status"] == "completed" and forked["reward"] == 1.0, forked["error"]
    resume = forked["resume"]
    assert resume["restarted"] is True and resume["diverged_at_turn"] == 0, resume
    # its first call's messages differ: a different prompt, or a conversation the journal lacks
    assert resume["difference"]["kind"] in {"prompt", "seg"}, resume
    assert forked["trajectory"]["num_turns"] == 2  # both turns generated again, from zero
