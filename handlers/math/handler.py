"""MathHandler: answer a math problem in one or more model turns, graded against a rule.

INIT normalises the instance (see ``instances``); RUN asks the model, and when a reply has no
boxed answer and turns remain, asks once more for the final answer; EVAL grades the answer
(see ``grading``). No sandbox: every stage can run on any node.
"""
from __future__ import annotations

from typing import Any, ClassVar

from handlers.base import AgentHandler, ChatLLM, EvalResult, JobContext, SandboxRequest
from handlers.math import python_tool
from handlers.math.python_tool import PYTHON_TOOL
from handlers.tools import parse_tool_calls
from handlers.math.grading import extract_boxed, is_equivalent
from handlers.math.instances import normalize_instance, validate_instance

FOLLOW_UP = (
    "Your reply does not contain a final answer in the required format. "
    "Please state your final answer, in simplest form, inside \\boxed{}."
)


class MathHandler(AgentHandler):
    """Task ``math``: plain problem/answer pairs and verl-style rule-graded rows.

    One instance serves every job of its process, from several threads at once: it keeps no
    per-job state, everything travels in ``JobContext``.
    """

    name: ClassVar[str] = "math"
    aliases: ClassVar[tuple[str, ...]] = ("deepscaler", "dapo_math", "math_dapo", "gsm8k", "math500", "aime")
    node_local: ClassVar[bool] = False
    #: Below this many tokens of context left, another turn could not hold a useful answer.
    min_context_tokens: ClassVar[int] = 64
    #: time one python tool call may take inside the sandbox
    tool_timeout_s: ClassVar[float] = 30.0

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Raise ValueError naming the missing or wrong field (the gateway returns 400)."""
        validate_instance(instance)
        tools = instance.get("tools")
        if tools is not None and (not isinstance(tools, list) or set(tools) - {"python"}):
            raise ValueError("'tools' must be a list of known tools: [\"python\"]")

    async def init(self, job: JobContext) -> dict[str, Any]:
        """Return ``{"messages", "ground_truth", "max_iterations", "metadata"}``."""
        normalized = normalize_instance(job.instance)
        return {
            "messages": normalized.messages,
            "ground_truth": normalized.ground_truth,
            "max_iterations": normalized.max_iterations,
            "metadata": normalized.metadata,
        }

    async def run(self, job: JobContext, llm: ChatLLM) -> dict[str, Any]:
        """Converse until a boxed answer appears.

        Returns ``{"answer": str | None, "iterations": int, "finish_reason": str}``, where
        ``finish_reason`` is ``"answer"``, ``"max_iterations"`` (turns used up without an
        answer), ``"context"`` (too little context left for another turn) or ``"time"`` (the
        job's budget ran out between turns).
        """
        setup = job.init_result if "messages" in job.init_result else await self.init(job)
        use_python = job.sandbox is not None
        llm.start(setup["messages"], tools=[PYTHON_TOOL] if use_python else None)
        max_iterations = int(setup.get("max_iterations", 1))
        answer: str | None = None
        iterations = tool_calls = 0
        observed = False  # the last turn called tools: the model continues from their output
        finish_reason = "max_iterations"
        while iterations < max_iterations:
            stop = self._stop_reason(job, llm)
            if stop is not None:
                finish_reason = stop
                break
            if iterations > 0 and not observed:
                llm.add_message("user", FOLLOW_UP)
            generation = await llm.generate()
            iterations += 1
            answer = extract_boxed(generation.text)
            if answer is not None:
                finish_reason = "answer"
                break
            calls = parse_tool_calls(generation.text) if use_python else []
            for call in calls:
                llm.add_message("tool", await python_tool.execute(job.sandbox, call, self.tool_timeout_s))
            tool_calls += len(calls)
            observed = bool(calls)
        return {"answer": answer, "iterations": iterations, "finish_reason": finish_reason,
                "tool_calls": tool_calls}

    def sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        """Jobs with ``"tools": ["python"]`` get a sandbox whose IPython runs the agent's code."""
        return SandboxRequest() if python_tool.wants_python(job.instance) else None

    def _stop_reason(self, job: JobContext, llm: ChatLLM) -> str | None:
        """Why no further turn should start, checked before each one."""
        if llm.context_left < self.min_context_tokens:
            return "context"
        if job.time_left() == 0.0:
            return "time"
        return None

    async def eval(self, job: JobContext) -> EvalResult:
        """Reward 1.0 when the answer is equivalent to the ground truth, else 0.0."""
        answer = job.run_result.get("answer")
        ground_truth = self._ground_truth(job)
        correct = is_equivalent(answer, ground_truth)
        details = {"answer": answer, "ground_truth": ground_truth, "correct": correct}
        return EvalResult(reward=1.0 if correct else 0.0, details=details)

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        """Same keys as ``run`` so EVAL grades it as "no answer" (reward 0)."""
        return {
            "answer": None,
            "iterations": None,
            "finish_reason": "error",
            "error": f"{type(error).__name__}: {error}",
        }

    async def eval_exception(self, job: JobContext, error: BaseException) -> EvalResult:
        """Reward 0 with the usual detail keys plus the error."""
        details = {
            "answer": job.run_result.get("answer"),
            "ground_truth": job.init_result.get("ground_truth"),
            "correct": False,
            "error": f"{type(error).__name__}: {error}",
        }
        return EvalResult(reward=0.0, details=details)

    @staticmethod
    def _ground_truth(job: JobContext) -> str:
        if "ground_truth" in job.init_result:
            return str(job.init_result["ground_truth"])
        return normalize_instance(job.instance).ground_truth
