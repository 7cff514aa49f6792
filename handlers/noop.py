"""NoopHandler: a task that does nothing, to measure the pipeline's own overhead.

It accepts any instance, makes no LLM call and scores 0, so a benchmark of ``noop`` jobs times
queueing, Redis bookkeeping and stage hand-overs alone.
"""
from __future__ import annotations

from typing import Any, ClassVar

from handlers.base import AgentHandler, EvalResult, JobContext
from prorl_celery.core.status import Stage


class NoopHandler(AgentHandler[None]):
    """Task ``noop``: every stage returns at once."""

    name: ClassVar[str] = "noop"
    uses_llm: ClassVar[bool] = False
    batched_stages: ClassVar[frozenset[Stage]] = frozenset(Stage)

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Accept anything: the instance is never read."""

    async def init(self, job: JobContext) -> dict[str, Any]:
        """Return ``{}``."""
        return {}

    async def run(self, job: JobContext, llm: None) -> dict[str, Any]:
        """Return ``{}`` without touching ``llm`` (no backend is needed)."""
        return {}

    async def eval(self, job: JobContext) -> EvalResult:
        """Reward 0.0, no details."""
        return EvalResult(reward=0.0)
