"""Three nodes on one machine, each with its own INIT, RUN and EVAL workers and node name;
Redis and the gateway on the first.

Node-local jobs spread over the nodes and every RUN runs on its INIT's node. Then one node is
cut off mid-run (its processes SIGKILLed, or its link set down): every job that was on it ends
(retried from INIT on another node: the re-route, or failed with a reason) within lease + 30 s,
and the jobs of the other nodes complete on their first attempt.

Two placements: separate node names on loopback (always), and one network namespace per node
on a bridge (``tests/support/netns.py``; skipped with the reason where namespaces cannot be
created). In the namespace variant Redis and the gateway listen on node 0's address, the LLM
server on the bridge's root-namespace address, which every node reaches.
"""
from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
import redis

from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state import keys
from prorl_celery.state.leases import reap_expired
from prorl_celery.state.store import JobStore
from tests.support.multinode import MultiNodeCluster, Node, start_llm, wait_for_llm
from tests.support.netns import Namespaces, NetnsUnavailable

LEASE_S = 3.0
BOUND_S = LEASE_S + 30  # the bound on how long a cut node's jobs may take to end
ENV = {"PRORL_HANDLERS": "localfault=tests.support.handlers:LocalFaultHandler", "PRORL_LEASE_S": str(LEASE_S),
       "PRORL_VISIBILITY_TIMEOUT_S": "10",
       "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_HEARTBEAT_S": "1", "PRORL_SHUTDOWN_GRACE_S": "1",
       "PRORL_BACKEND_WAIT_POLL_S": "0.1"}
# a small node runs one worker process for all three queues (quick to start on 2 cores)...
ONE_POOL = {"init,run,eval": 3}
# ...a bigger one a pool per stage (9 worker processes for 3 nodes)
STAGE_POOLS = {"init": 2, "run": 2, "eval": 1}


class Jobs:
    """Submits jobs through the gateway and reads their records straight from Redis."""

    def __init__(self, cluster: MultiNodeCluster) -> None:
        self.http = httpx.Client(base_url=cluster.gateway_url, timeout=60)
        self.state = redis.Redis.from_url(cluster.state_url, decode_responses=True)

    def submit(self, instance: dict, **fields) -> str:
        response = self.http.post("/jobs", json={"instance": instance, **fields})
        assert response.status_code == 202, response.text
        return response.json()["job_id"]

    def record(self, job_id: str, *names: str) -> dict[str, str]:
        return dict(zip(names, self.state.hmget(keys.job(job_id), names)))

    def results(self, job_ids: list[str], timeout_s: float) -> dict[str, dict]:
        deadline = time.monotonic() + timeout_s
        results = {}
        for job_id in job_ids:
            wait = max(0.1, deadline - time.monotonic())
            response = self.http.get(f"/jobs/{job_id}", params={"wait": wait})
            assert response.status_code == 200, f"job {job_id} not finished in time: {response.text}"
            results[job_id] = response.json()
        return results


def fault_job(index: int, **sleeps: float) -> dict:
    return {"data_source": "localfault", "instance_id": f"job-{index}", "reward": (index % 5) / 4, **sleeps}


def check_healthy_spread(cluster: MultiNodeCluster, jobs: Jobs) -> None:
    """Node-local jobs on every node, each RUN on its INIT's node, rewards right; with sandboxes
    (math with a python tool, talking to the shared LLM server) as well as without."""
    names = {node.name for node in cluster.nodes}
    plain = {jobs.submit(fault_job(i, init_sleep_s=0.4, run_sleep_s=0.2)): (i % 5) / 4 for i in range(12)}
    tools = [jobs.submit({"data_source": "math", "problem": f"PYTOOL: what is 6 times 7? ({i})", "answer": "42",
                          "tools": ["python"], "max_iterations": 3}) for i in range(3)]
    results = jobs.results([*plain, *tools], timeout_s=90)
    for result in results.values():
        assert result["status"] == "completed", (result.get("error"), result)
        assert result["nodes"]["init"] in names and result["nodes"]["run"] == result["nodes"]["init"], result["nodes"]
        assert result["nodes"]["eval"] in names
    for job_id, reward in plain.items():
        assert (results[job_id]["reward"], results[job_id]["eval"]) == (reward, {"ran": True})
    for job_id in tools:
        result = results[job_id]
        assert result["reward"] == 1.0, result["error"]
        assert [m["content"].strip() for m in result["messages"] if m["role"] == "tool"] == ["42"]
    spread = Counter(r["nodes"]["init"] for r in results.values())
    assert set(spread) == names, f"jobs did not reach every node: {spread}"


