"""Many jobs in one request: ``POST /jobs`` with an array, and a group with ``num_samples``,
through the gateway app (in this process), real workers and Redis (the ``fault`` task needs no
LLM); the trainer client's batches go over HTTP to the cluster's gunicorn."""
from __future__ import annotations

import pytest

from prorl_celery.trainer.client import JobRequest, RolloutClient


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


def job(reward: float, **extra) -> dict:
    return {"data_source": "fault", "reward": reward, **extra}


def test_an_array_of_requests_is_one_submission(gateway):
    body = [{"instance": job(0.25), "job_id": "batch-a"}, {"instance": job(0.5)},
            {"instance": job(1.0), "job_id": "batch-a"}]  # a repeated id is the same job
    response = gateway.post("/jobs", json=body)
    assert response.status_code == 202, response.text
    jobs = response.json["jobs"]
    assert [j["created"] for j in jobs] == [True, True, False] and jobs[0]["job_id"] == jobs[2]["job_id"] == "batch-a"
    assert [gateway.result(j["job_id"])["reward"] for j in jobs] == [0.25, 0.5, 0.25]


def test_a_group_is_num_samples_jobs_of_one_instance(gateway):
    response = gateway.post("/jobs", json={"instance": job(1.0, instance_id="q7"), "job_id": "grp", "num_samples": 4})
    assert response.status_code == 202, response.text
    reply = response.json
    assert reply["group_id"] == "grp" and [j["job_id"] for j in reply["jobs"]] == [f"grp-{i}" for i in range(4)]
    results = [gateway.result(j["job_id"]) for j in reply["jobs"]]
    assert [r["trajectory_id"] for r in results] == [0, 1, 2, 3]
    assert {r["instance_id"] for r in results} == {"q7"} and all(r["status"] == "completed" for r in results)


def test_a_bad_request_in_a_batch_names_its_index_and_creates_nothing(gateway):
    response = gateway.post("/jobs", json=[{"instance": job(1.0), "job_id": "fine-0"},
                                           {"instance": {"data_source": "nope"}}])
    assert response.status_code == 400 and response.json["message"].startswith("[1] ")
    assert gateway.get("/jobs/fine-0").status_code == 404
    malformed = gateway.post("/jobs", json=[{"instance": job(1.0)}, {"sampling_params": {}}])
    assert malformed.status_code == 400 and "1.instance: Field required" in malformed.json["message"]
    assert gateway.post("/jobs", json=[]).status_code == 400
    group_on_process = gateway.post("/process", json={"instance": job(1.0), "num_samples": 2})
    assert group_on_process.status_code == 400 and "num_samples" in group_on_process.json["message"]
    # a group's jobs are <job_id>-<i>: each must be a job id that GET /jobs/<id> and /jobs/wait accept
    longest = "g" * 125
    too_long = gateway.post("/jobs", json={"instance": job(1.0), "job_id": longest + "x", "num_samples": 11})
    assert too_long.status_code == 400 and "at most 125 characters, got 126" in too_long.json["message"], too_long.text
    fits = gateway.post("/jobs", json={"instance": job(1.0), "job_id": longest, "num_samples": 11})
    assert fits.status_code == 202 and gateway.result(f"{longest}-10")["status"] == "completed"


def test_the_client_submits_in_batches_and_groups(gateway):
    with RolloutClient(gateway.cluster.gateway_url) as client:
        ids = client.submit_many([JobRequest(job(0.1 * (i % 3))) for i in range(7)], batch_size=3)
        assert len(ids) == len(set(ids)) == 7
        assert [r["reward"] for r in client.wait_all(ids)] == pytest.approx([0.1 * (i % 3) for i in range(7)])
        group = client.submit_group(job(1.0), 3, group_id="g2")
        assert group == ["g2-0", "g2-1", "g2-2"]
        assert all(r["status"] == "completed" for r in client.wait_all(group))
