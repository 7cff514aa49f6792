"""MathHandler: answer a math problem in one or more model turns, graded against a rule.

INIT returns the instance in the handler's shape (see ``instances``); RUN asks the model, and when a reply has no
boxed answer and turns remain, asks once more for the final answer; EVAL grades the answer
(see ``grading``). No sandbox: every stage can run on any node.
"""
from __future__ import annotations

from typing import Any, ClassVar

from handlers.agent import AgentLoop
from handlers.base import AgentHandler, ChatLLM, EvalResult, JobContext, SandboxRequest
from handlers.math.grading import extract_boxed, is_equivalent
from handlers.math.instances import MathInstance, normalize_instance
from handlers.sandbox_tools import PYTHON
from prorl_celery.core.status import Stage
from singularity.requirements import MATH_VERIFY, Requirement

FOLLOW_UP = (
    "Your reply does not contain a final answer in the required format. "
    "Please state your final answer, in simplest form, inside \\boxed{}."
)


class MathHandler(AgentHandler[ChatLLM]):
    """Task ``math``: plain problem/answer pairs and verl-style rule-graded rows.

    One instance serves every job of its process, from several threads at once: it keeps no
    per-job state, everything travels in ``JobContext``.
    """

    name: ClassVar[str] = "math"
    #: its tools answer the same actions alike on a fresh sandbox: a crashed RUN resumes by replay
    replayable_tools: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("deepscaler", "dapo_math", "math_dapo", "gsm8k", "math500", "aime")
    node_local: ClassVar[bool] = False
    #: every stage is short and CPU-light (a job with the python tool still starts its INIT alone)
    batched_stages: ClassVar[frozenset[Stage]] = frozenset(Stage)
    #: Below this many tokens of context left, another turn could not hold a useful answer.
    min_context_tokens: ClassVar[int] = 64
    #: time one python tool call may take inside the sandbox
    tool_timeout_s: ClassVar[float] = 30.0
    requires: ClassVar[tuple[Requirement, ...]] = (*PYTHON.requires, MATH_VERIFY)

    def parse_instance(self, instance: dict[str, Any]) -> MathInstance:
        return normalize_instance(instance)

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Raise ValueError naming the missing or wrong field (the gateway returns 400)."""
        self.parse_instance(instance)
        tools = instance.get("tools")
        if tools is not None and (not isinstance(tools, list) or set(tools) - {"python"}):
            raise ValueError("'tools' must be a list of known tools: [\"python\"]")

    async def init(self, job: JobContext) -> dict[str, Any]:
        """Return ``{"messages", "ground_truth", "max_iterations", "metadata"}``."""
        normalized: MathInstance = self.instance_of(job)
        return {
            "messages": normalized.messages,
            "ground_truth": normalized.ground_truth,
            "max_iterations": normalized.max_iterations,
            "metadata": normalized.metadata,
        }

    async def run(self, job: JobContext, llm: ChatLLM) -> dict[str, Any]:
        """Converse until a boxed answer appears (see :class:`handlers.agent.AgentLoop`).

        Returns the loop's outcome: ``answer`` (str | None), ``iterations``, ``tool_calls``,
        ``tool_errors`` and ``finish_reason``: ``"answer"``, ``"max_iterations"`` (turns used up
        without an answer), ``"context"`` (too little context left for another turn) or
        ``"time"`` (the job's budget ran out between turns).
        """
        instance: MathInstance = self.instance_of(job)
        loop = AgentLoop(tools=[PYTHON] if job.sandbox is not None else [], finish_tool=False,
                         max_iterations=instance.max_iterations,
                         tool_timeout_s=self.tool_timeout_s, min_context_tokens=self.min_context_tokens,
                         answer_in_text=extract_boxed, nudge=FOLLOW_UP)
        return await loop.run(job, llm, instance.messages)

    def requirements(self, job: JobContext) -> tuple[Requirement, ...]:
        """The python tool's, for jobs that use it; the grader's for all."""
        return self.requires if self.sandbox_request(job) is not None else (MATH_VERIFY,)

    def sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        """Jobs with ``"tools": ["python"]`` get a sandbox whose IPython runs the agent's code."""
        return SandboxRequest(tools=("python",)) if "python" in (job.instance.get("tools") or []) else None

    async def eval(self, job: JobContext) -> EvalResult:
        """Reward 1.0 when the answer is equivalent to the ground truth, else 0.0."""
        answer = job.run_result.get("answer")
        ground_truth = self.instance_of(job).ground_truth
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
