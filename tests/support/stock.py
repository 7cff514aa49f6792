"""The service launched exactly as docs/running.md writes it, for the fault tests (issue 40):
``gunicorn 'api:create_app()'`` from the repository root and
``celery -A prorl_celery worker -Q init|run|eval -c 16|64|8 -n <stage>@%h``, configured only by
the environment the test gives (URLs, tokenizer, node name, sandbox directory)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from prorl_celery.dev.local import ManagedProcess, free_port, wait_until
from tests.support.services import ROOT, eventually

#: the stock worker commands of docs/running.md
WORKERS = {"init": ["-c", "16"], "run": ["-c", "64"], "eval": ["-c", "8"]}
#: a math job's two turns: a python tool call that sleeps a second, then the answer
PYTOOL_RULES = [{"match": "PYTOOL", "scope": "prompt", "delay_s": 1.0, "replies": [
    "Let me compute it.\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": "
    "\"import time; time.sleep(1)\\nprint(6 * 7)\"}}\n</tool_call>",
    "The code printed 42, so the answer is \\boxed{42}."]}]


@dataclass
class StockService:
    gateway_url: str
    processes: dict[str, ManagedProcess]

    def dead(self) -> list[str]:
        return [f"{name} (exit {p.popen.poll()}): {p.tail(15)}" for name, p in self.processes.items()
                if p.popen.poll() is not None]

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()


def spawn(name: str, command: list[str], env: dict[str, str], log_dir: Path) -> ManagedProcess:
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    return ManagedProcess(name, popen, log)


def launch(env: dict[str, str], log_dir: Path, backend: str) -> StockService:
    """The gateway and the three stock workers on ``env`` (over os.environ), with ``backend``
    registered; stopped by the caller (``StockService.stop``)."""
    env = {**os.environ, **env}
    port = free_port()
    bin_dir = Path(sys.executable).parent
    processes = {"gateway": spawn("gateway", [str(bin_dir / "gunicorn"), "--bind", f"127.0.0.1:{port}",
                                              "api:create_app()"], env, log_dir)}
    for stage, args in WORKERS.items():
        processes[stage] = spawn(stage, [str(bin_dir / "celery"), "-A", "prorl_celery", "worker", "-Q", stage, *args,
                                         "-n", f"{stage}@%h"], env, log_dir)
    service = StockService(f"http://127.0.0.1:{port}", processes)
    try:
        wait_until(lambda: httpx.get(service.gateway_url + "/healthz").status_code == 200, 60, "gateway",
                   processes["gateway"])
        eventually(lambda: len(httpx.get(service.gateway_url + "/status").json()["workers"]) == 3, 60,
                   "the three workers' heartbeats")
        reply = httpx.post(service.gateway_url + "/add_llm_server", json={"address": backend})
        assert reply.status_code == 200, reply.text
    except BaseException:
        service.stop()
        raise
    return service


@contextmanager
def launched(env: dict[str, str], log_dir: Path, backend: str) -> Iterator[StockService]:
    """``launch``, stopped when the block ends."""
    service = launch(env, log_dir, backend)
    try:
        yield service
    finally:
        service.stop()


def pytool_job(job_id: str) -> dict:
    return {"job_id": job_id, "sampling_params": {"max_tokens": 64},
            "instance": {"data_source": "math", "problem": f"PYTOOL {job_id}: what is 6 * 7?", "answer": "42",
                         "tools": ["python"], "max_iterations": 3}}


def result(gateway_url: str, job_id: str, wait_s: float = 120) -> httpx.Response:
    return httpx.get(f"{gateway_url}/jobs/{job_id}", params={"wait": wait_s}, timeout=wait_s + 30)


def not_ok_at_first_attempt(gateway_url: str, job_ids: list[str]) -> dict[str, tuple]:
    """The jobs that did not end ``ok`` at attempt 1: (HTTP status, status, outcome, attempt, error)."""
    wrong = {}
    for job_id in job_ids:
        reply = result(gateway_url, job_id)
        body = reply.json()
        if reply.status_code != 200 or (body.get("outcome"), body.get("attempt")) != ("ok", 1):
            wrong[job_id] = (reply.status_code, body.get("status"), body.get("outcome"), body.get("attempt"),
                             body.get("error"))
    return wrong
