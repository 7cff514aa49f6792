"""The warm pool (issue 29, item 1), on a cluster of its own with bubblewrap sandboxes: an INIT
worker keeps ready sandboxes, a job takes one (a hit) and the pool refills; ``/status``,
``/metrics`` report it; ``/stop`` closes the pool and ``/start`` refills it; an INIT worker that
stops closes its pool itself, and one killed with a full pool leaves nothing running: the node's
other worker reaps every pooled sandbox (chaos).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from prorl_celery.state import keys
from prorl_celery.worker.node_sandboxes import RedisSandboxLedger
from prorl_celery.worker.warm_pool import POOL_PREFIX
from singularity.runtime import SandboxRecord, procfs
from tests.support.sandboxes import sandbox_pids
from tests.support.services import ROOT, Gateway, eventually

# kept out of the default run's 10 minutes (CI's extended phase runs it every time)
pytestmark = [pytest.mark.extended, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

POOL_SIZE = 2


@pytest.fixture(scope="module")
def pooled(qwen3_tokenizer, tmp_path_factory):
    """A cluster whose one INIT worker keeps ``POOL_SIZE`` plain ``dev`` sandboxes ready."""
    tmp = tmp_path_factory.mktemp("warm-pool")
    node, sandbox_dir = f"warm-{os.getpid()}", tmp / "sbx"
    env = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_NODE": node, "PRORL_SANDBOX_DIR": str(sandbox_dir), "PRORL_RUNTIME": "bubblewrap",
           "PRORL_WARM_POOL_SIZE": str(POOL_SIZE), "PRORL_WARM_POOL_IMAGES": "dev",
           "PRORL_HEARTBEAT_S": "0.5", "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_SHUTDOWN_GRACE_S": "1"}
    cluster = LocalCluster(redis_url=None, tokenizer=qwen3_tokenizer, gateway_workers=1, env=env,
                           concurrency={Stage.INIT: 2, Stage.RUN: 2, Stage.EVAL: 1}, log_dir=tmp / "cluster")
    with cluster, Gateway(cluster) as gateway:
        gateway.node, gateway.sandbox_dir = node, sandbox_dir
        yield gateway
    assert not sandbox_pids(sandbox_dir), "a sandbox outlived the cluster"


def pool_entries(gateway) -> list[SandboxRecord]:
    state = redis.Redis.from_url(gateway.cluster.state_url, decode_responses=True)
    return [r for r in RedisSandboxLedger(state).list(gateway.node) if r.job_id.startswith(POOL_PREFIX)]


def running(record: SandboxRecord) -> bool:
    return bool(procfs.members(record.root, record.pidns, record.refs, newer_than=time.monotonic()))


def pool_status(gateway) -> dict:
    return gateway.get("/status").json()["warm_pool"]


def full(gateway) -> list[SandboxRecord]:
    """Wait until the pool holds ``POOL_SIZE`` running sandboxes, and /status says so."""
    eventually(lambda: len(pool_entries(gateway)) == POOL_SIZE and pool_status(gateway)["ready"] == POOL_SIZE,
               60, "a full warm pool")
    entries = pool_entries(gateway)
    assert all(running(r) for r in entries)
    return entries


def init_worker(gateway):
    return next(p for p in gateway.cluster.processes if p.name.startswith(Stage.INIT.value + "-"))


def replace_init_worker(gateway) -> None:
    gateway.cluster.start_worker(Stage.INIT, 2)
    gateway.cluster.wait_for_workers()


def test_a_job_takes_a_ready_sandbox_and_the_pool_refills(pooled):
    before = full(pooled)
    hits = pool_status(pooled)["hits"]
    job_id = pooled.submit({"data_source": "fault", "sandbox": True})
    result = pooled.result(job_id)
    assert (result["status"], result["attempt"]) == ("completed", 1), result["error"]
    eventually(lambda: pool_status(pooled)["hits"] == hits + 1, 10, "the hit reported")
    # its sandbox was one of the pool's (the job's INIT started none), and is stopped after RUN
    taken = [r for r in before if not any(r.sandbox_id == e.sandbox_id for e in pool_entries(pooled))]
    refilled = full(pooled)
    assert len(taken) == 1 and not running(taken[0])
    assert {r.sandbox_id for r in refilled} != {r.sandbox_id for r in before}
    status = pool_status(pooled)
    assert status["pools"] == 1 and status["refill_s_p50"] > 0
    worker = next(w for w in pooled.get("/status").json()["workers"] if w.get("warm_pool"))
    assert worker["warm_pool"]["kinds"] == {"dev": POOL_SIZE}
    metrics = pooled.get("/metrics").text
    ready = rf'^prorl_warm_pool_ready\{{node="{pooled.node}",worker="[^"]+"\}} {POOL_SIZE}\.0$'
    assert re.search(ready, metrics, re.M), metrics
    eventually(lambda: counter(pooled, "warm_pool_hits") >= 1, 10, "the hit counted in /metrics")


def counter(gateway, name: str) -> float:
    found = re.search(rf"^prorl_{name}_total ([0-9.e+]+)$", gateway.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_cancelled_job_stops_the_sandbox_it_took(pooled):
    before = {r.sandbox_id for r in full(pooled)}
    job_id = pooled.submit({"data_source": "fault", "sandbox": True, "run_sleep_s": 60})
    pooled.wait_for_stage(job_id, "run")
    state = redis.Redis.from_url(pooled.cluster.state_url, decode_responses=True)
    taken = json.loads(state.hget(keys.job(job_id), "sandbox"))
    assert taken["id"] in before and taken["pooled"] == "1"
    [record] = [r for r in RedisSandboxLedger(state).list(pooled.node) if r.sandbox_id == taken["id"]]
    assert record.job_id == job_id and running(record)
    assert pooled.post("/cancel", json={"job_id": job_id}).json()["cancelled"] == [job_id]
    assert pooled.result(job_id)["status"] == "cancelled"
    eventually(lambda: not running(record) and not any(r.sandbox_id == taken["id"]
                                                      for r in RedisSandboxLedger(state).list(pooled.node)),
               10, "the cancelled job's sandbox stopped")


def test_stop_closes_the_pool_and_start_refills_it(pooled):
    before = full(pooled)
    admin = pooled.cluster.auth_headers()
    assert pooled.post("/stop", headers=admin).status_code == 200
    try:
        eventually(lambda: not pool_entries(pooled), 20, "the pool closed on /stop")
        assert not any(running(r) for r in before)
        eventually(lambda: pool_status(pooled)["ready"] == 0, 10, "/status showing the pool empty")
    finally:
        assert pooled.post("/start", headers=admin).status_code == 200
    full(pooled)


def test_an_init_worker_that_stops_closes_its_pool_itself(pooled):
    before = full(pooled)
    victim = init_worker(pooled)
    victim.popen.send_signal(signal.SIGTERM)
    victim.popen.wait(60)
    pooled.cluster.processes.remove(victim)
    # gone at its exit, not by the RUN worker's reaper (which logs each sandbox it reaps)
    assert not pool_entries(pooled) and not any(running(r) for r in before)
    run_log = next(p for p in pooled.cluster.processes if p.name.startswith(Stage.RUN.value + "-")).tail(400)
    assert not any(f"of job {r.job_id}" in run_log for r in before), run_log
    replace_init_worker(pooled)
    full(pooled)


def test_an_init_worker_killed_with_a_full_pool_leaves_no_sandbox_running(pooled):
    """Chaos: SIGKILL, as the out-of-memory killer sends it. The pooled sandboxes' owner is gone
    and no job holds them: the node's RUN worker stops them on its next reaper ticks."""
    before = full(pooled)
    victim = init_worker(pooled)
    os.kill(victim.popen.pid, signal.SIGKILL)
    victim.popen.wait(60)
    pooled.cluster.processes.remove(victim)
    killed_at = time.monotonic()
    eventually(lambda: not pool_entries(pooled) and not any(running(r) for r in before), 15,
               "the dead INIT worker's pool reaped")
    reaped_s = time.monotonic() - killed_at
    assert not sandbox_pids(pooled.sandbox_dir), "a sandbox process outlived its ledger entry"
    assert not any(os.path.exists(r.workspace) for r in before)
    replace_init_worker(pooled)
    full(pooled)  # the new INIT worker's own pool
    print(f"\nthe killed INIT worker's pool of {POOL_SIZE} reaped {reaped_s:.1f} s after the SIGKILL")
