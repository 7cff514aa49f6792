"""``wordcount``: the agent counts the lines of a file that INIT wrote into its sandbox.

Small, but it uses every part of the handler contract: instance validation, a sandbox, INIT
preparing the workspace through the tool server, the shared agent loop with the bash tool and
the finish tool, EVAL against the ground truth kept out of the agent's sight, and exception
callbacks that keep the result well-formed.
"""
from __future__ import annotations

from typing import Any

from handlers import AgentHandler, EvalResult, JobContext, SandboxRequest
from handlers.agent import AgentLoop
from handlers.sandbox_tools import BASH

DEFAULT_FILE = "notes.txt"


class LineCountHandler(AgentHandler):
    """Reward 1 when the agent's final answer is the number of lines of the file."""

    name = "wordcount"
    aliases = ("linecount",)

    def validate_instance(self, instance: dict[str, Any]) -> None:
        lines = instance.get("lines")
        if not isinstance(lines, list) or not all(isinstance(line, str) and "\n" not in line for line in lines):
            raise ValueError("'lines' must be a list of strings without newlines")
        name = instance.get("file", DEFAULT_FILE)
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError("'file' must be a plain file name")

    def sandbox_request(self, job: JobContext) -> SandboxRequest:
        return SandboxRequest(memory_bytes=1 << 30, max_processes=64)

    async def init(self, job: JobContext) -> dict[str, Any]:
        name = job.instance.get("file", DEFAULT_FILE)
        text = "".join(line + "\n" for line in job.instance["lines"])
        await job.sandbox.editor("create", name, file_text=text)
        prompt = (f"How many lines does the file {name} in your working directory have? "
                  "Use the bash tool to find out, then call finish with the number.")
        return {"messages": [{"role": "user", "content": prompt}]}

    async def run(self, job: JobContext, llm: Any) -> dict[str, Any]:
        loop = AgentLoop([BASH], max_iterations=int(job.instance.get("max_iterations", 4)))
        return await loop.run(job, llm, job.init_result["messages"])

    async def eval(self, job: JobContext) -> EvalResult:
        expected = len(job.instance["lines"])
        answer = (job.run_result.get("answer") or "").strip()
        correct = answer == str(expected)
        return EvalResult(1.0 if correct else 0.0, {"answer": answer, "expected": expected})
