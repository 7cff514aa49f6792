"""An INIT worker's exit touches only its own stages (issue 23, item 7).

A sandbox belongs to its job, not to the worker thread that started it. Before, bwrap ran with
``--die-with-parent`` under the INIT worker's thread, and the node's reaper stopped every
sandbox of a dead owner: an INIT worker's SIGTERM or SIGKILL took the sandboxes of every job it
had handed to RUN, and those jobs failed with ``ToolServerGone`` at their next tool call. Here,
on the session cluster's real workers and bubblewrap sandboxes (the gateway app in this
process):

- jobs in RUN (their sandbox adopted) and jobs waiting for RUN (their sandbox still recorded as
  the dead INIT worker's) call the python tool after the INIT worker is gone, and complete on
  their first attempt;
- the sandbox of a job whose INIT worker died during INIT is reaped by the node's other
  workers at once, and the job is retried with a new sandbox;
- and (a cluster of its own) stopping every worker still stops every sandbox, those of jobs
  waiting for RUN included.

RUN is kept busy by a scripted LLM server of this module's own whose first reply (a python
tool call) comes only after ``TURN_DELAY_S``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess
from prorl_celery.state import keys
from prorl_celery.worker.node_sandboxes import RedisSandboxLedger
from singularity.runtime import SandboxRecord, procfs
from tests.support.agents import tool_call
from tests.support.sandboxes import sandbox_pids
from tests.support.services import ROOT, Gateway, LLMServer, eventually, rules_file, start_llm_server

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

#: the session cluster's RUN pool and INIT pool (tests/conftest.py)
RUN_SLOTS, INIT_THREADS = 8, 4
#: how long the agent's first turn takes: every RUN slot stays busy that long, so jobs beyond the
#: pool wait in pending_run across the INIT worker's exit (the reaper ticks every 0.5 s)
TURN_DELAY_S = 6.0
PROBLEM = "SURVIVE: multiply six by seven, with the python tool"


@pytest.fixture(scope="module")
def slow_first_turn(qwen3_tokenizer, tmp_path_factory) -> LLMServer:
    """A python tool call after ``TURN_DELAY_S``; once the tool has printed 42, the answer."""
    rules = rules_file([
        {"match": "(?<![0-9])42(?![0-9])", "replies": ["The code printed 42, so the answer is \\boxed{42}."]},
        {"match": "SURVIVE", "scope": "prompt", "delay_s": TURN_DELAY_S,
         "replies": ["Let me compute it.\n" + tool_call("python", code="print(6 * 7)")]},
    ])
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("survive-llm"), "survive-llm", rules=rules)
    yield server
    server.process.stop()


def state_of(cluster: LocalCluster) -> redis.Redis:
    return redis.Redis.from_url(cluster.state_url, decode_responses=True)


def statuses(cluster: LocalCluster, job_ids: list[str]) -> list[str | None]:
    pipe = state_of(cluster).pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "status")
    return pipe.execute()


def sandbox_of(cluster: LocalCluster, job_id: str) -> dict | None:
    raw = state_of(cluster).hget(keys.job(job_id), "sandbox")
    return json.loads(raw) if raw else None


def ledger(cluster: LocalCluster, node: str) -> list[SandboxRecord]:
    return RedisSandboxLedger(state_of(cluster)).list(node)


def running(record: SandboxRecord) -> bool:
    return bool(procfs.members(record.root, record.pidns, record.refs, newer_than=time.monotonic()))


def init_worker(cluster: LocalCluster) -> ManagedProcess:
    return next(p for p in cluster.processes if p.name.startswith(Stage.INIT.value + "-"))


def end_init_worker(cluster: LocalCluster, sig: int) -> None:
    """Signal the INIT worker (the process alone, as an OOM kill or a rolling restart would) and
    wait for it to exit; a fresh one is started later by :func:`replace_init_worker`."""
    victim = init_worker(cluster)
    os.kill(victim.popen.pid, sig)
    victim.popen.wait(60)
    cluster.processes.remove(victim)


def replace_init_worker(cluster: LocalCluster) -> None:
    """An INIT worker again, unless one runs (the session cluster's next tests need one)."""
    if not any(p.name.startswith(Stage.INIT.value + "-") and p.popen.poll() is None for p in cluster.processes):
        cluster.start_worker(Stage.INIT, INIT_THREADS)
    cluster.wait_for_workers()


@pytest.fixture
def gateway(app_gateway):
    """The session cluster's gateway app, and an INIT worker in its cluster after the test,
    whatever the test did to the one it had."""
    yield app_gateway
    replace_init_worker(app_gateway.cluster)


@pytest.mark.extended  # 30 s for both: CI runs it after the default run, which stays under 10 minutes
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_jobs_handed_to_run_keep_their_sandboxes_when_the_init_worker_exits(gateway, slow_first_turn, sig):
    cluster = gateway.cluster
    slow_first_turn.reset()
    added = gateway.post("/add_llm_server", json={"address": slow_first_turn.address()})
    assert added.status_code == 200, added.text
    problem = {"data_source": "math", "answer": "42", "tools": ["python"], "max_iterations": 3}
    jobs = [gateway.submit({**problem, "problem": f"{PROBLEM} (job {chr(97 + i)})"}) for i in range(RUN_SLOTS + 2)]
    # every INIT done: RUN_SLOTS jobs in RUN, waiting on their first turn, the rest in pending_run
    eventually(lambda: set(statuses(cluster, jobs)) <= {"pending_run", "run"}, 60, "every job handed to RUN")
    node = sandbox_of(cluster, jobs[0])["node"]
    before = {r.job_id: r for r in ledger(cluster, node) if r.job_id in jobs}
    assert set(before) == set(jobs) and all(running(r) for r in before.values())

    end_init_worker(cluster, sig)
    gone_at = time.time()  # the LLM server's clock (wall time, this machine)
    time.sleep(2.0)  # four reaper ticks of every other worker on the node
    alive = {job_id: running(record) for job_id, record in before.items()}
    # read after the sandboxes: a job still waiting now was waiting when its sandbox was looked at
    waiting = [job_id for job_id, status in zip(jobs, statuses(cluster, jobs)) if status == "pending_run"]
    assert waiting, f"no job waited for RUN 2 s after the INIT worker's exit: raise TURN_DELAY_S ({TURN_DELAY_S} s)"
    assert all(alive[job_id] for job_id in waiting), "the sandbox of a job waiting for RUN died with its INIT worker"

    results = [gateway.result(job_id, wait=60) for job_id in jobs]
    for result in results:
        assert (result["status"], result["attempt"], result["reward"]) == ("completed", 1, 1.0), \
            (result["status"], result["error"])
        assert [m["content"].strip() for m in result["messages"] if m["role"] == "tool"] == ["42"]
    # every tool call came after the INIT worker was gone, the RUN jobs' (sandbox adopted) too:
    # no first turn (it ends in the tool call) had ended before
    first_ended = min(call["finished"] for call in slow_first_turn.log())
    assert first_ended > gone_at, f"a tool call came {gone_at - first_ended:.1f} s before the exit: raise TURN_DELAY_S"
    eventually(lambda: not ledger(cluster, node), 10, "every sandbox stopped after its RUN")
    assert not any(running(r) for r in before.values())


def test_the_sandbox_of_a_job_whose_init_worker_died_during_init_is_reaped(gateway):
    cluster = gateway.cluster
    job_id = gateway.submit({"data_source": "fault", "sandbox": True, "init_sleep_s": 120,
                             "sleep_first_attempt_only": True}, max_attempts=2)
    eventually(lambda: sandbox_of(cluster, job_id) is not None, 60, "INIT started the job's sandbox")
    first = sandbox_of(cluster, job_id)
    [record] = [r for r in ledger(cluster, first["node"]) if r.sandbox_id == first["id"]]
    assert running(record) and statuses(cluster, [job_id]) == ["init"]

    end_init_worker(cluster, signal.SIGKILL)
    killed_at = time.monotonic()
    # the node's other workers reap it on their next ticks, long before the job's lease expires
    eventually(lambda: not running(record) and not any(r.sandbox_id == first["id"]
                                                      for r in ledger(cluster, first["node"])),
               10, "the dead INIT's sandbox reaped")
    reaped_s = time.monotonic() - killed_at
    assert not os.path.exists(first["workspace"])
    replace_init_worker(cluster)
    result = gateway.result(job_id, wait=60)  # retried once its lease expired, with a new sandbox
    assert (result["status"], result["attempt"]) == ("completed", 2), (result["status"], result["error"])
    assert sandbox_of(cluster, job_id)["id"] != first["id"]
    eventually(lambda: not ledger(cluster, first["node"]), 10, "the retry's sandbox stopped after RUN")
    print(f"\nthe dead INIT's sandbox reaped {reaped_s:.1f} s after the SIGKILL")


@pytest.mark.integration  # a cluster of its own (no session fixture marks it)
def test_stopping_the_whole_service_stops_the_sandboxes_of_jobs_waiting_for_run(qwen3_tokenizer, tmp_path):
    """No worker's exit stops a sandbox its job holds, so stopping every worker (``prorl up``'s
    Ctrl-C) would leave those of jobs waiting for RUN running: the cluster stops them, through
    their ledger entries, before Redis."""
    node, sandbox_dir = f"stop-{os.getpid()}", tmp_path / "sbx"
    env = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_NODE": node, "PRORL_SANDBOX_DIR": str(sandbox_dir), "PRORL_RUNTIME": "bubblewrap",
           "PRORL_SHUTDOWN_GRACE_S": "1", "PRORL_REAPER_INTERVAL_S": "0.5"}
    cluster = LocalCluster(redis_url=None, tokenizer=qwen3_tokenizer, gateway_workers=1, env=env,
                           concurrency={Stage.INIT: 2, Stage.RUN: 1}, log_dir=tmp_path / "cluster")
    with cluster, Gateway(cluster) as gateway:
        sandboxed = {"data_source": "fault", "sandbox": True}
        busy = gateway.submit({**sandboxed, "run_sleep_s": 120})  # the one RUN slot, until the end
        eventually(lambda: statuses(cluster, [busy]) == ["run"], 60, "a job in RUN")
        waiting = [gateway.submit(sandboxed) for _ in range(2)]
        eventually(lambda: statuses(cluster, waiting) == ["pending_run"] * 2, 60, "two jobs waiting for RUN")
        records = ledger(cluster, node)
        assert {r.job_id for r in records} == {busy, *waiting} and all(running(r) for r in records)
    assert not any(running(r) for r in records)
    assert not sandbox_pids(sandbox_dir)
