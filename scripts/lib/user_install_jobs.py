"""The jobs of scripts/user_install_check.sh: one per domain, with the reward each must get and a
check that the tools it used really ran (a scripted model states its answer whatever a tool
printed, so a reward alone would not show that the python tool, the search index, the judge or
pytest worked). The scripted replies are in tests/data/user_install_rules.json, matched by the
markers and texts these instances carry.

Imports only the shipped sample data of the handlers: what a user's install has.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handlers.code import load_problems
from handlers.stem import DATA_DIR as STEM_DATA
from handlers.swe import load_instances

Check = Callable[[dict[str, Any]], "str | None"]

#: a stdlib-only agent program (the user's install has no openai SDK): chat completions with a
#: python function tool on the job's endpoint, the final text written to answer.txt
STDLIB_AGENT = r'''
import json, os, subprocess, sys, urllib.request

base, key = os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ["OPENAI_API_KEY"]
tools = [{"type": "function", "function": {"name": "python", "description": "run Python code",
          "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
messages = [{"role": "system", "content": "You solve problems with a python tool."},
            {"role": "user", "content": open(os.environ["PRORL_TASK_FILE"]).read()}]
for _ in range(5):
    body = json.dumps({"model": os.environ["PRORL_LLM_MODEL"], "messages": messages, "tools": tools}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.load(response)["choices"][0]["message"]
    message = {"role": "assistant", "content": reply.get("content") or ""}
    if reply.get("tool_calls"):
        message["tool_calls"] = reply["tool_calls"]
    messages.append(message)
    if not reply.get("tool_calls"):
        open("answer.txt", "w").write(message["content"])
        break
    for call in reply["tool_calls"]:
        code = json.loads(call["function"]["arguments"])["code"]
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
print("done")
'''


@dataclass
class Job:
    """A job body for POST /jobs, the reward it must end with, and what else must hold."""

    name: str
    instance: dict[str, Any]
    reward: float
    check: Check = field(default=lambda result: None)

    def body(self, timeout_s: float) -> dict[str, Any]:
        return {"instance": self.instance, "timeout_s": timeout_s,
                "sampling_params": {"temperature": 0.0, "max_tokens": 1024, "seed": 7}}


def tool_outputs(result: dict[str, Any]) -> list[str]:
    messages = result.get("messages") or (result.get("trajectory") or {}).get("messages") or []
    return [str(m.get("content", "")) for m in messages if m.get("role") == "tool"]


def tool_printed(index: int, expected: str, tool: str) -> Check:
    """The ``index``-th tool observation is ``expected`` (whitespace aside)."""
    def check(result: dict[str, Any]) -> str | None:
        outputs = tool_outputs(result)
        got = outputs[index] if len(outputs) > index else None
        if got is None or got.split() != expected.split():
            return f"the {tool} tool printed {got!r}, not {expected!r}"
        return None
    return check


def both(*checks: Check) -> Check:
    def check(result: dict[str, Any]) -> str | None:
        return next((problem for c in checks if (problem := c(result))), None)
    return check


def tests_ran(result: dict[str, Any]) -> str | None:
    """The hidden tests ran and their report was read: every FAIL_TO_PASS and PASS_TO_PASS test
    has a status of its own (``missing`` is what a run with no report gives them all)."""
    evaluation = result.get("eval") or {}
    statuses = evaluation.get("tests") or {}
    missing = sorted(test for test, status in statuses.items() if status == "missing")
    if not statuses or missing or evaluation.get("problem"):
        return (f"the hidden tests did not run: {evaluation.get('problem') or 'no statuses'} "
                f"({len(missing)} of {len(statuses)} tests missing, pytest exit code "
                f"{evaluation.get('pytest_exit_code')!r})")
    return None


def math_with_python() -> Job:
    instance = {"data_source": "math", "problem": "UIC-MATH: What is 6 * 7? Use the python tool.",
                "answer": "42", "tools": ["python"], "max_iterations": 3}
    return Job("math+python", instance, 1.0, tool_printed(0, "42", "python"))


def code() -> Job:
    problem = next(p for p in load_problems() if p["id"] == "code-001")
    row = {key: value for key, value in problem.items() if key != "id"}
    instance = {**row, "data_source": "codeforces", "problem": f"[UIC-CODE] {row['problem']}"}
    return Job("code", instance, 1.0, tool_printed(1, "42 0", "bash"))


def romanum() -> dict[str, Any]:
    return next(row for row in load_instances() if row["instance_id"] == "prorl-swe__romanum-14")


def swe_gold() -> Job:
    """The scripted model makes the gold fix with the editor (the rules' romanum replies)."""
    return Job("swe gold patch", {**romanum(), "data_source": "swe"}, 1.0, tests_ran)


def swe_no_change() -> Job:
    row = romanum()
    instance = {**row, "data_source": "swe", "problem_statement": f"UIC-SWE-NOCHANGE\n{row['problem_statement']}"}
    return Job("swe no change", instance, 0.0, tests_ran)


def stem() -> Job:
    with open(STEM_DATA / "questions.jsonl", encoding="utf-8") as handle:
        water = next(row for row in map(json.loads, handle) if row["id"] == "stem-001")

    def searched(result: dict[str, Any]) -> str | None:
        first = "".join(tool_outputs(result)[:1])
        return None if "1.008" in first else f"the search tool found no hydrogen passage: {first[:300]!r}"
    return Job("stem", {"data_source": "stem", **water}, 1.0, both(searched, tool_printed(1, "18.015", "python")))


def agent() -> Job:
    instance = {"data_source": "agent", "command": "python3 agent.py", "task": "UIC-AGENT: What is 6 * 7?",
                "files": {"agent.py": STDLIB_AGENT},
                "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}}

    def check(result: dict[str, Any]) -> str | None:
        calls = (result.get("endpoint") or {}).get("calls")
        return None if calls == 2 else f"the agent made {calls!r} calls to its endpoint, not 2"
    return Job("agent", instance, 1.0, both(check, tool_printed(0, "42", "python (the agent's)")))


def phase_one() -> list[Job]:
    return [math_with_python(), code(), swe_gold(), swe_no_change(), stem(), agent()]


# -- phase 2 ---------------------------------------------------------------------------------

NOT_SCORED = ("eval_error", "env_error")


def swe_without_pytest_is_not_scored(result: dict[str, Any]) -> str | None:
    """With pytest gone from the install, the gold patch's job must end eval_error (or env_error)
    with reward_valid false and a detail naming pytest: never a valid reward of 0."""
    outcome, valid, detail = result.get("outcome"), result.get("reward_valid"), result.get("detail") or ""
    if outcome in NOT_SCORED and valid is False and "pytest" in detail.lower():
        return None
    reason = (result.get("eval") or {}).get("reason")
    return (f"ended {result.get('status')} with reward {result.get('reward')!r}, outcome {outcome!r}, "
            f"reward_valid {valid!r}, detail {detail!r} (eval reason {reason!r}): a missing pytest must end "
            f"{' or '.join(NOT_SCORED)} with reward_valid false and a detail naming pytest")