def cut_mid_run(jobs: Jobs, victim: Node, cut, count: int = 18, run_s: float = 4) -> dict:
    """Submit ``count`` node-local jobs, cut ``victim`` off while some of its jobs run and some
    wait in ``run.<victim>``, and check how every job ends. Returns timings for the report.

    The survivors must have the capacity to absorb the victim's jobs within the bound: retried
    jobs queue behind the survivors' own (``count`` x ``run_s`` of RUN work in all)."""
    expected = {jobs.submit(fault_job(i, init_sleep_s=0.2, run_sleep_s=run_s, sleep_first_attempt_only=True),
                            max_attempts=2): (i % 5) / 4 for i in range(count)}

    def victim_busy() -> dict[str, dict[str, str]] | None:
        """A snapshot of every job once the victim has one executing RUN and one queued in its
        own RUN queue for a while (not just handed over to a free RUN thread)."""
        pipe = jobs.state.pipeline(transaction=False)
        for job_id in expected:
            pipe.hmget(keys.job(job_id), ["status", "node", "status_at"])
        pipe.time()
        *rows, (seconds, micros) = pipe.execute()
        now = seconds + micros / 1e6
        snapshot = {job_id: dict(zip(("status", "node", "status_at"), row)) for job_id, row in zip(expected, rows)}
        mine = [r for r in snapshot.values() if r["node"] == victim.name]
        queued = any(r["status"] == "pending_run" and now - float(r["status_at"]) > 0.5 for r in mine)
        return snapshot if queued and any(r["status"] == "run" for r in mine) else None

    deadline = time.monotonic() + 60
    while (snapshot := victim_busy()) is None:
        assert time.monotonic() < deadline, f"no job ran and none queued on {victim.name} within 60 s"
        time.sleep(0.05)
    cut_at = time.time()
    cut()
    # jobs the cut takes from the victim; one in EVAL there may still finish just before the cut
    on_victim = {job_id for job_id, r in snapshot.items()
                 if r["node"] == victim.name and r["status"] in ("init", "pending_run", "run")}
    in_eval = {job_id for job_id, r in snapshot.items() if r["node"] == victim.name and r["status"] == "eval"}
    results = jobs.results(list(expected), timeout_s=BOUND_S + 30)
    ended_after = {}
    for job_id, result in results.items():
        ended = float(jobs.record(job_id, "ended_at")["ended_at"])
        if job_id in on_victim | in_eval:
            ended_after[job_id] = ended - cut_at
            assert ended - cut_at <= BOUND_S, f"job {job_id} of the cut node ended {ended - cut_at:.1f} s after"
        if job_id in on_victim:
            if result["status"] == "completed":  # re-routed: INIT again elsewhere, RUN there too
                assert result["attempt"] == 2 and result["nodes"]["init"] != victim.name, result
                assert result["nodes"]["run"] == result["nodes"]["init"], result["nodes"]
                assert result["reward"] == expected[job_id]
            else:
                assert result["status"] == "failed" and result["critical_error"] and result["error"], result
        elif job_id not in in_eval:  # the other nodes' jobs are unaffected
            assert (result["status"], result["attempt"], result["reward"]) == ("completed", 1, expected[job_id]), result
            assert result["nodes"]["run"] == result["nodes"]["init"], result["nodes"]
    reasons = Counter((jobs.record(job_id, "retry_reason")["retry_reason"] or "").split(":")[0] for job_id in on_victim)
    # both ways a node loses jobs were exercised: stages whose lease ran out, and jobs stranded in
    # the node's own RUN queue
    assert reasons["worker lost during run"] >= 1 and reasons["node lost while the job waited for RUN"] >= 1, reasons
    return {"victim_jobs": len(on_victim), "slowest_end_after_cut_s": round(max(ended_after.values()), 1),
            "reasons": dict(reasons)}


