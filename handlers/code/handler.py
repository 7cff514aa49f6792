"""CodeHandler: the agent writes a solution with the editor and tries it with bash; hidden tests
judge it in a fresh sandbox.

INIT builds the prompt (the hidden tests stay in ``job.instance`` on the worker side, nothing is
written into the agent's sandbox). RUN runs the agent loop (editor, bash, optionally python,
finish) and, before the sandbox is closed, reads ``/workspace/solution.py`` out of it; a reply
with a ```python block and no tool call also ends the run, its code being the solution when no
file was written. That source is the artifact. EVAL gets a fresh sandbox
(``eval_sandbox_request``), writes the judge, the solution and the test inputs into it, runs
every test under its time and memory limits and compares the outputs here, on the worker.
"""
from __future__ import annotations

import json
import re
import uuid
from importlib import resources
from typing import Any, ClassVar

from handlers.agent import AgentLoop
from handlers.base import AgentHandler, ChatLLM, EvalResult, JobContext, SandboxRequest
from handlers.code.grading import summarize, verdict
from handlers.code.instances import (
    SOLUTION_FILE,
    CodeInstance,
    normalize_instance,
)
from handlers.sandbox_files import SandboxCommandError, SandboxFileTooLarge, read_bytes, write_text
from handlers.sandbox_tools import BASH, EDITOR, PYTHON
from prorl_celery.core.errors import EvalUnavailable
from singularity.requirements import PYTHON3, TOOL_SERVER, Requirement

_TOOLS = {"editor": EDITOR, "bash": BASH, "python": PYTHON}
_CODE_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_SOLUTION_BYTES = 512 * 1024
#: stdout kept per stdin/stdout test beyond the expected output's size (a longer one is wrong)
OUTPUT_SLACK_BYTES = 64 * 1024
CALL_OUTPUT_CAP = 8 * 2**20
#: the eval sandbox's own per-process address space: the tool server and judge need room too
EVAL_SANDBOX_HEADROOM = 1 * 2**30


def extract_code(text: str) -> str | None:
    """The last fenced Python block of a reply (the usual single-turn answer format), or None."""
    blocks = [block for block in _CODE_BLOCK.findall(text or "") if block.strip()]
    return blocks[-1] if blocks else None


class CodeHandler(AgentHandler[ChatLLM]):
    """Task ``code``: stdin/stdout, function-call and pytest-style problems; reward 1.0 only
    when every hidden test passes (the fraction passed and per-test verdicts in the details)."""

    name: ClassVar[str] = "code"
    #: its tools answer the same actions alike on a fresh sandbox: a crashed RUN resumes by replay
    replayable_tools: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = (
        "deepcoder", "eurus", "codeforces", "taco", "primeintellect", "livecodebench", "code_contests",
        "apps", "kodcode", "leetcode")
    tool_timeout_s: ClassVar[float] = 30.0
    min_context_tokens: ClassVar[int] = 64
    #: seconds the eval's judge call may take beyond the sum of its tests' wall-clock limits
    judge_margin_s: ClassVar[float] = 30.0
    requires: ClassVar[tuple[Requirement, ...]] = (
        *TOOL_SERVER, PYTHON3, *(r for tool in _TOOLS.values() for r in tool.requires))

    def parse_instance(self, instance: dict[str, Any]) -> CodeInstance:
        return normalize_instance(instance)

    def sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        return SandboxRequest(max_processes=256)

    def eval_sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        """A fresh sandbox when there is a solution to judge (none: reward 0 without one)."""
        if not job.run_result.get("solution"):
            return None
        memory = self.instance_of(job).memory_mb * 2**20
        return SandboxRequest(memory_bytes=max(4 * 2**30, memory + EVAL_SANDBOX_HEADROOM), max_processes=256)

    async def init(self, job: JobContext) -> dict[str, Any]:
        """``{"messages", "max_iterations", "tools", "style", "metadata"}``; the tests stay out."""
        code: CodeInstance = self.instance_of(job)
        return {"messages": code.messages, "max_iterations": code.max_iterations, "tools": list(code.tools),
                "style": code.style, "tests": len(code.tests), "metadata": code.metadata}

    async def run(self, job: JobContext, llm: ChatLLM) -> dict[str, Any]:
        """The agent loop, then the solution read out of the sandbox before it is closed."""
        code: CodeInstance = self.instance_of(job)
        loop = AgentLoop(tools=[_TOOLS[name] for name in code.tools],
                         max_iterations=code.max_iterations, tool_timeout_s=self.tool_timeout_s,
                         min_context_tokens=self.min_context_tokens, answer_in_text=extract_code)
        outcome = await loop.run(job, llm, code.messages)
        solution, source, problem = None, None, None
        if job.sandbox is not None:
            try:
                data = await read_bytes(job.sandbox, f"/workspace/{SOLUTION_FILE}", MAX_SOLUTION_BYTES)
            except (SandboxFileTooLarge, SandboxCommandError) as error:  # judged as no solution
                data, problem = None, str(error)
            if data is not None and data.strip():
                solution, source = data.decode("utf-8", "replace"), "file"
        if solution is None and outcome.get("answer"):
            # a finish(answer=...) or a reply whose code block ended the run
            finished_in_text = outcome["finish_reason"] == "answer"
            solution = extract_code(outcome["answer"]) or (outcome["answer"] if finished_in_text else None)
            source = "text" if solution else None
        artifacts = {SOLUTION_FILE: solution} if solution is not None else {}
        result = {**outcome, "solution": solution, "solution_source": source, "artifacts": artifacts}
        return {**result, "solution_error": problem} if problem else result

    async def eval(self, job: JobContext) -> EvalResult:
        """Run every hidden test in the fresh sandbox; reward 1.0 only when all pass."""
        solution = job.run_result.get("solution")
        # the hidden tests come from the instance itself: they were never copied anywhere else
        code: CodeInstance = self.instance_of(job)
        if not solution:
            details: dict[str, Any] = {
                "error": job.run_result.get("solution_error") or "no solution was produced", "reward": 0.0,
                "passed": 0, "total": len(code.tests), "fraction_passed": 0.0, "counts": {},
                "verdicts": [], "style": code.style}
            return EvalResult(0.0, details)
        if job.sandbox is None:
            raise RuntimeError("the code handler's EVAL needs its fresh sandbox (eval_sandbox_request)")
        tests = judge_tests(code)
        reports = await run_judge(job.sandbox, solution, code, tests, job_id=job.job_id,
                                  timeout_s=self._judge_timeout(job, tests))
        broken = [f"test {i}: {r['judge_error']}" for i, r in enumerate(reports) if "judge_error" in r]
        if broken:  # the judge itself failed, not the solution: no verdict, never a 0
            raise EvalUnavailable(f"the judge could not run {len(broken)} of {len(tests)} tests; {broken[0]}")
        results: list[dict[str, Any]] = []
        for index, (test, report) in enumerate(zip(tests, reports)):
            name, reason = verdict(report, test, code.float_tolerance)
            results.append({"test": index, "verdict": name, "reason": reason, "cpu_s": report.get("cpu_s"),
                            "wall_s": report.get("wall_s"), "max_rss_bytes": report.get("max_rss_bytes")})
        summary = summarize([r["verdict"] for r in results])
        details = {**summary, "verdicts": results, "style": code.style,
                   "time_limit_s": code.time_limit_s, "memory_mb": code.memory_mb}
        return EvalResult(summary["reward"], details)

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        """Same keys as ``run``: EVAL then scores "no solution" (reward 0)."""
        return {"answer": None, "finish_reason": "error", "iterations": None, "solution": None,
                "solution_source": None, "artifacts": {}, "error": f"{type(error).__name__}: {error}"}

    async def eval_exception(self, job: JobContext, error: BaseException) -> EvalResult:
        return EvalResult(0.0, {"reward": 0.0, "error": f"{type(error).__name__}: {error}", "verdicts": []})

    def _judge_timeout(self, job: JobContext, tests: list[dict[str, Any]]) -> float:
        total = sum(t["time_limit_s"] * t["wall_factor"] + 1.5 for t in tests) + self.judge_margin_s
        left = job.time_left()
        return total if left is None else max(1.0, min(total, left))


