"""Redis restarted under load, with the service launched exactly as docs/running.md writes it
(issue 40): ``gunicorn 'api:create_app()'`` from the repository root and
``celery -A prorl_celery worker -Q init|run|eval -c 16|64|8 -n <stage>@%h``, no setting beyond
the URLs, the tokenizer and this module's own node name and sandbox directory.

Thirty math jobs with the python tool are in flight (each of their two turns waits on the scripted
server, their tool call sleeps in the sandbox's kernel) when Redis goes away, in three ways:

- stopped cleanly (SIGTERM) and started again 2.3 s later on its append-only file;
- killed (SIGKILL) and started again 10 s later on its append-only file;
- killed and started again with nothing on disk: a state reset.

After the first two every job ends ``ok`` at its first attempt (the workers' Redis retry,
``PRORL_REDIS_RETRY_S``, rides out the outage), and a job submitted after the restart completes.
Before them, fifty jobs leave no defunct process under any worker. After a state reset the jobs
accepted before it are gone (the gateway answers 404 for them: what
``--redis-persistence none`` says it loses), and every process still serves new jobs. In all
three no process dies: the RUN worker once did, on kombu's restore of its unacked messages.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from prorl_celery.dev.local import ManagedProcess, free_port, wait_until
from prorl_celery.worker.job_sandboxes import UNTRACKED_AFTER_S
from tests.support.sandboxes import assert_no_sandbox_process, sandbox_processes
from tests.support.services import eventually, rules_file, start_llm_server
from tests.support.stock import (
    PYTOOL_RULES,
    WORKERS,
    StockService,
    launched,
    not_ok_at_first_attempt,
    pytool_job,
    result,
)

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.integration,
    # about two minutes: CI runs it after the default run (scripts/test.sh)
    pytest.mark.extended,
]

JOBS = 30


class RedisOnPort:
    """One redis-server port that a test stops and starts again, with its AOF or without."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.process: ManagedProcess | None = None

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, persist: bool = True) -> None:
        data = self.directory / ("aof" if persist else f"empty-{time.monotonic_ns()}")
        data.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if persist else ["--appendonly", "no"]
        log = self.directory / "redis.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      str(data), "--save", "", "--maxclients", "10000", *persistence],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.process = ManagedProcess("redis", popen, log)
        wait_until(lambda: redis.Redis(port=self.port).ping(), 20, "redis-server", self.process)

    def stop(self, sig: signal.Signals) -> None:
        assert self.process is not None
        os.kill(self.process.popen.pid, sig)
        self.process.popen.wait(20)
        self.process = None


@dataclass
class Stock:
    redis: RedisOnPort
    service: StockService
    backend: str
    sandbox_dir: Path

    @property
    def gateway_url(self) -> str:
        return self.service.gateway_url

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        return self.service.processes

    def dead(self) -> list[str]:
        return self.service.dead()


@pytest.fixture(scope="module")
def stock(qwen3_tokenizer, tmp_path_factory) -> Iterator[Stock]:
    root = tmp_path_factory.mktemp("redis-restart")
    server = RedisOnPort(root / "redis")
    server.start()
    llm = start_llm_server(qwen3_tokenizer, root, "restart-llm", rules=rules_file(PYTOOL_RULES))
    env = {"PRORL_REDIS_URL": server.url(1), "PRORL_BROKER_URL": server.url(0),
           "PRORL_TOKENIZER": qwen3_tokenizer, "PRORL_NODE": f"restart-{os.getpid()}",
           "PRORL_SANDBOX_DIR": str(root / "sbx"), "PRORL_REAPER_INTERVAL_S": "1"}
    try:
        with launched(env, root, llm.address()) as service:
            yield Stock(server, service, llm.address(), root / "sbx")
    finally:
        llm.process.stop()
        if server.process is not None:
            server.process.stop()
    assert_no_sandbox_process(root / "sbx")


def submit(stock: Stock, job_id: str) -> None:
    reply = httpx.post(stock.gateway_url + "/jobs", timeout=30, json=pytool_job(job_id))
    assert reply.status_code == 202, reply.text


def in_flight(stock: Stock, case: str) -> list[str]:
    job_ids = [f"{case}-{i}" for i in range(JOBS)]
    for job_id in job_ids:
        submit(stock, job_id)
    # most jobs past INIT, their turns and tool calls under way
    eventually(lambda: httpx.get(stock.gateway_url + "/status").json()["jobs"]["run"] >= JOBS // 2, 60,
               "jobs in RUN")
    return job_ids


def restarted(stock: Stock, sig: signal.Signals, down_s: float, persist: bool) -> None:
    stock.redis.stop(sig)
    time.sleep(down_s)
    stock.redis.start(persist=persist)


def every_job_ok_at_its_first_attempt(stock: Stock, job_ids: list[str]) -> None:
    wrong = not_ok_at_first_attempt(stock.gateway_url, job_ids)
    assert not wrong, f"{len(wrong)} of {len(job_ids)} jobs did not end ok at attempt 1: {wrong}"


def zombies_under(pid: int) -> list[str]:
    """The children of ``pid`` that exited and were never waited for."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z" and int(fields[1]) == pid:
                found.append(f"{entry.name} [{name}]")
    return found


def test_fifty_jobs_leave_no_zombie_under_any_worker(stock):
    """INIT starts each sandbox, RUN stops it: INIT, its parent, once left every one a zombie."""
    job_ids = [f"zombies-{i}" for i in range(50)]
    for job_id in job_ids:
        submit(stock, job_id)
    every_job_ok_at_its_first_attempt(stock, job_ids)
    workers = {stage: stock.processes[stage].popen.pid for stage in WORKERS}
    eventually(lambda: not any(zombies_under(pid) for pid in workers.values()), 10,
               "no defunct child under a worker: " + str({s: zombies_under(p) for s, p in workers.items()}))


@pytest.mark.parametrize(("case", "sig", "down_s"), [("aof-term", signal.SIGTERM, 2.3),
                                                     ("outage-10s", signal.SIGKILL, 10.0)])
def test_a_restart_on_the_aof_loses_nothing_and_fails_no_stage(stock, case, sig, down_s):
    job_ids = in_flight(stock, case)
    restarted(stock, sig, down_s, persist=True)
    submit(stock, f"{case}-after")
    every_job_ok_at_its_first_attempt(stock, [*job_ids, f"{case}-after"])
    assert not stock.dead(), stock.dead()
    eventually(lambda: not sandbox_processes(stock.sandbox_dir), 30, "every job's sandbox stopped")


def test_a_state_reset_loses_the_jobs_it_held_and_kills_no_process(stock):
    job_ids = in_flight(stock, "reset")
    restarted(stock, signal.SIGKILL, 1.0, persist=False)
    # the workers' stages in flight find their jobs gone and drop them; nothing is left running
    eventually(lambda: all(result(stock.gateway_url, job_id, wait_s=0).status_code == 404 for job_id in job_ids), 60,
               "every job of the reset Redis unknown")
    reply = httpx.post(stock.gateway_url + "/add_llm_server", json={"address": stock.backend})
    assert reply.status_code == 200, reply.text
    submit(stock, "reset-after")
    every_job_ok_at_its_first_attempt(stock, ["reset-after"])
    assert not stock.dead(), stock.dead()
    # the sandboxes INIT started for the lost jobs lost their ledger entries too: the reaper stops
    # them by their local copies once they are UNTRACKED_AFTER_S old
    eventually(lambda: not sandbox_processes(stock.sandbox_dir), UNTRACKED_AFTER_S + 30,
               "the lost jobs' sandboxes stopped")

