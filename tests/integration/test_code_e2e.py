"""The code task through the service: the gateway app (in this process), real Celery workers,
Redis, bubblewrap sandboxes and a scripted LLM server (real Qwen3 token ids) whose agent writes a
solution with the editor, runs it with bash and finishes. EVAL judges it in a fresh sandbox,
never the agent's."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import redis

from handlers.code import load_problems
from handlers.tool_calls import tool_call
from prorl_celery.state import keys
from tests.support.services import rules_file, start_llm_server

SOLUTIONS = json.loads((Path(__file__).parents[1] / "data" / "code_solutions.json").read_text())
PAIR_SUMS = next(p for p in load_problems() if p["id"] == "code-001")
LOOP = "while True:\n    pass\n"
MEMORY_HOG = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))\n"

pytestmark = pytest.mark.timeout(240)



def agent(marker: str, solution: str) -> dict:
    """Write the solution, run it on the example, finish."""
    return {"match": marker, "scope": "prompt", "replies": [
        "I will write the program.\n" + tool_call("editor", command="create", path="solution.py", file_text=solution),
        tool_call("bash", command="printf '2\\n20 22\\n-1 1\\n' | python3 solution.py"),
        tool_call("finish", answer="solution.py is written")]}


RULES = [agent("E2E-GOOD", SOLUTIONS["code-001"]["reference"]), agent("E2E-WRONG", SOLUTIONS["code-001"]["wrong"]),
         agent("E2E-LOOP", LOOP), agent("E2E-MEMORY", MEMORY_HOG)]


def instance(marker: str, **overrides) -> dict:
    row = {key: value for key, value in PAIR_SUMS.items() if key != "id"}
    return {**row, "data_source": "codeforces", "problem": f"[{marker}] {row['problem']}", **overrides}


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture(scope="module")
def code_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("code-llm"), "code-llm", rules=rules_file(RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(gateway, code_llm):
    assert gateway.post("/add_llm_server", json={"address": code_llm.address()}).status_code == 200
    return gateway


def processes_of(job_id: str) -> list[int]:
    """Host pids whose environment carries the judge's marker for this job (solutions under test)."""
    found = []
    marker = f"PRORL_CODE_JOB={job_id}".encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as handle:
                    if marker in handle.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found


def test_correct_and_wrong_solutions(service):
    good = service.submit(instance("E2E-GOOD"))
    wrong = service.submit(instance("E2E-WRONG"))
    result = service.result(good, wait=120)
    assert (result["status"], result["reward"], result["critical_error"]) == ("completed", 1.0, None), result["error"]
    assert result["artifacts"] == {"solution.py": SOLUTIONS["code-001"]["reference"]}
    evaluation = result["eval"]
    assert evaluation["fraction_passed"] == 1.0 and evaluation["total"] == len(PAIR_SUMS["tests"])
    assert {v["verdict"] for v in evaluation["verdicts"]} == {"passed"}
    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert tools[1]["content"].split() == ["42", "0"]  # the agent ran its program with bash
    assert result["trajectory"]["num_turns"] == 3
    assert {t["function"]["name"] for t in result["trajectory"]["tools"]} == {"editor", "bash", "finish"}

    result = service.result(wrong, wait=120)
    assert (result["status"], result["reward"]) == ("completed", 0.0)
    assert result["artifacts"]["solution.py"] == SOLUTIONS["code-001"]["wrong"]
    assert result["eval"]["fraction_passed"] < 1.0 and result["eval"]["counts"].get("wrong_answer", 0) >= 1

    state = redis.Redis.from_url(service.cluster.state_url, decode_responses=True)
    record = state.hgetall(keys.job(good))
    run_sandbox = json.loads(record["sandbox"])
    # the agent's sandbox was closed after RUN; EVAL's own one is gone too
    assert not os.path.exists(run_sandbox["workspace"])
    assert not os.path.exists(run_sandbox["workspace"] + "-eval")
    assert state.hlen(keys.node_sandboxes(record.get("eval_node") or record["node"])) == 0


@pytest.mark.extended
def test_time_limit_kills_an_infinite_loop_and_the_worker_carries_on(service):
    loop = service.submit(instance("E2E-LOOP", time_limit_s=1, tests=PAIR_SUMS["tests"][:1]))
    hog = service.submit(instance("E2E-MEMORY", memory_mb=64, tests=PAIR_SUMS["tests"][:1]))
    seen: set[int] = set()
    deadline = time.monotonic() + 150
    while service.get(f"/jobs/{loop}").json.get("status") not in ("completed", "failed", "timeout", "cancelled"):
        seen.update(processes_of(loop))  # the looping solution, seen while EVAL runs it
        assert time.monotonic() < deadline, "the infinite-loop job did not finish"
        time.sleep(0.1)
    result = service.result(loop, wait=10)
    assert (result["status"], result["reward"], result["critical_error"]) == ("completed", 0.0, None), result["error"]
    verdicts = result["eval"]["verdicts"]
    assert [v["verdict"] for v in verdicts] == ["time_limit"]
    assert all(v["wall_s"] < 1 * 3 + 1 + 1 for v in verdicts)  # killed at its own limit
    assert seen, "the solution's process was never observed running (the check below would prove nothing)"
    assert processes_of(loop) == [] and all(not os.path.exists(f"/proc/{pid}") for pid in seen)

    state = redis.Redis.from_url(service.cluster.state_url, decode_responses=True)
    record = state.hgetall(keys.job(loop))
    assert not os.path.exists(json.loads(record["sandbox"])["workspace"] + "-eval")

    result = service.result(hog, wait=120)
    assert (result["status"], result["reward"]) == ("completed", 0.0), result["error"]
    assert result["eval"]["verdicts"][0]["verdict"] in ("memory_limit", "runtime_error")

    # the same workers still serve the next job
    after = service.result(service.submit(instance("E2E-GOOD")), wait=120)
    assert (after["status"], after["reward"]) == ("completed", 1.0), after["error"]
    assert state.hlen(keys.node_sandboxes(record.get("eval_node") or record["node"])) == 0
    assert processes_of(loop) == [] and processes_of(hog) == []


def test_bad_code_instance_is_a_400(service):
    response = service.post("/jobs", json={"instance": {"data_source": "deepcoder", "problem": "x",
                                                        "tests": [{"input": "1"}]}})
    assert response.status_code == 400 and "tests[0]" in response.json["message"]
