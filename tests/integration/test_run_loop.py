"""RUN stages on the worker's shared event loop (``prorl_celery.core.event_loops.StageLoop``), on real workers.

The module's own cluster (its own redis-server) has one RUN worker with ``-c 8`` Celery threads
and ``PRORL_RUN_SLOTS=3``: at most three RUN stages at once, and the others left in the broker's
queue, not taken by the worker; a freed slot takes the next queued stage at once (not at the
consumer's next poll, a second later); a cancel aborts one stage on the loop and frees its slot; a
stage that crashes past every handler error path ends its job alone, well-formed.
"""
from __future__ import annotations

import json
import os
import time

import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from prorl_celery.state import keys
from tests.support.services import ROOT, Gateway, eventually

SLOTS = 3
THREADS = 8


@pytest.fixture(scope="module")
def loop_cluster(qwen3_tokenizer, tmp_path_factory) -> LocalCluster:
    env = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_RUN_SLOTS": str(SLOTS), "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5",
           "PRORL_VISIBILITY_TIMEOUT_S": "10", "PRORL_SHUTDOWN_GRACE_S": "1", "PRORL_NODE": f"loop-{os.getpid()}"}
    local = LocalCluster(redis_url=None, tokenizer=qwen3_tokenizer, env=env, gateway_workers=1,
                         concurrency={Stage.INIT: 4, Stage.RUN: THREADS, Stage.EVAL: 4},
                         log_dir=tmp_path_factory.mktemp("loop-cluster"))
    with local:
        yield local


@pytest.fixture
def service(loop_cluster) -> Gateway:
    redis.Redis.from_url(loop_cluster.state_url).flushdb()
    with Gateway(loop_cluster) as client:
        yield client


def statuses(cluster: LocalCluster, job_ids: list[str]) -> list[str | None]:
    state = redis.Redis.from_url(cluster.state_url, decode_responses=True)
    pipe = state.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "status")
    return pipe.execute()


def queued_run_messages(cluster: LocalCluster) -> int:
    """RUN messages still in the broker's queue (not fetched by any worker)."""
    return redis.Redis.from_url(cluster.broker_url).llen(Stage.RUN.value)


def test_slots_bound_the_stages_running_and_the_rest_stay_in_the_queue(service):
    cluster = service.cluster
    job_ids = [service.submit({"data_source": "fault", "run_sleep_s": 3}) for _ in range(8)]
    eventually(lambda: statuses(cluster, job_ids).count("run") == SLOTS, 20, "three RUN stages running")
    peak, deadline = 0, time.monotonic() + 2.5
    while time.monotonic() < deadline:  # the first three are still sleeping: nothing else starts
        current = statuses(cluster, job_ids)
        peak = max(peak, current.count("run"))
        time.sleep(0.05)
    assert peak == SLOTS
    # the worker has -c 8 threads, yet it did not take the jobs it has no slot for
    assert statuses(cluster, job_ids).count("pending_run") == 8 - SLOTS
    assert queued_run_messages(cluster) == 8 - SLOTS
    results = [service.result(job_id, wait=60) for job_id in job_ids]
    assert [r["status"] for r in results] == ["completed"] * 8
    assert all(r["eval"] == {"ran": True} for r in results)


def run_intervals(cluster: LocalCluster, job_ids: list[str], timeout_s: float) -> list[tuple[float, float]]:
    """Each job's RUN stage as (start, end) of its handler, in the RUN worker's clock: the
    ``run_times`` the fault handler keeps in the job's ``run_result``, read once all completed
    (polling for a 0.2 s stage in RUN misses some on a loaded machine)."""
    state = redis.Redis.from_url(cluster.state_url, decode_responses=True)
    eventually(lambda: statuses(cluster, job_ids) == ["completed"] * len(job_ids), timeout_s, "all completed")
    pipe = state.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "run_result")
    return [tuple(json.loads(run_result)["run_times"]) for run_result in pipe.execute()]


def test_a_freed_slot_takes_the_next_queued_stage_at_once(service):
    # four times as many quick stages as slots, all queued at once: every slot runs four in a row
    job_ids = [service.submit({"data_source": "fault", "run_sleep_s": 0.2, "report_run_times": True})
               for _ in range(4 * SLOTS)]
    intervals = run_intervals(service.cluster, job_ids, 60)
    starts = sorted(start for start, _ in intervals)
    ends = sorted(end for _, end in intervals)
    # the (SLOTS + k)-th stage can start only once k + 1 have ended: its delay after the (k+1)-th
    # end is how long that freed slot sat idle (a full worker used to notice it ~1 s later)
    gaps = [starts[SLOTS + k] - ends[k] for k in range(len(starts) - SLOTS)]
    assert min(gaps) >= 0  # and never more than SLOTS at once
    assert max(gaps) < 0.6 and sum(gaps) / len(gaps) < 0.25, f"idle slot gaps {[round(g, 3) for g in gaps]}"


def test_cancel_aborts_a_stage_on_the_shared_loop_and_frees_its_slot(service):
    cluster = service.cluster
    long = [service.submit({"data_source": "fault", "run_sleep_s": 120}) for _ in range(SLOTS)]
    eventually(lambda: statuses(cluster, long).count("run") == SLOTS, 20, "every slot taken")
    waiting = service.submit({"data_source": "fault", "run_sleep_s": 0.5})
    time.sleep(1.0)
    assert statuses(cluster, [waiting]) == ["pending_run"]
    started = time.monotonic()
    assert service.post("/cancel", json={"job_id": long[0]}).status_code == 200
    # the cancelled stage stopped at once, so its slot took the waiting job, which completes
    assert service.result(waiting, wait=30)["status"] == "completed"
    assert time.monotonic() - started < 10
    assert statuses(cluster, long) == ["cancelled", "run", "run"]
    for job_id in long[1:]:
        service.post("/cancel", json={"job_id": job_id})
    eventually(lambda: statuses(cluster, long) == ["cancelled"] * SLOTS, 10, "all cancelled")


def test_a_crashed_stage_ends_its_job_and_leaves_the_others_running(service):
    others = [service.submit({"data_source": "fault", "run_sleep_s": 2}) for _ in range(SLOTS - 1)]
    eventually(lambda: statuses(service.cluster, others).count("run") == SLOTS - 1, 20, "two stages running")
    failed = service.submit({"data_source": "fault", "fail": "run"})  # a handler error: its fallback
    crashed = service.submit({"data_source": "fault", "crash": "run"})  # past every error path
    result = service.result(crashed, wait=30)
    assert (result["status"], result["critical_error"]) == ("failed", "run")
    assert "run crashed: SystemExit: scripted crash in run" in result["error"]
    fallback = service.result(failed, wait=30)
    assert (fallback["status"], fallback["critical_error"]) == ("failed", "run")
    completed = [service.result(job_id, wait=30) for job_id in others]
    assert [r["status"] for r in completed] == ["completed"] * (SLOTS - 1)
    assert result["job_id"] == crashed and set(result) == set(completed[0])  # the same well-formed response
    # the loop goes on: its slots all serve new stages
    again = [service.submit({"data_source": "fault"}) for _ in range(SLOTS + 1)]
    assert [service.result(job_id, wait=30)["status"] for job_id in again] == ["completed"] * (SLOTS + 1)
