"""The code task: instance shapes, grading, the judge's limits in a real bubblewrap sandbox, every
shipped problem against its reference and a wrong solution, and RUN reading the solution out of the
agent's sandbox. Through the service: tests/integration/test_code_e2e.py."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from handlers.base import JobContext
from handlers.code import (
    CodeHandler,
    extract_code,
    load_problems,
    normalize_instance,
    tokens_match,
    values_match,
)
from handlers.code.grading import verdict
from handlers.code.handler import judge_tests
from handlers.tool_calls import tool_call
from singularity.runtime import (
    BubblewrapRuntime,
    FileAddressAllocator,
    FileSandboxLedger,
    Limits,
    SandboxSpec,
)
from tests.support.scripted_llm import ScriptedLLM

DATA = Path(__file__).parents[1] / "data" / "code_solutions.json"
SOLUTIONS: dict[str, dict[str, str]] = json.loads(DATA.read_text())
PROBLEMS = {p["id"]: p for p in load_problems()}
VERL_ROWS = load_problems("verl_sample")

pytestmark = pytest.mark.timeout(300)



# -- instances -------------------------------------------------------------------------------------

def test_shipped_problems_cover_the_three_test_styles():
    styles = [normalize_instance(p).style for p in PROBLEMS.values()]
    assert len(PROBLEMS) == 15 and set(PROBLEMS) == set(SOLUTIONS)
    assert styles.count("stdio") == 10 and styles.count("call") == 3 and styles.count("pytest") == 2
    for problem in PROBLEMS.values():
        code = normalize_instance(problem)
        assert code.time_limit_s == 2.0 and code.memory_mb == 256 and len(code.tests) >= 4
        prompt = "\n".join(m["content"] for m in code.messages)
        assert problem["problem"].split("\n")[0] in prompt and "/workspace/solution.py" in prompt
        hidden = problem.get("test_code") or problem["tests"][-1]["input"]
        if not isinstance(hidden, str):
            hidden = json.dumps(hidden)
        assert hidden not in prompt  # the hidden tests are never shown


def test_examples_and_starter_code_are_shown():
    code = normalize_instance(PROBLEMS["code-001"])
    assert PROBLEMS["code-001"]["examples"][0]["input"].rstrip() in code.messages[1]["content"]
    code = normalize_instance(PROBLEMS["code-013"])
    assert "class Solution" in code.messages[1]["content"] and code.fn_name == "longest_palindrome"


def test_verl_rows_in_the_deepcoder_eurus_livecodebench_and_taco_shapes():
    by_source = {row["data_source"]: normalize_instance(row) for row in VERL_ROWS}
    assert set(by_source) == {"deepcoder", "eurus", "livecodebench", "taco"}
    assert by_source["deepcoder"].style == "stdio" and by_source["eurus"].style == "stdio"
    lcb = by_source["livecodebench"]
    assert lcb.style == "call" and lcb.fn_name == "merge_intervals"
    assert lcb.tests[0] == {"kind": "call", "args": [[[1, 3], [2, 6], [8, 10], [15, 18]]],
                            "output": [[1, 6], [8, 10], [15, 18]]}
    assert by_source["taco"].fn_name == "count_islands" and by_source["taco"].tests[0]["output"] == [2]
    row = VERL_ROWS[0]
    assert by_source["deepcoder"].messages == row["prompt"]  # the dataset's prompt, unchanged
    assert by_source["deepcoder"].metadata["extra_info"]["reference_id"] == "code-005"
    # the same row with the ground truth as a decoded value instead of a JSON string
    ground_truth = json.loads(row["reward_model"]["ground_truth"])
    decoded = {**row, "reward_model": {"style": "rule", "ground_truth": ground_truth}}
    assert normalize_instance(decoded).tests == by_source["deepcoder"].tests


def test_taco_primeintellect_and_codeforces_rows():
    taco = normalize_instance({"question": "Add.",
                               "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
                               "time_limit": "1 second", "memory_limit": "128 megabytes"})
    assert (taco.style, taco.time_limit_s, taco.memory_mb) == ("stdio", 1.0, 128)
    prime = normalize_instance({"prompt": "Double it.", "verification_info": json.dumps({"test_cases": [
        {"type": "function_call", "fn_name": "double", "input": [2], "output": [4]}]})})
    assert prime.fn_name == "double" and prime.tests == [{"kind": "call", "args": [2], "output": [4]}]
    cf = normalize_instance({"description": "Sum two numbers.", "input_format": "Two integers.",
                             "output_format": "Their sum.", "official_tests": [{"input": "1 2", "output": "3"}],
                             "time_limit": 1.0, "memory_limit": 256.0})
    assert "Input\nTwo integers." in cf.messages[1]["content"] and cf.tests[0]["kind"] == "stdio"


@pytest.mark.parametrize("instance, field", [
    ({"tests": [{"input": "1", "output": "1"}]}, "problem"),
    ({"problem": "x"}, "tests"),
    ({"problem": "  ", "tests": [{"input": "", "output": ""}]}, "problem"),
    ({"problem": "x", "tests": []}, "tests"),
    ({"problem": "x", "tests": [{"input": "1"}]}, "tests[0]"),
    ({"problem": "x", "tests": [{"input": 1.5j, "output": "1"}]}, "tests[0].input"),
    ({"problem": "x", "tests": [{"input": "1", "output": "1"}], "time_limit_s": 0}, "time_limit_s"),
    ({"problem": "x", "tests": [{"input": "1", "output": "1"}], "time_limit": "2 parsecs"}, "time_limit"),
    ({"problem": "x", "tests": [{"input": "1", "output": "1"}], "memory_mb": 10**6}, "memory_mb"),
    ({"problem": "x", "tests": [{"input": "1", "output": "1"}], "float_tolerance": "tiny"}, "float_tolerance"),
    ({"problem": "x", "tests": [{"input": "1", "output": "1"}], "tools": ["browser"]}, "tools"),
    ({"problem": "x", "tests": [{"input": "1", "output": "1"}], "max_iterations": 0}, "max_iterations"),
    ({"problem": "x", "fn_name": "not a name", "tests": [{"input": [1], "output": 1}]}, "fn_name"),
    ({"problem": "x", "fn_name": "f", "tests": [{"input": 7, "output": 1}]}, "tests[0].input"),
    ({"problem": "x", "test_code": "def test_(:\n"}, "test_code"),
    ({"problem": "x", "input_output": "{not json"}, "input_output"),
    ({"problem": "x", "input_output": {"inputs": ["1"], "outputs": []}}, "input_output"),
    ({"prompt": [{"role": "user", "content": "x"}]}, "reward_model.ground_truth"),
    ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"style": "model", "ground_truth": "[]"}},
     "reward_model.style"),
    ({"prompt": [{"role": "robot", "content": "x"}], "reward_model": {"ground_truth": "[]"}}, "prompt[0]"),
    ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": "[]"}},
     "reward_model.ground_truth"),
    ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": json.dumps(
        [{"input": "1", "output": "2", "testtype": "functional"}])}}, "fn_name"),
])
def test_bad_instances_name_the_field(instance, field):
    with pytest.raises(ValueError, match=rf"'{re.escape(field)}"):
        CodeHandler().validate_instance(instance)


def test_init_touches_no_sandbox_and_keeps_the_tests_out():
    class NoTouch:
        def __getattr__(self, name):
            raise AssertionError(f"INIT used the agent's sandbox: {name}")
    problem = PROBLEMS["code-006"]
    job = JobContext(job_id="i", task="code", instance=problem, sandbox=NoTouch())
    init_result = asyncio.run(CodeHandler().init(job))
    text = json.dumps(init_result)
    assert init_result["tests"] == len(problem["tests"]) and init_result["style"] == "stdio"
    assert not any(t["output"].strip() in text for t in problem["tests"][len(problem["examples"]):])


def test_extract_code_takes_the_last_python_block():
    text = "Plan:\n```python\nprint(1)\n```\nFinal:\n```python\nprint(2)\n```\n"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("no code here") is None and extract_code("```python\n\n```") is None


# -- grading ---------------------------------------------------------------------------------------

def test_token_comparison_ignores_whitespace_and_honours_a_float_tolerance():
    assert tokens_match("1 2\n3\n\n", "1\n2 3")
    assert not tokens_match("1 2 3 4", "1 2 3")
    assert not tokens_match("3.1416", "3.14159265")
    assert tokens_match("3.1415927", "3.14159265", 1e-6) and not tokens_match("3.14", "3.14159265", 1e-6)
    assert tokens_match("1e9", "1000000000.5", 1e-6)  # relative for large numbers
    assert not tokens_match("nan", "1.0", 1e-6) and not tokens_match("inf", "1e308", 1e-6)
    assert not tokens_match("YES", "yes", 1e-6)


def test_value_comparison_as_taco_graders_do():
    assert values_match([[1, 6]], [[1, 6]]) and values_match(3, [3]) and not values_match(3, [4])
    assert values_match(0.1 + 0.2, 0.3) and not values_match(True, 1) and not values_match(1, True)
    assert not values_match({"a": 1}, {"a": 2}) and values_match({"a": [1.0]}, {"a": [1]})


def _report(**fields: Any) -> dict[str, Any]:
    return {"exit_code": 0, "signal": None, "cpu_s": 0.05, "wall_s": 0.06, "max_rss_bytes": 10 * 2**20,
            "killed_at_wall": False, "output_limit": False, "stderr_tail": "", "stdout": "3\n", **fields}


STDIO_TEST = {"kind": "stdio", "input": "1 2", "output": "3", "time_limit_s": 1.0, "memory_bytes": 256 * 2**20}


@pytest.mark.parametrize("fields, expected", [
    ({}, "passed"),
    ({"stdout": "4\n"}, "wrong_answer"),
    ({"killed_at_wall": True, "exit_code": None, "signal": 9}, "time_limit"),
    ({"signal": int(signal.SIGXCPU), "exit_code": None}, "time_limit"),
    ({"cpu_s": 1.3}, "time_limit"),
    ({"exit_code": 1, "stderr_tail": "Traceback...\nMemoryError\n"}, "memory_limit"),
    ({"signal": int(signal.SIGSEGV), "exit_code": None, "max_rss_bytes": 250 * 2**20}, "memory_limit"),
    ({"signal": int(signal.SIGSEGV), "exit_code": None}, "runtime_error"),
    ({"exit_code": 1, "stderr_tail": "ZeroDivisionError: division by zero"}, "runtime_error"),
    ({"output_limit": True}, "wrong_answer"),
    ({"judge_error": "OSError: no space"}, "runtime_error"),
])
def test_verdicts_from_judge_reports(fields, expected):
    assert verdict(_report(**fields), STDIO_TEST)[0] == expected


# -- the judge in a real sandbox -------------------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """One bubblewrap sandbox (as the pipeline starts them) for the judge and RUN tests."""
    if not BubblewrapRuntime().available():
        pytest.fail(f"bubblewrap must work here: {BubblewrapRuntime().available().reason}")
    tmp = tmp_path_factory.mktemp("code")
    runtime = BubblewrapRuntime(ledger=FileSandboxLedger(tmp / "ledger"),
                                allocator=FileAddressAllocator(tmp / "a.json"),
                                node="code-test", state_dir=tmp / "state")
    (tmp / "ws").mkdir()
    spec = SandboxSpec(image="dev", workspace=str(tmp / "ws"), job_id="code-test",
                       limits=Limits(memory_bytes=4 * 2**30, max_processes=256))
    handle = asyncio.run(runtime.start(spec))
    yield handle
    asyncio.run(runtime.stop(handle))


def evaluate(sandbox, instance: dict[str, Any], solution: str | None, job_id: str = "unit"):
    handler = CodeHandler()
    job = JobContext(job_id=job_id, task="code", instance=instance, run_result={"solution": solution})

    async def body():
        async with sandbox.client() as job.sandbox:
            return await handler.eval(job)
    return asyncio.run(body())


def _problem_params() -> list[Any]:
    """Every shipped problem; the default run judges the first of each test style (stdio, call,
    pytest) and leaves the other twelve, the same code paths on other data, to ``-m extended``
    (about 1.3 s of sandboxed judging each)."""
    styles_seen: set[str] = set()
    params = []
    for problem_id, problem in PROBLEMS.items():
        style = normalize_instance(problem).style
        marks = () if style not in styles_seen else (pytest.mark.extended,)
        styles_seen.add(style)
        params.append(pytest.param(problem_id, id=problem_id, marks=marks))
    return params


@pytest.mark.parametrize("problem_id", _problem_params())
def test_every_shipped_problem_passes_its_reference_and_fails_a_wrong_solution(sandbox, problem_id):
    problem = PROBLEMS[problem_id]
    right = evaluate(sandbox, problem, SOLUTIONS[problem_id]["reference"])
    assert right.reward == 1.0, (problem_id, right.details)
    assert right.details["fraction_passed"] == 1.0
    assert len(right.details["verdicts"]) == len(judge_tests(normalize_instance(problem)))
    wrong = evaluate(sandbox, problem, SOLUTIONS[problem_id]["wrong"])
    assert wrong.reward == 0.0, problem_id
    assert wrong.details["passed"] < wrong.details["total"]
    assert {v["verdict"] for v in wrong.details["verdicts"]} - {"passed"} <= {"wrong_answer", "time_limit"}, \
        (problem_id, wrong.details["counts"])


def test_verl_sample_rows_pass_their_reference_solutions(sandbox):
    for row in VERL_ROWS:
        reference = SOLUTIONS[row["extra_info"]["reference_id"]]
        assert evaluate(sandbox, row, reference["reference"]).reward == 1.0, row["data_source"]
    # the functional (call) rows compare returned values: a wrong one must still fail
    assert evaluate(sandbox, VERL_ROWS[2], SOLUTIONS["code-012"]["wrong"]).reward == 0.0


def _tiny(**extra: Any) -> dict[str, Any]:
    return {"problem": "Print the sum of two integers.", "time_limit_s": 1, "memory_mb": 64,
            "tests": [{"input": "1 2\n", "output": "3\n"}], **extra}


@pytest.mark.parametrize("solution, expected", [
    ("a, b = map(int, input().split())\nprint(a + b)\n", "passed"),
    ("while True:\n    pass\n", "time_limit"),
    ("import time\ntime.sleep(60)\n", "time_limit"),
    ("a = []\nwhile True:\n    a.append(bytearray(10**7))\n", "memory_limit"),
    ("print(1 // 0)\n", "runtime_error"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "runtime_error"),
    ("import sys\nwhile True:\n    sys.stdout.write('9' * 65536)\n", "wrong_answer"),
])
def test_judge_limits(sandbox, solution, expected):
    result = evaluate(sandbox, _tiny(), solution)
    test = result.details["verdicts"][0]
    assert test["verdict"] == expected, test
    assert result.reward == (1.0 if expected == "passed" else 0.0)
    if expected == "time_limit":
        assert test["wall_s"] < 1 * 3 + 1 + 1  # killed at its wall-clock limit, not at the judge's timeout


def test_processes_left_by_a_solution_are_killed(sandbox):
    # a child in its own session escapes the process group kill; the judge still finds it
    escape = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
              "print(3)\n")
    assert evaluate(sandbox, _tiny(), escape).reward == 1.0

    async def processes() -> str:
        async with sandbox.client() as client:
            return (await client.bash("ps -eo args", timeout_s=10)).output
    assert "time.sleep(300)" not in asyncio.run(processes())


def test_a_fork_bomb_is_contained_and_the_next_test_runs(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert [v["verdict"] for v in evaluate(sandbox, _tiny(), bomb).details["verdicts"]] == ["time_limit"]
    assert evaluate(sandbox, _tiny(), "print(3)\n").reward == 1.0  # the sandbox has room for the next one


def test_judge_kills_only_its_own_descendants(tmp_path):
    """Under a runtime without a pid namespace /proc is the host's: a process that is not the
    judge's descendant must survive, the solution's daemonized child must not."""
    import subprocess
    import sys
    from importlib import resources
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "judge.py").write_text(resources.files("handlers.code").joinpath("judge.py").read_text())
        (tmp_path / "solution.py").write_text(
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        open({str(tmp_path / 'daemon.pid')!r}, 'w').write(str(os.getpid()))\n        time.sleep(120)\n"
            "    os._exit(0)\ntime.sleep(0.5)\nprint(3)\n")
        test = {"kind": "stdio", "input": "", "time_limit_s": 2, "memory_bytes": 2**30, "output_cap": 4096}
        (tmp_path / "manifest.json").write_text(json.dumps({"tests": [test]}))
        subprocess.run([sys.executable, str(tmp_path / "judge.py"), str(tmp_path / "manifest.json"),
                        str(tmp_path / "results.json")], check=True, timeout=60)
        report = json.loads((tmp_path / "results.json").read_text())["reports"][0]
        assert report["stdout"].strip() == "3" and report["stragglers_killed"] >= 1
        daemon = int((tmp_path / "daemon.pid").read_text())
        assert not os.path.exists(f"/proc/{daemon}")  # daemonized, reparented to the judge, killed
        assert bystander.poll() is None  # not a descendant: untouched
    finally:
        bystander.kill()
        bystander.wait()


def test_pytest_style_needs_the_harness_to_report_success(sandbox):
    instance = {"problem": "Write f.", "test_code": "from solution import f\n\ndef test_f():\n    assert f(2) == 4\n"}
    assert evaluate(sandbox, instance, "def f(x):\n    return 2 * x\n").reward == 1.0
    # exiting with status 0 before the test runs is not a pass
    cheat = evaluate(sandbox, instance, "import os\nos._exit(0)\n")
    assert cheat.reward == 0.0 and cheat.details["verdicts"][0]["verdict"] == "runtime_error"
    assert "no result" in cheat.details["verdicts"][0]["reason"]
    wrong = evaluate(sandbox, instance, "def f(x):\n    return x + 3\n")
    first = wrong.details["verdicts"][0]
    assert first["verdict"] == "wrong_answer" and "AssertionError" in first["reason"]


def test_call_style_with_a_solution_class_and_runtime_errors(sandbox):
    instance = {"problem": "Halve.", "fn_name": "half",
                "tests": [{"input": [4], "output": 2}, {"input": [0], "output": 0}]}
    assert evaluate(sandbox, instance, "class Solution:\n    def half(self, x):\n        return x // 2\n").reward == 1.0
    broken = evaluate(sandbox, instance, "def half(x):\n    return x // 3 + 8 // x\n")
    assert [v["verdict"] for v in broken.details["verdicts"]] == ["wrong_answer", "runtime_error"]
    assert broken.details["fraction_passed"] == 0.0
    missing = evaluate(sandbox, instance, "def other(x):\n    return x\n")
    assert "no function 'half'" in missing.details["verdicts"][0]["reason"]


def test_expected_outputs_never_enter_the_sandbox(sandbox):
    problem = PROBLEMS["code-006"]
    for old in sandbox.workspace.glob(".judge-*"):  # earlier evaluations' results hold real outputs
        shutil.rmtree(old)
    assert evaluate(sandbox, problem, "print('no idea')\n").details["counts"] == {"wrong_answer": len(problem["tests"])}
    outputs = [t["output"].strip() for t in problem["tests"] if len(t["output"].strip()) > 20]
    assert outputs
    for path in sandbox.workspace.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(output in text for output in outputs), path


def test_no_solution_means_no_eval_sandbox_and_reward_zero():
    handler = CodeHandler()
    job = JobContext(job_id="j", task="code", instance=_tiny(), run_result={"solution": None})
    assert handler.eval_sandbox_request(job) is None
    result = asyncio.run(handler.eval(job))
    assert result.reward == 0.0 and result.details["error"] == "no solution was produced"
    job.run_result = {"solution": "print(3)"}
    request = handler.eval_sandbox_request(job)
    assert request is not None and request.memory_bytes >= 64 * 2**20 + 2**30 and not request.network


# -- RUN: the solution comes out of the agent's sandbox --------------------------------------------

def run_agent(sandbox, instance: dict[str, Any], replies: list[str]) -> tuple[dict[str, Any], ScriptedLLM]:
    handler = CodeHandler()
    job = JobContext(job_id="r", task="code", instance=instance)
    llm = ScriptedLLM(replies)

    async def body():
        async with sandbox.client() as job.sandbox:
            await job.sandbox.bash("rm -f /workspace/solution.py", timeout_s=10)
            job.init_result = await handler.init(job)
            return await handler.run(job, llm)
    return asyncio.run(body()), llm


def test_run_reads_the_file_the_agent_wrote_and_ran(sandbox):
    solution = "a, b = map(int, input().split())\nprint(a + b)\n" + "# padding\n" * 5000  # several read chunks
    replies = [tool_call("editor", command="create", path="solution.py", file_text=solution),
               tool_call("bash", command="echo '20 22' | python3 solution.py"),
               tool_call("finish", answer="done")]
    result, llm = run_agent(sandbox, _tiny(), replies)
    assert result["finish_reason"] == "finish" and result["solution_source"] == "file"
    assert result["solution"] == solution and result["artifacts"] == {"solution.py": solution}
    assert [m["content"].strip() for m in llm.messages if m["role"] == "tool"][1] == "42"
    assert result["tool_calls"] == 3 and result["tool_errors"] == 0
    assert llm.messages[0]["role"] == "system" and "finish" in llm.messages[0]["content"]


def test_an_oversized_solution_file_is_no_solution(sandbox):
    huge = "x = 1\n" * (600 * 1024 // 6)
    result, _ = run_agent(sandbox, _tiny(), [tool_call("editor", command="create", path="solution.py", file_text=huge),
                                             tool_call("finish")])
    assert result["solution"] is None and "more than the" in result["solution_error"]


def test_run_takes_a_code_block_reply_when_no_file_was_written(sandbox):
    result, _ = run_agent(sandbox, _tiny(), ["Here it is:\n```python\nprint(sum(map(int, input().split())))\n```"])
    assert result["finish_reason"] == "answer" and result["solution_source"] == "text"
    assert result["solution"] == "print(sum(map(int, input().split())))\n"
    nothing, _ = run_agent(sandbox, _tiny(max_iterations=2), ["I am not sure.", "Still not sure."])
    assert nothing["solution"] is None and nothing["artifacts"] == {} and nothing["finish_reason"] == "max_iterations"


def test_handler_is_registered_under_its_aliases():
    from handlers import get_handler, registered_tasks
    assert "code" in registered_tasks()
    for alias in ("deepcoder", "eurus", "codeforces", "taco", "primeintellect", "livecodebench", "code_contests"):
        assert isinstance(get_handler(alias), CodeHandler)
