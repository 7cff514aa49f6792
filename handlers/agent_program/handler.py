"""AgentProgramHandler: any agent program, run in the sandbox against the job's own LLM endpoint.

INIT starts the sandbox (the swe repository's bundle bound in when the instance has one),
checks the repository out, and places the task files (``/workspace/.prorl/task.md`` and the
instance's ``files``). For RUN the pipeline serves the job's OpenAI-compatible endpoint (this
handler's ``endpoint_request``) on a Unix socket in the sandbox's socket directory, attached to
the job's token session, and hands it in as ``job.endpoint``; RUN runs the program through the
in-sandbox runner
(:mod:`singularity.toolserver.agentrun`), which gives it ``OPENAI_BASE_URL`` on a loopback port
and ``OPENAI_API_KEY`` (a random key of this job). After the program, RUN collects what the
evaluator needs (the repository's diff, the answer file, a command's exit code). EVAL scores it.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, ClassVar

from handlers.agent_program.harnesses import small_model
from handlers.agent_program.instances import TASK_DIR, TASK_FILE, AgentInstance, normalize_instance
from handlers.base import AgentHandler, ChatLLM, EndpointRequest, EvalResult, JobContext, SandboxRequest
from handlers.sandbox_files import SandboxCommandError, read_bytes, sh, write_text
from handlers.swe.handler import BUNDLE_MOUNT, SweHandler, checkout_command
from prorl_celery.core.errors import AgentFailure, EnvironmentFailure, EvalUnavailable
from singularity.requirements import (
    BASH,
    GIT,
    MATH_VERIFY,
    PTYPROCESS,
    PYTEST,
    PYTHON3,
    TIMEOUT,
    TOOL_SERVER,
    Requirement,
)

RUN_CONFIG = f"{TASK_DIR}/run.json"
AGENT_LOG = f"{TASK_DIR}/agent.log"
LOG_TAIL_BYTES = 8000
#: time RUN keeps, out of the job's budget, to collect the outcome after the program
COLLECT_S = 30.0


class AgentProgramHandler(AgentHandler[ChatLLM]):
    """Task ``agent``: bring your own agent (see ``instances`` for the instance format)."""

    name: ClassVar[str] = "agent"
    #: the program is run again against the journaled answers; where it asks anything else (it is
    #: not deterministic), the rollout restarts from turn zero and its result says so
    replayable_tools: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("agent_program", "byo_agent")
    node_local: ClassVar[bool] = True
    #: the program runs through the tool server's shell; a swe instance needs git, and its
    #: evaluator the swe one's runner, a math one the grader (``requirements`` picks per job)
    requires: ClassVar[tuple[Requirement, ...]] = (*TOOL_SERVER, PTYPROCESS, BASH, PYTHON3, GIT, PYTEST, TIMEOUT,
                                                   MATH_VERIFY)

    def requirements(self, job: JobContext) -> tuple[Requirement, ...]:
        instance: AgentInstance = self.instance_of(job)
        needed = [*TOOL_SERVER, PTYPROCESS, BASH, PYTHON3]
        if instance.swe is not None:
            needed.append(GIT)
        needed += {"swe": [PYTEST, TIMEOUT], "math": [MATH_VERIFY]}.get(instance.evaluator_type, [])
        if instance.harness is not None:  # not installed: a missing requirement, never a reward
            needed += instance.harness.requirements()
        return tuple(needed)

    def parse_instance(self, instance: dict[str, Any]) -> AgentInstance:
        return normalize_instance(instance)

    def sandbox_request(self, job: JobContext) -> SandboxRequest:
        return self._sandbox(self.instance_of(job), agent=True)

    def eval_sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        instance: AgentInstance = self.instance_of(job)
        return self._sandbox(instance) if instance.evaluator_type == "swe" else None

    @staticmethod
    def _sandbox(instance: AgentInstance, agent: bool = False) -> SandboxRequest:
        binds: tuple[tuple[str, str], ...] = ((str(instance.swe.bundle.parent), BUNDLE_MOUNT),) if instance.swe else ()
        if agent and instance.harness is not None:  # the harness, read-only (EVAL does not run it)
            binds += (instance.harness.bind(),)
        # agent programs are whole Python applications (litellm alone maps over 1 GiB)
        return SandboxRequest(binds=binds, memory_bytes=16 * 2**30, max_processes=1024)

    async def init(self, job: JobContext) -> dict[str, Any]:
        instance: AgentInstance = self.instance_of(job)
        if instance.swe is not None:
            await sh(job.sandbox, checkout_command(instance.swe), timeout_s=120)
        await sh(job.sandbox, f"mkdir -p {TASK_DIR} {shlex.quote(instance.cwd)}")
        await write_text(job.sandbox, TASK_FILE, instance.task)
        for path, text in instance.harness_files().items():  # its configuration (no key in it)
            await sh(job.sandbox, f"mkdir -p \"$(dirname {shlex.quote(path)})\"")
            await write_text(job.sandbox, path, text)
        for path, text in instance.files.items():
            await sh(job.sandbox, f"mkdir -p \"$(dirname {shlex.quote('/workspace/' + path)})\"")
            await write_text(job.sandbox, f"/workspace/{path}", text)
        return {"cwd": instance.cwd, "agent": instance.agent, "evaluator": instance.evaluator_type,
                "files": sorted(instance.files)}

    def _max_calls(self, job: JobContext, instance: AgentInstance) -> int:
        if "max_iterations" in job.instance:
            return instance.max_iterations
        return int(job.agent_params.get("max_iterations") or instance.max_iterations)

    def endpoint_request(self, job: JobContext) -> EndpointRequest:
        """The program's LLM: the job's endpoint, named by the instance's ``model``."""
        instance: AgentInstance = self.instance_of(job)
        small = (small_model(instance),) if instance.harness is not None else ()
        return EndpointRequest(model=instance.model, max_calls=self._max_calls(job, instance), auxiliary_models=small,
                               volatile_fields=instance.volatile_fields)

    async def run(self, job: JobContext, llm: ChatLLM) -> dict[str, Any]:
        """Run the program against ``job.endpoint`` (its calls go through ``llm``, the job's
        token session), then collect what the evaluator needs."""
        instance: AgentInstance = self.instance_of(job)
        if job.sandbox is None or job.endpoint is None:
            raise RuntimeError("the agent task needs its sandbox and its endpoint")
        argv, env = instance.program()
        outcome: dict[str, Any] = {}
        try:
            config = {"socket": job.endpoint.socket, "key": job.endpoint.key, "argv": argv, "env": env,
                      "cwd": instance.cwd, "log": AGENT_LOG, "model": job.endpoint.model}
            await write_text(job.sandbox, RUN_CONFIG, json.dumps(config))
            left = job.time_left()
            timeout_s = max(5.0, (left - COLLECT_S) if left is not None else 24 * 3600.0)
            result = await job.sandbox.bash(
                f"python3 -m singularity.toolserver.agentrun {shlex.quote(RUN_CONFIG)}", timeout_s=timeout_s)
            outcome["program"] = _program_result(result, argv)
        finally:
            outcome["endpoint"] = job.endpoint.summary()
        outcome["program"]["log_tail"] = await _log_tail(job.sandbox)
        outcome.update(await self._collect(job, instance))
        outcome["finish_reason"] = outcome["program"].get("stopped") or "exit"
        _check_exit(outcome)
        return outcome

    async def _collect(self, job: JobContext, instance: AgentInstance) -> dict[str, Any]:
        """What the evaluator needs, taken before the sandbox closes."""
        kind = instance.evaluator_type
        if kind == "swe":
            assert instance.swe is not None, "normalize_instance refuses evaluator 'swe' without 'swe'"
            return await SweHandler()._take_patch(job, instance.swe)
        if kind == "math":
            path = "/workspace/" + instance.evaluator["answer_file"]
            try:
                data = await read_bytes(job.sandbox, path, limit_bytes=2**20)
            except (SandboxCommandError, ValueError) as error:
                return {"answer": None, "answer_error": str(error)}
            return {"answer": None if data is None else data.decode("utf-8", "replace")}
        if kind == "command":
            timeout_s = float(instance.evaluator.get("timeout_s", 120))
            result = await job.sandbox.bash(f"cd {shlex.quote(instance.cwd)} && {instance.evaluator['command']}",
                                            timeout_s=timeout_s)
            return {"command_eval": {"exit_code": result.exit_code, "timed_out": result.timed_out,
                                     "output_tail": result.output[-4000:]}}
        return {}

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        """The run's outcome when the program failed after it ran (its exit code, log tail and
        what was collected, so EVAL can judge an agent that ran out of calls), else the error."""
        collected = getattr(error, "run_outcome", None)
        if collected is not None:
            return {**collected, "finish_reason": "error", "error": f"{type(error).__name__}: {error}"}
        return {"finish_reason": "error", "error": f"{type(error).__name__}: {error}", "patch": ""}

    async def eval(self, job: JobContext) -> EvalResult:
        instance: AgentInstance = self.instance_of(job)
        kind = instance.evaluator_type
        run = job.run_result
        if kind == "swe":
            assert instance.swe_row is not None, "normalize_instance refuses evaluator 'swe' without 'swe'"
            swe_job = dataclasses.replace(job, task="swe", instance=instance.swe_row, parsed_instance=instance.swe)
            result = await SweHandler().eval(swe_job)
            return result
        if kind == "math":
            from handlers.math.grading import extract_boxed, is_equivalent
            text = run.get("answer")
            answer = (extract_boxed(text) or text.strip()) if isinstance(text, str) else None
            truth = str(instance.evaluator["ground_truth"])
            correct = answer is not None and is_equivalent(answer, truth)
            return EvalResult(1.0 if correct else 0.0, {"answer": answer, "ground_truth": truth, "correct": correct})
        if kind == "command":
            check = run.get("command_eval") or {}
            passed = check.get("exit_code") == 0 and not check.get("timed_out")
            return EvalResult(1.0 if passed else 0.0, {"command": instance.evaluator["command"], **check})
        if kind == "none":  # asked for: a trajectory with no judgement, whose reward is null
            return EvalResult(None, {"reason": "the instance has no evaluator (evaluator: none)"})
        raise EvalUnavailable(f"the instance has an evaluator the agent task does not know ({kind!r})")

    def final_result(self, job: JobContext) -> dict[str, Any]:
        run = job.run_result
        extra: dict[str, Any] = {"artifacts": {k: run[k] for k in ("patch", "answer") if run.get(k) is not None}}
        if "patch" in run:
            extra["git_patch"] = run.get("patch") or ""
        if run.get("endpoint") is not None:
            extra["endpoint"] = {k: v for k, v in run["endpoint"].items() if k != "calls_log"}
        if run.get("program") is not None:  # its exit code, why it was stopped, its log's tail
            extra["program"] = run["program"]
        return extra


