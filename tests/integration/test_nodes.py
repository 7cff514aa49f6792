"""Nodes that join, report and drain: two nodes on loopback (separate node names), each one
worker process for INIT, RUN and EVAL.

Both report in ``/status`` and ``GET /nodes`` (queues, slots, versions). ``prorl nodes drain``
during a run: the node takes no new rollout, finishes those it holds (on their first attempt:
none lost, none retried) and reports drained; new jobs all go to the other node; ``prorl nodes
undrain`` brings it back. A node whose workers die is reported gone.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest

from prorl_celery.dev.local import wait_until
from tests.support.multinode import MultiNodeCluster, Node

ENV = {"PRORL_HANDLERS": "localfault=tests.support.handlers:LocalFaultHandler", "PRORL_HEARTBEAT_S": "0.5",
       "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_SHUTDOWN_GRACE_S": "1",
       "PRORL_VISIBILITY_TIMEOUT_S": "10"}
POOL = {"init,run,eval": 3}


def nodes(http: httpx.Client) -> dict[str, dict]:
    return {n["node"]: n for n in http.get("/nodes").json()["nodes"]}


def prorl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prorl_celery.cli", *args], capture_output=True, text=True,
                          timeout=120)


def submit(http: httpx.Client, index: int, **instance) -> str:
    response = http.post("/jobs", json={"instance": {"data_source": "localfault", "instance_id": f"j{index}",
                                                     **instance}})
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def results(http: httpx.Client, job_ids: list[str], timeout_s: float = 90) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    out = {}
    for job_id in job_ids:
        response = http.get(f"/jobs/{job_id}", params={"wait": max(0.1, deadline - time.monotonic())})
        assert response.status_code == 200, f"job {job_id} did not end: {response.text}"
        out[job_id] = response.json()
    return out


@pytest.mark.extended  # kept out of the default run's 10 minutes; CI's extended phase runs it
def test_a_node_drains_during_a_run_without_losing_a_rollout_and_comes_back(tmp_path):
    a, b = Node("dr-a", "127.0.0.1"), Node("dr-b", "127.0.0.1")
    with MultiNodeCluster([a, b], tmp_path, ENV, POOL) as cluster:
        http = httpx.Client(base_url=cluster.gateway_url, timeout=120)
        listed = nodes(http)
        assert {name: n["state"] for name, n in listed.items()} == {"dr-a": "up", "dr-b": "up"}
        assert listed["dr-a"]["slots"] == {"init": 3, "run": 3, "eval": 3, "run.dr-a": 3}
        assert {"prorl_celery", "python", "celery", "bubblewrap"} <= listed["dr-a"]["versions"].keys()
        assert {n["node"]: n["state"] for n in http.get("/status").json()["nodes"]} == {"dr-a": "up", "dr-b": "up"}

        # a run: RUN stages of 2 s, half of them holding a sandbox from INIT to the end of RUN
        first = [submit(http, i, init_sleep_s=0.2, run_sleep_s=2, sandbox=i % 2 == 0) for i in range(12)]
        wait_until(lambda: nodes(http)["dr-a"]["busy"] > 0, 60, "a stage held on dr-a")
        asked = time.monotonic()
        drained = prorl("nodes", "drain", "dr-a", "--gateway", cluster.gateway_url, "--wait", "60")
        drain_s = time.monotonic() - asked
        assert drained.returncode == 0, drained.stderr
        assert " drained " in drained.stdout, drained.stdout
        state = nodes(http)["dr-a"]
        assert (state["busy"], state["waiting_run"], state["sandboxes"]) == (0, 0, 0), state
        ended = results(http, first)
        assert all(r["status"] == "completed" and r["attempt"] == 1 for r in ended.values()), ended
        assert all(r["nodes"]["run"] == r["nodes"]["init"] for r in ended.values())
        on_a = sum(r["nodes"]["init"] == "dr-a" for r in ended.values())
        assert on_a >= 1, "no rollout of the run was on the drained node"

        # drained: new rollouts all go to the other node; the drained one stays drained
        later = results(http, [submit(http, 100 + i, init_sleep_s=0.3, run_sleep_s=0.3) for i in range(6)])
        assert Counter(r["nodes"]["init"] for r in later.values()) == {"dr-b": 6}
        assert nodes(http)["dr-a"]["state"] == "drained"

        undrained = prorl("nodes", "undrain", "dr-a", "--gateway", cluster.gateway_url)
        assert undrained.returncode == 0 and " up " in undrained.stdout, (undrained.stdout, undrained.stderr)
        wait_until(lambda: nodes(http)["dr-a"]["workers"] and not any(
            w["draining"] for w in http.get("/status").json()["workers"]), 20, "dr-a's workers undrained")
        back = results(http, [submit(http, 200 + i, init_sleep_s=0.5, run_sleep_s=0.5) for i in range(8)])
        assert "dr-a" in {r["nodes"]["init"] for r in back.values()}, back
        print(f"drain: {on_a} of {len(first)} rollouts on dr-a, drained {drain_s:.1f} s after the drain was asked")

        unknown = http.post("/nodes/no-such-node/drain")
        assert unknown.status_code == 404 and unknown.json()["code"] == "node_not_found"
        failed = prorl("nodes", "drain", "no-such-node", "--gateway", cluster.gateway_url)
        assert failed.returncode == 1 and "no-such-node" in failed.stderr
        listing = prorl("nodes", "list", "--gateway", cluster.gateway_url)
        assert listing.returncode == 0 and "dr-a" in listing.stdout and "dr-b" in listing.stdout

        cluster.kill_node(b)
        wait_until(lambda: nodes(http)["dr-b"]["state"] == "gone", 30, "dr-b reported gone")
        assert nodes(http)["dr-b"]["last_seen_s"] >= 3 and nodes(http)["dr-a"]["state"] == "up"

