"""A handler that reports what a job's sandbox can see of the service's secrets.

INIT starts a sandbox (``sandbox_request``); RUN runs ``env`` and reads every ``environ`` under
the sandbox's ``/proc`` through the bash tool and returns the output as an artifact. Loaded into
real workers through ``PRORL_HANDLERS=envprobe=tests.support.env_probe:EnvProbeHandler``.
"""
from __future__ import annotations

from typing import Any

from handlers import AgentHandler, EvalResult, JobContext, SandboxRequest

PROBE = "env; echo ---; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; echo ---; id -u"


class EnvProbeHandler(AgentHandler):
    name = "envprobe"
    uses_llm = False

    def sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        return SandboxRequest()

    async def run(self, job: JobContext, llm) -> dict[str, Any]:
        result = await job.sandbox.bash(PROBE, timeout_s=30)
        return {"artifacts": {"env": result.output, "exit_code": result.exit_code}}

    async def eval(self, job: JobContext) -> EvalResult:
        return EvalResult(1.0)