#: the endpoint's refusals that are the policy's own limits: a program that exits non-zero after
#: one ran out of turns, context or time, as an agent loop would stop
POLICY_LIMITS = frozenset({"max_iterations", "time_budget", "context_length_exceeded"})


def _check_exit(outcome: dict[str, Any]) -> None:
    """An agent program that exited non-zero on its own did not finish its rollout: the
    policy's failure (``AgentFailure``, judged) when the endpoint had refused it a call for one
    of the policy's limits, else the harness's (``EnvironmentFailure``, retried). Either carries
    the outcome, so the result keeps the exit code and log tail."""
    program = outcome.get("program") or {}
    code = program.get("exit_code")
    if code in (0, None) or program.get("stopped"):
        return
    refused = set((outcome.get("endpoint") or {}).get("refused") or {})
    tail = " ".join(str(program.get("log_tail") or program.get("runner_output") or "").split())[-300:]
    kind: type[AgentFailure | EnvironmentFailure] = AgentFailure if refused & POLICY_LIMITS else EnvironmentFailure
    error = kind(f"the agent program exited with code {code}"
                 + (f" after the endpoint refused {sorted(refused)}" if refused else "") + f"; log tail: {tail!r}")
    setattr(error, "run_outcome", outcome)  # noqa: B010 - read back by run_exception
    raise error


def _program_result(result: Any, argv: list[str]) -> dict[str, Any]:
    """The runner's result line (exit code, why it was stopped), or what the shell saw."""
    from singularity.toolserver.agentrun import RESULT_PREFIX

    summary: dict[str, Any] = {"argv": argv[:3] + (["..."] if len(argv) > 3 else []), "timed_out": result.timed_out}
    for line in reversed(result.output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            summary.update(json.loads(line[len(RESULT_PREFIX):]))
            break
    else:
        summary.update(exit_code=result.exit_code, stopped="timeout" if result.timed_out else None,
                       runner_output=result.output[-2000:])
    return summary


async def _log_tail(sandbox: Any) -> str:
    try:
        return await sh(sandbox, f"tail -c {LOG_TAIL_BYTES} {AGENT_LOG} 2>/dev/null || true", check=False)
    except Exception:  # noqa: BLE001 - the sandbox may be gone; the outcome matters more
        return ""
