"""The project's sbatch script on a real Slurm cluster (``tests/support/slurm.py``): munge,
``slurmctld`` and one ``slurmd`` per node, three nodes in network namespaces where the machine
allows them (else one node; the test prints which layout ran).

- The smoke test (default run): the cluster comes up and one ``sbatch -N <nodes>`` job runs a
  step on every node.
- The full run (extended): ``sbatch -N 3 deploy/slurm/prorl.sbatch``, unchanged, brings up Redis,
  the gateway and the three pools; a trainer outside the allocation (this process) registers a
  scripted LLM server and runs jobs through the gateway: math with a python tool in a bubblewrap
  sandbox, and node-local jobs, every RUN on its INIT's node, on every node. A node is drained
  during a run (none lost). A long job is handed back at the allocation's time-limit warning
  (the USR1 ``--signal=B:USR1@120`` sends, here through ``scancel --batch --signal=USR1``) and
  finished by the next allocation on the same Redis directory. ``scancel`` of that one, with
  jobs in flight, leaves no process in any node and every job ended (read from Redis's file).

Without slurmctld, slurmd or munged the tests skip, or fail under CI (``CI`` or
``PRORL_REQUIRE_SLURM``, which ``.ci/run`` sets). Apptainer cannot be installed here: the
sandboxes are bubblewrap's; Apptainer's command lines are tested in ``test_runtime_units.py``.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from prorl_celery.dev.local import wait_until
from prorl_celery.trainer.client import RolloutClient
from tests.support.multinode import start_llm, wait_for_llm
from tests.support.slurm import (
    Service,
    SlurmCluster,
    SlurmUnavailable,
    allocation_processes,
    missing_daemons,
    service_env,
    statuses_on_disk,
    wait_for_job,
)

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = any(os.environ.get(name) for name in ("CI", "PRORL_REQUIRE_SLURM"))
TERMINAL = {"completed", "failed", "cancelled", "timeout"}


def _cluster(tmp: Path, count: int) -> SlurmCluster:
    missing = missing_daemons()
    if missing:
        message = f"Slurm is not installed here ({', '.join(missing)} missing): apt-get install slurmctld slurmd " \
                  "slurm-client munge"
        if REQUIRED:
            pytest.fail(f"the Slurm tests must run here (CI/PRORL_REQUIRE_SLURM set): {message}", pytrace=False)
        pytest.skip(message)
    try:
        return SlurmCluster(tmp, count).__enter__()
    except SlurmUnavailable as error:
        if REQUIRED:
            raise
        pytest.skip(str(error))


@pytest.fixture
def slurm(tmp_path):
    cluster = _cluster(tmp_path / "slurm", 3)
    print(f"Slurm layout: {cluster.layout} ({len(cluster.nodes)} nodes)"
          + (f"; no namespaces because {cluster.netns_problem}" if cluster.netns_problem else ""))
    try:
        yield cluster
    finally:
        cluster.close()


def test_slurm_cluster_runs_a_step_on_every_node(slurm, tmp_path):
    started = time.monotonic()
    out = tmp_path / "hosts.out"
    job = slurm.run("sbatch", "--parsable", "-N", str(len(slurm.nodes)), "-o", str(out), "--wrap",
                    "srun hostname").stdout.strip()
    assert wait_for_job(slurm, job, {"COMPLETED", "FAILED", "CANCELLED"}, 30) == "COMPLETED", out.read_text()
    assert sorted(out.read_text().split()) == sorted(node.name for node in slurm.nodes)
    print(f"{slurm.layout}: an sbatch over {len(slurm.nodes)} nodes ran in {time.monotonic() - started:.1f} s")


@pytest.mark.extended
def test_prorl_sbatch_runs_the_service_on_a_slurm_allocation(slurm, qwen3_tokenizer, tmp_path):
    names = [node.name for node in slurm.nodes]
    llm, llm_url = start_llm(qwen3_tokenizer, slurm.controller_address, tmp_path)
    redis_dir = tmp_path / "redis"
    env = service_env(slurm, tmp_path, PRORL_TOKENIZER=qwen3_tokenizer)
    report: dict[str, object] = {"layout": slurm.layout, "nodes": len(names)}
    try:
        first = Service(slurm, env, tmp_path)
        report.update(gateway_answers_s=round(first.up_s, 1), workers_ready_s=round(first.ready_s, 1))
        assert sorted(first.nodes()) == sorted(names)
        assert all(n["state"] == "up" for n in first.nodes().values())
        wait_for_llm(llm, llm_url)
        with RolloutClient(first.url) as client:
            client.add_llm_server(llm_url)
            # node-affine jobs on every node, and math with a python tool in a bubblewrap sandbox
            local = [client.submit({"data_source": "localfault", "instance_id": f"l{i}", "init_sleep_s": 0.3,
                                    "run_sleep_s": 0.3, "sandbox": i % 3 == 0, "reward": 0.5})
                     for i in range(12)]
            tools = [client.submit({"data_source": "math", "problem": f"PYTOOL: what is 6 times 7? ({i})",
                                    "answer": "42", "tools": ["python"], "max_iterations": 3}) for i in range(3)]
            results = first.results([*local, *tools], 180)
        for result in results.values():
            assert result["status"] == "completed", result
            assert result["nodes"]["run"] == result["nodes"]["init"] in names, result["nodes"]
        assert all(results[j]["reward"] == 1.0 for j in tools), [results[j] for j in tools]
        spread = Counter(r["nodes"]["init"] for r in results.values())
        assert set(spread) == set(names), spread
        report["spread"] = dict(spread)

        if len(names) > 1:  # a drain during a run: the node finishes what it holds, none lost
            victim = names[-1]
            batch = [first.http.post("/jobs", json={"instance": {"data_source": "localfault", "instance_id": f"d{i}",
                                                                 "init_sleep_s": 0.3, "run_sleep_s": 2}}
                                     ).json()["job_id"] for i in range(12)]
            wait_until(lambda: first.nodes()[victim]["busy"] > 0, 60, f"a stage on {victim}")
            asked = time.monotonic()
            assert first.http.post(f"/nodes/{victim}/drain").status_code == 200
            wait_until(lambda: first.nodes()[victim]["state"] == "drained", 60, f"{victim} drained")
            report["drained_s"] = round(time.monotonic() - asked, 1)
            drained = first.results(batch, 120)
            assert all(r["status"] == "completed" and r["attempt"] == 1 for r in drained.values()), drained
            assert first.http.post(f"/nodes/{victim}/undrain").status_code == 200

        # scancel with jobs in flight: every process ends, every job ends
        inflight = [first.http.post("/jobs", json={"instance": {"data_source": "localfault", "instance_id": f"c{i}",
                                                                "run_sleep_s": 60, "sandbox": i % 2 == 0}}
                                    ).json()["job_id"] for i in range(8)]
        wait_until(lambda: sum(n["busy"] for n in first.nodes().values()) >= 2, 60, "jobs in RUN")
        cancelled_at = time.monotonic()
        slurm.run("scancel", first.job)
        deadline = time.monotonic() + 60
        while left := allocation_processes(slurm, first.job):
            assert time.monotonic() < deadline, f"left 60 s after scancel: {left}"
            time.sleep(0.1)
        report["scancel_to_no_process_s"] = round(time.monotonic() - cancelled_at, 1)
        on_disk = statuses_on_disk(redis_dir, inflight, tmp_path)
        assert set(on_disk.values()) == {"cancelled"}, on_disk

        # a job longer than the allocation: a real time limit (3 minutes, the warning 90 s before
        # it, where the script's own is 120 s before 24 h; slurmctld looks every 30 s or so),
        # handed back at the warning...
        second = Service(slurm, env, tmp_path, "--time=3", "--signal=B:USR1@90")
        long_job = second.http.post("/jobs", json={"instance": {"data_source": "localfault", "instance_id": "long",
                                                                "run_sleep_s": 3600, "sleep_first_attempt_only": True,
                                                                "sandbox": True, "reward": 0.75}}).json()["job_id"]
        wait_until(lambda: second.http.get(f"/jobs/{long_job}").json().get("status") == "run", 60, "its RUN")
        assert wait_for_job(slurm, second.job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"}, 200) \
            == "COMPLETED", second.log.read_text()
        assert "handing back" in second.log.read_text()
        assert not allocation_processes(slurm, second.job)
        assert statuses_on_disk(redis_dir, [long_job], tmp_path) == {long_job: "pending_init"}
        # ...and finished by the next allocation on the same Redis directory
        third = Service(slurm, env, tmp_path)
        finished = third.results([long_job], 120)[long_job]
        assert (finished["status"], finished["reward"]) == ("completed", 0.75), finished
        # handed back by the first allocation's workers; a later attempt may have lost a race of
        # the third's start (an INIT before its node's RUN worker was up: retried, not lost)
        assert finished["attempts"][0]["detail"] == "worker shut down during run", finished["attempts"]
        report["long_job_attempts"] = finished["attempt"]
        slurm.run("scancel", third.job)
        wait_for_job(slurm, third.job, {"CANCELLED", "GONE"}, 60)
        print(f"prorl.sbatch on Slurm: {report}")
    finally:
        llm.stop()


@pytest.mark.extended
def test_prorl_sbatch_with_sentinel_loses_no_job_when_the_primary_dies(slurm, tmp_path):
    """``PRORL_REDIS_REPLICATION=sentinel sbatch -N 3 prorl.sbatch``: the Sentinel group on the
    first three nodes (``redis.sh``), the primary's redis-server SIGKILLed with jobs in flight,
    every accepted job completed, and ``scancel`` ending every process, the group's included."""
    if len(slurm.nodes) < 3:
        pytest.skip(f"a Sentinel group needs 3 nodes; the {slurm.layout} layout has {len(slurm.nodes)}")
    password = "slurm sentinel pass"
    env = service_env(slurm, tmp_path, PRORL_REDIS_REPLICATION="sentinel", PRORL_REDIS_PASSWORD=password)
    service = Service(slurm, env, tmp_path)
    report: dict[str, object] = {"gateway_answers_s": round(service.up_s, 1)}
    primary = redis.Redis(host=slurm.nodes[0].address, port=6379, password=password, socket_timeout=3)
    assert primary.info("replication")["role"] == "master"

    def submit(prefix: str, count: int) -> list[str]:
        return [service.http.post("/jobs", json={"instance": {
            "data_source": "localfault", "instance_id": f"{prefix}{i}", "init_sleep_s": 0.3, "run_sleep_s": 2,
            "sandbox": i % 3 == 0, "reward": 0.5}}).json()["job_id"] for i in range(count)]

    before = submit("s", 12)
    wait_until(lambda: sum(n["busy"] for n in service.nodes().values()) >= 2, 60, "jobs in RUN")
    pid = int(primary.info("server")["process_id"])
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    results, report["answers_503"] = _results_riding_out_503(service, before, 240)
    report["kill_to_all_terminal_s"] = round(time.monotonic() - killed, 1)
    assert {r["status"] for r in results.values()} == {"completed"}, results
    assert all(r["reward"] == 0.5 for r in results.values())
    report["attempts"] = dict(Counter(r["attempt"] for r in results.values()))
    # the replica on the second node is the primary now; a job submitted after the failover runs
    promoted = redis.Redis(host=slurm.nodes[1].address, port=6379, password=password, socket_timeout=3)
    assert promoted.info("replication")["role"] == "master"
    after = service.results(submit("a", 3), 120)
    assert {r["status"] for r in after.values()} == {"completed"}, after
    # the first node's member brought its server back as the new primary's replica
    wait_until(lambda: primary.info("replication")["role"] == "slave", 60, "the old primary back as a replica")

    cancelled_at = time.monotonic()
    slurm.run("scancel", service.job)
    deadline = time.monotonic() + 60
    while left := allocation_processes(slurm, service.job):
        assert time.monotonic() < deadline, f"left 60 s after scancel: {left}"
        time.sleep(0.2)
    report["scancel_to_no_process_s"] = round(time.monotonic() - cancelled_at, 1)
    print(f"prorl.sbatch with Sentinel on Slurm: {report}")


def _results_riding_out_503(service: Service, job_ids: list[str], timeout_s: float) -> tuple[dict[str, dict], int]:
    """Each job's result as a trainer gets it: a 503 (Redis failing over) retried, as the client
    does. Returns the results and how many 503s were answered."""
    deadline, out, unavailable = time.monotonic() + timeout_s, {}, 0
    for job_id in job_ids:
        while True:
            wait = min(60.0, max(0.1, deadline - time.monotonic()))
            response = service.http.get(f"/jobs/{job_id}", params={"wait": wait})
            if response.status_code == 503:
                unavailable += 1
                time.sleep(0.5)
            elif response.status_code != 408 and response.json().get("status") not in (None, "pending_init",
                                                                                        "init", "pending_run",
                                                                                        "run", "pending_eval", "eval"):
                break
            if time.monotonic() > deadline:
                break
        assert response.status_code == 200, f"job {job_id} did not end in time: {response.text}"
        out[job_id] = response.json()
    return out, unavailable
