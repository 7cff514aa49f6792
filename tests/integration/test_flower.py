"""Flower watches the real pools: it sees the workers of all three queues and, once it has switched
task events on at run time (workers start with them off), every stage task of a job."""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from prorl_celery.dev.local import free_port
from tests.support.services import eventually

pytest.importorskip("flower", reason="Flower is the `monitor` extra (pip install 'prorl-celery[monitor]')")


@pytest.fixture(scope="module")
def flower(cluster, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("flower") / "flower.log", "wb")
    env = {**cluster.service_env(), "FLOWER_UNAUTHENTICATED_API": "true"}
    process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "prorl_celery", "flower",
                                f"--port={port}", "--address=127.0.0.1"],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def up() -> bool:
        try:
            return client.get("/healthcheck").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(up, 60, "flower answering")
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_flower_sees_the_three_pools_and_every_stage_of_a_job(gateway, flower) -> None:
    def queues_seen() -> set[str]:
        workers = flower.get("/api/workers", params={"refresh": "true"}).json()
        return {queue["name"] for info in workers.values() for queue in info.get("active_queues", [])}

    eventually(lambda: {"init", "run", "eval"} <= queues_seen(), 60, "init, run and eval workers in Flower")

    def all_stages_of_a_new_job_seen() -> bool:
        job_id = gateway.submit({}, task="noop")
        assert gateway.result(job_id)["status"] == "completed"
        seen: set[str] = set()
        for _ in range(20):  # events reach Flower asynchronously
            tasks = flower.get("/api/tasks").json()
            seen = {task["name"] for task in tasks.values() if job_id in str(task.get("args"))}
            if seen == {"prorl.init", "prorl.run", "prorl.eval"}:
                return True
            time.sleep(0.25)
        return False

    # workers start with task events off; Flower switches them on within a few seconds of its
    # start (and every 5 s after), so jobs submitted from then on show all three stages
    eventually(all_stages_of_a_new_job_seen, 90, "a job's three stage tasks in Flower")