def test_reaper_retries_only_jobs_stranded_in_a_dead_nodes_run_queue(redis_url):
    """The reaper's second duty, against a real redis-server: a node-local job queued for a
    node without a live RUN worker goes back to INIT (or fails when out of attempts); one
    queued for a live node, or on the shared queue, is left alone."""
    client = redis.Redis.from_url(redis_url + "/6", decode_responses=True)
    client.flushdb()
    store = JobStore(client, result_ttl_s=60)
    now = time.time()
    for name, node, beat in (("run-live@h", "live", now), ("run-dead@h", "dead", now - 7)):  # 7 s > 6 beats
        client.zadd(keys.WORKERS, {name: beat})
        client.hset(keys.worker(name), mapping={"node": node, "queues": f"run,run.{node}"})

    def queued(job_id: str, node: str, run_queue: str, max_attempts: int = 2) -> None:
        store.create(job_id, {"task": "localfault", "instance": {}, "budget_s": 10, "attempt": 1,
                              "max_attempts": max_attempts})
        store.claim_stage(job_id, Stage.INIT, {"init_node": node})
        assert store.hand_over(job_id, Stage.INIT, {"run_queue": run_queue}, attempt=1).ok

    queued("on-dead", "dead", "run.dead")
    queued("on-dead-last-attempt", "dead", "run.dead", max_attempts=1)
    queued("on-live", "live", "run.live")
    queued("shared", "dead", "")
    retried = []
    reaped = reap_expired(store, lease_s=3, retry=retried.append, heartbeat_s=1)
    assert sorted(reaped) == ["on-dead", "on-dead-last-attempt"] and retried == ["on-dead"]
    record = store.load("on-dead")
    assert ((record.status, record.attempt, record.init_node, record.run_queue)
            == (JobStatus.PENDING_INIT, 2, None, None))
    assert record.retry_reason and record.retry_reason.startswith("node lost while the job waited for RUN")
    failed = store.load("on-dead-last-attempt")
    assert (failed.status, failed.critical_error) == (JobStatus.FAILED, "run") and "node lost" in (failed.error or "")
    assert store.status("on-live") is JobStatus.PENDING_RUN and store.status("shared") is JobStatus.PENDING_RUN
    client.flushdb()


@pytest.mark.extended
def test_three_nodes_on_loopback_survive_a_killed_node(qwen3_tokenizer, tmp_path):
    started = time.monotonic()
    llm, llm_url = start_llm(qwen3_tokenizer, "127.0.0.1", tmp_path)
    nodes = [Node(f"lo-n{i}", "127.0.0.1") for i in range(3)]
    try:
        with MultiNodeCluster(nodes, tmp_path, {**ENV, "PRORL_TOKENIZER": qwen3_tokenizer}, ONE_POOL,
                              llm_url=llm_url) as cluster:
            wait_for_llm(llm, llm_url)
            up = time.monotonic()
            jobs = Jobs(cluster)
            check_healthy_spread(cluster, jobs)
            healthy = time.monotonic()
            report = cut_mid_run(jobs, nodes[2], lambda: cluster.kill_node(nodes[2]))
            print(f"loopback: start {up - started:.1f} s, healthy phase {healthy - up:.1f} s, "
                  f"kill phase {time.monotonic() - healthy:.1f} s: {report}")
    finally:
        llm.stop()


@pytest.fixture
def namespaces():
    try:
        with Namespaces(3) as created:
            yield created
    except NetnsUnavailable as error:
        pytest.skip(f"network namespaces are not available here: {error}")


@pytest.mark.slow
def test_three_network_namespaces_survive_a_cut_link_and_a_killed_node(namespaces, qwen3_tokenizer, tmp_path):
    started = time.monotonic()
    llm, llm_url = start_llm(qwen3_tokenizer, namespaces.root_address, tmp_path)
    nodes = [Node(f"ns-n{i}", namespaces.addresses[i], namespaces.exec_prefix(i)) for i in range(3)]
    env = {**ENV, "PRORL_TOKENIZER": qwen3_tokenizer}
    try:
        with MultiNodeCluster(nodes, tmp_path, env, STAGE_POOLS, llm_url=llm_url) as cluster:
            wait_for_llm(llm, llm_url)
            up = time.monotonic()
            jobs = Jobs(cluster)
            check_healthy_spread(cluster, jobs)
            healthy = time.monotonic()
            link_down = cut_mid_run(jobs, nodes[2], lambda: namespaces.set_link(2, up=False))
            cut = time.monotonic()
            cluster.kill_node(nodes[2])  # partitioned, not dead: nothing else would stop it
            # one survivor with two RUN threads: less work, so that it absorbs the victim's in time
            killed = cut_mid_run(jobs, nodes[1], lambda: cluster.kill_node(nodes[1]), count=10, run_s=3)
            print(f"netns: start {up - started:.1f} s, healthy phase {healthy - up:.1f} s, link-down phase "
                  f"{cut - healthy:.1f} s: {link_down}, kill phase {time.monotonic() - cut:.1f} s: {killed}")
    finally:
        llm.stop()
