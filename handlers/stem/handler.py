"""StemHandler: answer a science question with a search tool over a shipped corpus and python.

INIT returns the instance in the handler's shape (``instances``); the sandbox it starts has the shipped corpus
(``data/corpus.jsonl``) bound read-only at ``/data/stem``, and one search there builds the tool
server's BM25 index before RUN. RUN is the shared agent loop with ``search``, ``python`` and
``finish``; the final answer is the ``finish`` tool's ``answer`` or, in a reply without tool
calls, the last ``\\boxed{}`` or "Answer: ..." line. EVAL grades it (``grading``): normalized
exact match with aliases, or a relative numeric tolerance.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from handlers.agent import AgentLoop
from handlers.base import AgentHandler, ChatLLM, EvalResult, JobContext, SandboxRequest
from handlers.sandbox_tools import PYTHON, SEARCH
from handlers.stem.grading import extract_answer, grade
from handlers.stem.instances import StemInstance, normalize_instance
from singularity.requirements import Requirement

DATA_DIR = Path(__file__).resolve().parent / "data"
#: where the shipped corpus appears inside the sandbox
CORPUS_MOUNT = "/data/stem"
CORPUS_NAME = "corpus.jsonl"
NUDGE = ("Your reply contains no tool call and no final answer. Continue with a tool call, or call "
         "`finish` with your final answer.")


class StemHandler(AgentHandler[ChatLLM]):
    """Task ``stem``: short-answer science questions graded by exact match or numeric tolerance.

    Keeps no per-job state: one instance serves every job of its process.
    """

    name: ClassVar[str] = "stem"
    #: its tools answer the same actions alike on a fresh sandbox: a crashed RUN resumes by replay
    replayable_tools: ClassVar[bool] = True
    aliases: ClassVar[tuple[str, ...]] = ("stem_search", "webinstruct", "webinstruct_verified", "scienceqa", "gpqa")
    node_local: ClassVar[bool] = False  # RUN follows the sandbox to its node anyway
    tool_timeout_s: ClassVar[float] = 30.0
    min_context_tokens: ClassVar[int] = 64
    requires: ClassVar[tuple[Requirement, ...]] = (*SEARCH.requires, *PYTHON.requires)

    def parse_instance(self, instance: dict[str, Any]) -> StemInstance:
        return normalize_instance(instance)

    def sandbox_request(self, job: JobContext) -> SandboxRequest:
        return SandboxRequest(binds=((str(DATA_DIR), CORPUS_MOUNT),),
                              search_corpus=f"{CORPUS_MOUNT}/{CORPUS_NAME}", tools=("search", "python"))

    async def init(self, job: JobContext) -> dict[str, Any]:
        """Return ``{"messages", "gold", "max_iterations", "metadata", "index_warmup_s"}``.

        The tool server builds its BM25 index on the first search (about 1 s, mostly importing
        bm25s/numpy/scipy: ``python -m bench.stem_search``); one search here pays that in INIT,
        which holds no LLM backend, instead of in the agent's first tool call. A corpus that cannot
        be indexed fails INIT with the reason.
        """
        normalized: StemInstance = self.instance_of(job)
        warmup = None
        if job.sandbox is not None:
            started = time.monotonic()
            await job.sandbox.search("index warm-up", k=1)
            warmup = round(time.monotonic() - started, 4)
        return {"messages": normalized.messages, "gold": normalized.gold(),
                "max_iterations": normalized.max_iterations, "metadata": normalized.metadata,
                "index_warmup_s": warmup}

    async def run(self, job: JobContext, llm: ChatLLM) -> dict[str, Any]:
        """The agent loop's outcome (``answer``, ``finish_reason``, ``iterations``, tool counts)."""
        instance: StemInstance = self.instance_of(job)
        tools = [SEARCH, PYTHON] if job.sandbox is not None else []
        loop = AgentLoop(tools=tools, max_iterations=instance.max_iterations,
                         tool_timeout_s=self.tool_timeout_s, min_context_tokens=self.min_context_tokens,
                         answer_in_text=extract_answer, nudge=NUDGE)
        return await loop.run(job, llm, instance.messages)

    async def eval(self, job: JobContext) -> EvalResult:
        """Reward 1.0 when the answer matches the gold answer (or an alias), else 0.0."""
        gold = self.instance_of(job).gold()
        answer = job.run_result.get("answer")
        result = grade(answer, gold["answer"], aliases=gold["aliases"], answer_type=gold["answer_type"],
                       tolerance=gold["tolerance"])
        details = {"answer": answer, **result.details(), "answer_type": gold["answer_type"],
                   "tolerance": gold["tolerance"]}
        return EvalResult(reward=1.0 if result.correct else 0.0, details=details)

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        """Same keys as ``run``, so EVAL grades it as "no answer" (reward 0)."""
        return {"answer": None, "finish_reason": "error", "iterations": None, "tool_calls": None,
                "tool_errors": None, "error": f"{type(error).__name__}: {error}"}

    def final_result(self, job: JobContext) -> dict[str, Any]:
        """The run's outcome in ``artifacts``: the answer and how the agent got there."""
        keys = ("answer", "finish_reason", "iterations", "tool_calls", "tool_errors", "tool_log")
        return {"artifacts": {**{key: job.run_result.get(key) for key in keys},
                              "index_warmup_s": job.init_result.get("index_warmup_s")}}