def judge_tests(code: CodeInstance, wall_factor: float = 3.0) -> list[dict[str, Any]]:
    """The hidden tests with their limits, as the grader needs them (expected outputs included)."""
    memory = code.memory_mb * 2**20
    tests = []
    for test in code.tests:
        entry = {**test, "time_limit_s": code.time_limit_s, "memory_bytes": memory, "wall_factor": wall_factor}
        if test["kind"] == "stdio":
            entry["output_cap"] = len(test["output"].encode()) * 2 + OUTPUT_SLACK_BYTES
        else:
            entry["output_cap"] = CALL_OUTPUT_CAP
        tests.append(entry)
    return tests


def _manifest_entry(test: dict[str, Any]) -> dict[str, Any]:
    """What the sandbox may see of a test: its input and limits, never the expected output."""
    entry = {k: test[k] for k in ("kind", "time_limit_s", "memory_bytes", "wall_factor", "output_cap")}
    if test["kind"] == "stdio":
        entry["input"] = test["input"]
    elif test["kind"] == "call":
        entry["args"] = test["args"]
    else:
        entry.update(test_file="hidden_tests.py", test_name=test["test_name"])
    return entry


async def run_judge(sandbox: Any, solution: str, code: CodeInstance, tests: list[dict[str, Any]], *,
                    job_id: str, timeout_s: float) -> list[dict[str, Any]]:
    """Write the judge, solution and inputs into the sandbox, run them, return one report per test."""
    root = f"/workspace/.judge-{uuid.uuid4().hex[:8]}"
    judge = resources.files("handlers.code").joinpath("judge.py").read_text("utf-8")
    manifest: dict[str, Any] = {"solution": SOLUTION_FILE, "tests": [_manifest_entry(t) for t in tests],
                "files": {"hidden_tests.py": code.test_code} if code.test_code else {},
                "env": {"PRORL_CODE_JOB": job_id}}  # lets an operator (or a test) find a job's processes
    if code.fn_name:
        for entry in manifest["tests"]:
            entry["fn_name"] = code.fn_name
    await write_text(sandbox, f"{root}/judge.py", judge)
    await write_text(sandbox, f"{root}/{SOLUTION_FILE}", solution)
    await write_text(sandbox, f"{root}/manifest.json", json.dumps(manifest))
    result = await sandbox.bash(f"python3 {root}/judge.py {root}/manifest.json {root}/results.json",
                                timeout_s=timeout_s)
    if result.timed_out:
        raise EvalUnavailable(f"the judge did not finish within {timeout_s:g} s")
    data = await read_bytes(sandbox, f"{root}/results.json", sum(t["output_cap"] for t in tests) * 2 + 2**20)
    if data is None:
        raise EvalUnavailable(f"the judge wrote no results: {result.output.strip()[-500:]}")
    reports = json.loads(data)["reports"]
    if len(reports) != len(tests):
        raise EvalUnavailable(f"the judge reported {len(reports)} tests of {len(tests)}")
    return reports
