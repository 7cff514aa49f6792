"""The handler of ``bench.scale``: a sleep per stage and an LLM-bound RUN, set per job.

Instance fields: ``init_s``, ``eval_s`` (seconds INIT and EVAL sleep: a sandbox start, a test
suite), ``turns`` (model turns RUN asks for; each waits on the LLM server's simulated latency)
and ``tag`` (a marker the scripted server's rule matches and the benchmark finds in its logs).
Loaded by the service's workers and by the baseline's through
``PRORL_HANDLERS=scalebench=bench.scale_handler:StagedHandler``.
"""
from __future__ import annotations

import asyncio
from typing import Any

from handlers import AgentHandler, ChatLLM, EvalResult, JobContext


class StagedHandler(AgentHandler):
    name = "scalebench"

    async def init(self, job: JobContext) -> dict[str, Any]:
        await asyncio.sleep(float(job.instance.get("init_s", 0)))
        return {}

    async def run(self, job: JobContext, llm: ChatLLM | None) -> dict[str, Any]:
        assert llm is not None
        turns = int(job.instance.get("turns", 1))
        llm.start([{"role": "user", "content": f"SCALE {job.instance.get('tag', job.job_id)} start"}])
        for turn in range(turns):
            await llm.generate(max_tokens=8)
            if turn + 1 < turns:
                llm.add_message("user", f"SCALE {job.instance.get('tag', job.job_id)} turn {turn + 1}")
        return {"turns": llm.num_turns}

    async def eval(self, job: JobContext) -> EvalResult:
        await asyncio.sleep(float(job.instance.get("eval_s", 0)))
        return EvalResult(1.0, {"turns": job.run_result.get("turns", 0)})
