"""Each real harness (Claude Code, Codex, OpenCode) survives its RUN worker's death (issue 40,
part 5): a job of six model calls on ``prorl-swe__romanum-14``, its RUN worker SIGKILLed while
the scripted server holds call 3, and again while it holds call 5. The lease reaper retries the
job from INIT (a fresh sandbox); RUN runs the harness again against the journal: the journaled
calls are answered from it, every tool call is carried out again, each observation checked
against the journaled one (past the harness's declared volatile fields only: Codex's chunk id
and wall time), and the rest goes on live.

Checked against the scripted server's own log: no journaled call was asked again (0 tokens
generated again), the reward is the uninterrupted run's, every model turn's ids are what the
server generated, and each live turn's context is exactly what the server was sent. Each case
prints its numbers (``HARNESS-RESUME {...}``): journaled tokens, tokens generated again, and the
time from the kill to the job's end."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from handlers.agent_program.harnesses import HARNESSES
from handlers.tool_calls import tool_call
from handlers.volatile import normalise
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from tests.support.agents import ROMANUM_ID
from tests.support.harnesses import FIX, require_harness
from tests.support.services import (
    Gateway,
    LLMServer,
    eventually,
    kill_run_worker,
    killable_cluster,
    scripted_llm,
)

CALLS = 6  # model calls of each job: five shell commands, then the answer
DELAY_S = 1.0  # each scripted reply is held this long, so the kill lands inside a held call
TAG = "HARNESS-RESUME"
#: five commands whose output is the same on any fresh checkout, the gold fix among them
COMMANDS = ["grep -n '\"M\"' romanum/numerals.py", "grep -c '(' romanum/numerals.py", FIX,
            "grep -n '\"CM\"' romanum/numerals.py", "sed -n 1,3p romanum/numerals.py"]
DONE = "Added (900, \"CM\") to the numeral table."
#: (system prompt marker, shell tool, its arguments) of each harness
SHELLS = {"claude-code": ("Claude Agent SDK", "Bash", lambda c: {"command": c, "description": "run it"}),
          "codex": ("Codex CLI", "exec_command", lambda c: {"cmd": c}),
          "opencode": ("You are opencode", "bash", lambda c: {"command": c, "description": "run it"})}
TITLE = "You are a title generator"  # OpenCode's small model: its calls are not the main agent's

pytestmark = [pytest.mark.extended, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]


def rules() -> list[dict]:
    scripted = [{"match": TITLE, "scope": "prompt", "replies": ["Roman numeral 900 fix"]}]
    for marker, tool, args in SHELLS.values():
        replies = [f"Step {i + 1}.\n" + tool_call(tool, **args(c)) for i, c in enumerate(COMMANDS)] + [DONE]
        scripted.append({"match": f"(?s){marker}.*{TAG}", "scope": "prompt", "replies": replies,
                         "delay_s": DELAY_S})
    return scripted


@pytest.fixture(scope="module")
def llm(qwen3_tokenizer, tmp_path_factory) -> LLMServer:
    with scripted_llm(qwen3_tokenizer, tmp_path_factory, "harness-resume-llm", rules()) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(qwen3_tokenizer, llm, tmp_path_factory) -> LocalCluster:
    """A cluster of its own: its RUN worker is killed."""
    with killable_cluster("harness-resume", qwen3_tokenizer, llm, tmp_path_factory,
                          {Stage.INIT: 2, Stage.RUN: 4, Stage.EVAL: 2}) as local:
        yield local


def instance(agent: str, case: str) -> dict:
    from tests.support.swe import ROMANUM
    return {"data_source": "agent", "agent": agent, "swe": ROMANUM_ID, "max_iterations": 12,
            "task": f"{TAG} {agent} {case}\n\n{ROMANUM['problem_statement']}"}


def requests_of(llm: LLMServer, tokenizer, agent: str, case: str) -> list[dict]:
    """The server's requests of one job, each with ``main`` (not a small model's call) and
    ``turn`` (assistant turns in its prompt: which scripted reply it asks for)."""
    marker, found = f"{TAG} {agent} {case}\n", []
    for entry in llm.log():
        prompt = tokenizer.decode(entry["prompt_ids"])
        if marker in prompt:
            found.append({**entry, "main": TITLE not in prompt,
                          "turn": max(0, prompt.count("<|im_start|>assistant") - 1)})
    return found


def main_calls(requests: list[dict]) -> tuple[int, int]:
    """Main-agent calls answered, and those held now."""
    main = [r for r in requests if r["main"]]
    return sum(1 for r in main if r["finished"]), sum(1 for r in main if not r["finished"])


def run_job(gateway: Gateway, agent: str, case: str, attempts: int = 1) -> str:
    return gateway.submit(instance(agent, case), max_attempts=attempts)


def finished(result: dict) -> None:
    detail = (result.get("error"), result.get("detail"), (result.get("run_result") or {}).get("program"))
    assert result["status"] == "completed", detail
    assert '+    (900, "CM"),' in result["git_patch"], result["git_patch"]


def model_outputs(trajectory: dict) -> list[list[int]]:
    """Each sample's model turns' ids, in order (the main sample's and any small model's)."""
    samples = trajectory.get("samples") or [trajectory]
    return [[t for t, m in zip(s["response_ids"], s["response_mask"]) if m] for s in samples]


def tool_outputs(trajectory: dict) -> list[str]:
    return [m["content"] for m in trajectory["messages"] if m["role"] == "tool"]


def contexts(trajectory: dict) -> set[tuple[int, ...]]:
    """What each model turn of the trajectory was generated from, as its sample holds it."""
    samples = {s["sample"]: s for s in trajectory.get("samples") or [{**trajectory, "sample": 0}]}
    found = set()
    for turn in trajectory["turns"]:
        sample = samples[turn.get("sample", 0)]
        found.add(tuple((sample["prompt_ids"] + sample["response_ids"])[:turn["context_len"]]))
    return found


@pytest.fixture(scope="module")
def uninterrupted(cluster, llm, qwen3_hf_tokenizer) -> dict[str, dict]:
    """One run of each installed harness with no fault: the reward and outputs to compare with."""
    runs: dict[str, dict] = {}
    with Gateway(cluster) as gateway:
        for agent in HARNESSES:
            if not (HARNESSES[agent].host_dir() / HARNESSES[agent].executable).exists():
                continue
            result = gateway.result(run_job(gateway, agent, "whole"), wait=300)
            finished(result)
            assert result["resume"] is None
            assert main_calls(requests_of(llm, qwen3_hf_tokenizer, agent, "whole")) == (CALLS, 0)
            runs[agent] = result
    return runs


@pytest.mark.parametrize("kill_at", [3, 5])
@pytest.mark.parametrize("agent", list(HARNESSES))
def test_a_harness_resumes_after_its_run_worker_is_killed(cluster, llm, qwen3_hf_tokenizer, uninterrupted, agent,
                                                          kill_at):
    require_harness(agent)
    case = f"kill{kill_at}"
    with Gateway(cluster) as gateway:
        job_id = run_job(gateway, agent, case, attempts=2)
        # call ``kill_at`` held by the server: calls 1 .. kill_at - 1 answered (and journaled)
        eventually(lambda: main_calls(requests_of(llm, qwen3_hf_tokenizer, agent, case)) == (kill_at - 1, 1), 240,
                   f"{agent}'s call {kill_at} held")
        killed_at = time.time()
        kill_run_worker(cluster, 4)
        result = gateway.result(job_id, wait=300)
        ended_s = time.time() - killed_at
    finished(result)
    whole = uninterrupted[agent]
    assert (result["attempt"], result["reward"]) == (2, whole["reward"]), result["error"]
    resume = result["resume"]
    assert resume["resumed"] is True, resume

    served = requests_of(llm, qwen3_hf_tokenizer, agent, case)
    before = [r for r in served if r["started"] < killed_at]
    after = [r for r in served if r["started"] >= killed_at]
    journaled = {(r["main"], r["turn"]) for r in before if r["finished"] and not r["aborted"]}
    journaled_tokens = sum(len(r["output_ids"]) for r in before if (r["main"], r["turn"]) in journaled)
    again = [r for r in after if (r["main"], r["turn"]) in journaled]
    regenerated = sum(len(r["output_ids"]) for r in again)
    assert regenerated == 0, [(r["main"], r["turn"]) for r in again]  # no journaled token generated twice
    assert resume["replayed_tokens"] == journaled_tokens, (resume, journaled_tokens)
    assert main_calls(after) == (CALLS - kill_at + 1, 0)  # the held call again, then the rest

    # every model turn is what the server generated, and the same as the uninterrupted run's
    assert model_outputs(result["trajectory"]) == model_outputs(whole["trajectory"])
    # each call answered after the kill is in the trajectory at exactly the context the server saw
    live = {tuple(r["prompt_ids"]) for r in after if r["finished"] and not r["aborted"]}
    assert live <= contexts(result["trajectory"])
    # the declaration is right: this run's tool outputs are the uninterrupted run's, to the
    # character for a harness that declares nothing, past the declared fields for one that does
    volatile = HARNESSES[agent].volatile
    now, then = tool_outputs(result["trajectory"]), tool_outputs(whole["trajectory"])
    assert [normalise(t, volatile) for t in now] == [normalise(t, volatile) for t in then]
    if volatile:  # its tools' own fields differ on every run: looked past, and counted
        assert now != then and resume["observations_normalised"] >= 1, resume
    else:
        assert now == then and "observations_normalised" not in resume
    print("HARNESS-RESUME", json.dumps({
        "agent": agent, "killed_at_call": kill_at, "journaled_tokens": journaled_tokens,
        "regenerated_tokens": regenerated, "kill_to_end_s": round(ended_s, 1),
        "observations_checked": resume["observations_checked"],
        "observations_normalised": resume.get("observations_normalised"), "first_tool_output": now[0][:160],
        "first_call_after_kill_s": round(min(r["started"] for r in after) - killed_at, 1),
        "timing": result["timing"]}))
