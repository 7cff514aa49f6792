"""A handler whose behaviour each test instance scripts: fail, sleep or succeed per stage.

Loaded into the real workers through ``PRORL_HANDLERS=fault=tests.support.handlers:FaultHandler``;
it exercises the pipeline's error, timeout and cancellation paths without an LLM.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from handlers import AgentHandler, EvalResult, JobContext, SandboxRequest


class FaultHandler(AgentHandler):
    name = "fault"
    uses_llm = False

    async def _act(self, job: JobContext, stage: str) -> None:
        if job.attempt == 1 or not job.instance.get("sleep_first_attempt_only"):
            await asyncio.sleep(float(job.instance.get(f"{stage}_sleep_s", 0)))
        if job.instance.get("fail") == stage:
            raise RuntimeError(f"scripted failure in {stage}")
        if job.instance.get("fail_first_attempt_only") == stage and job.attempt == 1:
            raise RuntimeError(f"scripted failure in {stage} of the first attempt")
        if job.instance.get("crash") == stage:  # past every handler error path: a crashed stage
            raise SystemExit(f"scripted crash in {stage}")

    def sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        """``"sandbox": true`` in the instance: INIT starts one, RUN (on that node) holds it."""
        return SandboxRequest() if job.instance.get("sandbox") else None

    async def init(self, job: JobContext) -> dict[str, Any]:
        await self._act(job, "init")
        return {"initialised": True}

    async def run(self, job: JobContext, llm) -> dict[str, Any]:
        started = time.monotonic()
        await self._act(job, "run")
        result: dict[str, Any] = {"ran": True, "artifacts": {"note": "ran"}}
        if job.instance.get("report_run_times"):
            # when the handler ran, in the worker's monotonic clock (one RUN worker: one clock),
            # kept in the job's record for a test that cannot watch a short stage go by
            result["run_times"] = [started, time.monotonic()]
        return result

    async def eval(self, job: JobContext) -> EvalResult:
        await self._act(job, "eval")
        return EvalResult(float(job.instance.get("reward", 1.0)), {"ran": job.run_result.get("ran", False)})

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        return {"ran": False, "fallback": "run"}


class LocalFaultHandler(FaultHandler):
    """A FaultHandler whose RUN must run on its INIT's node."""

    name = "localfault"
    node_local = True
