"""The rollout service end to end: the gateway app (in this process, Flask's test client, with
the cluster's settings as one object), real Celery workers, Redis and LLM servers."""
from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.state import keys
from tests.support.services import eventually, rules_file, start_llm_server


def math(problem: str, answer: str, **extra) -> dict:
    return {"data_source": "math", "problem": problem, "answer": answer, **extra}


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture
def backend(gateway, llm_servers):
    server = llm_servers[0]
    server.reset()
    assert gateway.post("/add_llm_server", json={"address": server.address()}).status_code == 200
    return server


def test_correct_and_wrong_answers(gateway, backend):
    right = gateway.process(math("What is 2 + 3?", "5", instance_id="p1", trajectory_id="t1"))
    wrong = gateway.process(math("What is 7 \\times 6?", "42"))
    assert (right["status"], right["reward"], right["critical_error"]) == ("completed", 1.0, None)
    assert (right["instance_id"], right["trajectory_id"]) == ("p1", "t1")
    assert (wrong["status"], wrong["reward"]) == ("completed", 0.0)
    trajectory = right["trajectory"]
    assert trajectory["num_turns"] == 1 and trajectory["backend"] == backend.address()
    assert len(trajectory["response_ids"]) == len(trajectory["response_mask"]) == len(trajectory["response_logprobs"])
    assert right["messages"][-1]["role"] == "assistant" and "\\boxed{5}" in right["messages"][-1]["content"]
    served = backend.log()[0]
    assert served["prompt_ids"] == trajectory["prompt_ids"] and served["output_ids"] == trajectory["response_ids"]
    assert set(right["timing"]) == {"init_s", "run_s", "eval_s", "active_s", "queued_s",  # ours, and v1's:
                                    "init_time", "run_time", "eval_time", "others_time", "counted_elapsed",
                                    "timeout_triggered"}

    generated = sum(right["trajectory"]["response_mask"]) + sum(wrong["trajectory"]["response_mask"])

    def counted() -> float:  # RUN workers flush their counters every 2 s
        lines = [x for x in gateway.get("/metrics").text.splitlines() if x.startswith("prorl_tokens_generated_total")]
        return float(lines[0].split()[-1]) if lines else 0.0
    eventually(lambda: counted() >= generated, 10, "tokens_generated counter")


def test_multi_turn_job_appends_only_new_tokens(gateway, backend):
    result = gateway.process(math("MULTI: what is 10 - 4?", "6", max_iterations=4))
    assert result["reward"] == 1.0
    trajectory = result["trajectory"]
    assert trajectory["num_turns"] == 3
    assert [m["role"] for m in result["messages"]].count("user") == 3  # the problem and two follow-ups
    calls = backend.log()
    assert len(calls) == 3
    full = trajectory["prompt_ids"] + trajectory["response_ids"]
    for call, turn in zip(calls, trajectory["turns"]):
        # each call received exactly the trajectory so far and produced the ids we kept
        assert call["prompt_ids"] == full[:turn["context_len"]]
        start = len(trajectory["prompt_ids"]) + turn["output_start"]
        assert call["output_ids"] == full[start:start + turn["output_len"]]
        assert trajectory["response_mask"][turn["output_start"]:turn["output_start"] + turn["output_len"]] == \
            [1] * turn["output_len"]
    assert trajectory["response_mask"].count(0) > 0  # the follow-up observations


@pytest.mark.parametrize("stage", ["init", "run", "eval"])
def test_stage_failure_ends_with_structured_result(gateway, stage):
    """A handler's exception is no judgement of the policy: it is retried (EVAL alone for EVAL's),
    then ends the job with its class, each attempt's outcome and no reward, never 0."""
    result = gateway.process({"data_source": "fault", "fail": stage}, max_attempts=2)
    assert result["status"] == "failed"
    assert result["critical_error"] == stage
    assert f"scripted failure in {stage}" in result["error"] and f"scripted failure in {stage}" in result["detail"]
    expected = "eval_error" if stage == "eval" else "env_error"
    assert (result["outcome"], result["outcome_stage"], result["reward_valid"], result["retryable"]) == \
        (expected, stage, False, True)
    assert result["reward"] is None and result["score"] == 0.0 and result["filter"] is True
    assert isinstance(result["timing"], dict)
    assert [(a["attempt"], a["outcome"], a["stage"]) for a in result["attempts"]] == \
        [(1, expected, stage), (2, expected, stage)]
    if stage == "run":  # out of attempts, RUN's failure still went through EVAL, with the fallback
        assert result["eval"] == {"ran": False}
    if stage == "init":
        assert result["timing"]["run_s"] == 0 and result["timing"]["eval_s"] == 0


def test_a_failure_outside_the_policy_that_passes_is_retried_to_ok(gateway):
    """The first attempt's RUN fails (a stage of 0.3 s, then the scripted failure once), the
    second completes: the result is ``ok`` and keeps the first attempt's outcome."""
    result = gateway.process({"data_source": "fault", "fail_first_attempt_only": "run"}, max_attempts=2)
    assert (result["status"], result["outcome"], result["reward"], result["reward_valid"]) == \
        ("completed", "ok", 1.0, True)
    assert [(a["attempt"], a["outcome"]) for a in result["attempts"]] == [(1, "env_error"), (2, "ok")]


def test_stage_timeout(gateway):
    started = time.monotonic()
    result = gateway.process({"data_source": "fault", "run_sleep_s": 30}, timeout_s=1.0)
    assert result["status"] == "timeout" and result["critical_error"] == "timeout"
    assert time.monotonic() - started < 10
    assert 0.9 <= result["timing"]["active_s"] < 5


def test_queue_time_is_not_counted(gateway):
    # 8 jobs of 1.2 s INIT on a 4-thread INIT pool: the second four wait ~1.2 s in the queue,
    # which must not count against their 2 s budget
    ids = [gateway.submit({"data_source": "fault", "init_sleep_s": 1.2}, timeout_s=2.0) for _ in range(8)]
    results = [gateway.result(job_id) for job_id in ids]
    assert [r["status"] for r in results] == ["completed"] * 8
    assert max(r["timing"]["queued_s"] for r in results) > 0.8
    assert all(r["timing"]["active_s"] < 2.0 for r in results)


def test_cancel_while_queued(gateway):
    blockers = [gateway.submit({"data_source": "fault", "init_sleep_s": 2}) for _ in range(4)]
    queued = gateway.submit({"data_source": "fault"})
    assert gateway.post("/cancel", json={"job_id": queued}).json["cancelled"] == [queued]
    result = gateway.result(queued, wait=1)
    assert result["status"] == "cancelled"
    for job_id in blockers:
        gateway.result(job_id)
    time.sleep(0.5)  # the cancelled job's INIT message has been dequeued by now and skipped
    assert gateway.result(queued)["timing"]["init_s"] == 0


def test_cancel_mid_llm_call_aborts_backend_request(gateway, backend):
    job_id = gateway.submit(math("SLOW question", "1"))
    eventually(lambda: len(backend.log()) == 1, 20, "LLM request started")
    started = time.monotonic()
    assert gateway.post("/cancel", json={"job_ids": [job_id]}).json["cancelled"] == [job_id]
    result = gateway.result(job_id, wait=5)
    assert result["status"] == "cancelled" and time.monotonic() - started < 2
    eventually(lambda: backend.log()[0]["aborted"], 10, "backend saw the request aborted")
    status = gateway.get("/status").json
    assert status["stages"]["run"]["active"] == 0


def test_cancel_after_completion_is_refused(gateway):
    result = gateway.process({"data_source": "fault"})
    reply = gateway.post("/cancel", json={"job_id": result["job_id"]}).json
    assert reply == {"cancelled": [], "not_cancelled": {result["job_id"]: "completed"}}
    assert gateway.result(result["job_id"])["status"] == "completed"


def test_routing_is_sticky_and_balanced(gateway, llm_servers):
    for server in llm_servers:
        server.reset()
        assert gateway.post("/add_llm_server", json={"address": server.address()}).status_code == 200
    ids = [gateway.submit(math(f"MULTI problem {i}", "6", max_iterations=3)) for i in range(10)]
    results = [gateway.result(job_id) for job_id in ids]
    assert all(r["reward"] == 1.0 for r in results)
    per_backend = Counter(r["backend"] for r in results)
    assert abs(per_backend[llm_servers[0].address()] - per_backend[llm_servers[1].address()]) <= 1
    for server in llm_servers:  # every turn of a job went to the job's backend
        mine = {r["job_id"] for r in results if r["backend"] == server.address()}
        assert len(server.log()) == 3 * len(mine)
    counts = {s["address"]: s["assigned"] for s in gateway.get("/llm_servers").json["servers"]}
    assert sorted(counts.values()) == [5, 5]


def test_clear_llm_server_mid_run(gateway, llm_servers):
    old, new = llm_servers
    old.reset(), new.reset()
    assert gateway.post("/add_llm_server", json={"address": old.address()}).status_code == 200
    in_flight = gateway.submit(math("SLOW but finishing", "1"), sampling_params={"max_tokens": 64})
    eventually(lambda: len(old.log()) == 1, 20, "in-flight job reached its backend")
    generation = gateway.post("/clear_llm_server").json["generation"]
    assert gateway.post("/add_llm_server", json={"address": new.address()}).status_code == 200
    fresh = gateway.process(math("What is 2 + 3?", "5"))
    assert fresh["backend"] == new.address() and fresh["generation"] == generation
    gateway.post("/cancel", json={"job_id": in_flight})
    assert gateway.result(in_flight)["backend"] == old.address()


def test_stop_and_start(gateway):
    running = gateway.submit({"data_source": "fault", "run_sleep_s": 30})
    gateway.wait_for_stage(running, "run")
    assert gateway.post("/stop").json["cancelled"] == 1
    assert gateway.result(running, wait=5)["status"] == "cancelled"
    refused = gateway.post("/process", json={"instance": {"data_source": "fault"}})
    assert refused.status_code == 503 and refused.json["code"] == "service_stopped"
    assert gateway.get("/status").json["state"] == "stopped"
    assert gateway.post("/start").status_code == 200
    assert gateway.process({"data_source": "fault"})["status"] == "completed"


def test_idempotent_job_id(gateway):
    body = {"instance": {"data_source": "fault", "init_sleep_s": 0.3}, "job_id": "same-id-1"}
    first = gateway.post("/jobs", json=body).json
    second = gateway.post("/jobs", json=body).json
    assert (first["created"], second["created"]) == (True, False)
    assert gateway.post("/process", json=body).json["job_id"] == "same-id-1"
    assert gateway.get("/status").json["jobs"]["completed"] == 1


def test_no_backend_fails_clearly_after_budget(gateway):
    result = gateway.process(math("What is 2 + 3?", "5"), timeout_s=1.0)
    assert result["status"] == "timeout"
    assert "add_llm_server" in result["error"]


@pytest.mark.parametrize("body, field", [
    ({"sampling_params": {}}, "instance"),
    ({"instance": {"problem": "1+1", "answer": "2"}}, "data_source"),
    ({"instance": {"data_source": "math", "problem": "1+1", "answer": "2"},
      "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
    ({"instance": {"data_source": "math", "problem": "1+1", "answer": "2"}, "timeout_s": -1}, "timeout_s"),
    ({"instance": {"data_source": "math", "problem": "1+1", "answer": "2"}, "surprise": 1}, "surprise"),
    ({"instance": {"data_source": "math"}}, "instance"),
    ({"instance": {"data_source": "fault"}, "job_id": "bad id with spaces"}, "job_id"),
    ({"instance": {"data_source": "math", "problem": "1+1", "answer": "2", "tools": ["shell"]}}, "tools"),
])
def test_bad_requests_name_the_field(gateway, body, field):
    response = gateway.post("/process", json=body)
    assert response.status_code == 400, response.text
    assert response.json["code"] == "bad_request"
    assert field in response.json["message"]


def test_unknown_task_lists_registered_tasks(gateway):
    response = gateway.post("/process", json={"instance": {"data_source": "chess"}})
    assert response.status_code == 400
    assert response.json["code"] == "unknown_task"
    assert "math" in response.json["message"] and "chess" in response.json["message"]


def test_a_misspelled_sampling_key_is_refused_naming_the_closest(gateway):
    """A user who typed ``max_token`` once trained on rollouts of the default length: 202, ignored."""
    for path in ("/process", "/jobs"):
        response = gateway.post(path, json={"instance": math("What is 2 + 3?", "5"),
                                            "sampling_params": {"max_token": 64, "temperature": 1.0}})
        assert response.status_code == 400, response.text
        message = response.json["message"]
        assert "sampling_params" in message and "'max_token'" in message
        assert "did you mean 'max_tokens'" in message
    batch = gateway.post("/jobs", json=[{"instance": math("What is 2 + 3?", "5"),
                                         "sampling_params": {"tmperature": 1}}])
    assert batch.status_code == 400 and "did you mean 'temperature'" in batch.json["message"], batch.text


def test_malformed_json_and_a_missing_content_type_are_told_apart(gateway):
    broken = gateway.post("/process", data=b"{not json", headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json["message"], broken.json
    untyped = gateway.post("/process", data=b'{"instance": {}}', headers={"Content-Type": "text/plain"})
    assert untyped.status_code == 400 and "Content-Type must be application/json, got text/plain" \
        in untyped.json["message"], untyped.json
    assert broken.json["message"] != untyped.json["message"]


def test_huge_body_and_unknown_job(gateway):
    huge = gateway.post("/process", json={"instance": {"data_source": "math", "problem": "x" * (11 * 2**20)}})
    assert huge.status_code == 413 and huge.json["code"] == "payload_too_large"
    missing = gateway.get("/jobs/nope")
    assert missing.status_code == 404 and missing.json["code"] == "job_not_found"


def test_status_metrics_and_openapi(gateway):
    gateway.process({"data_source": "fault"})
    status = gateway.get("/status").json
    assert set(status["stages"]) == {"init", "run", "eval"}
    assert {"math", "noop", "fault"} <= set(status["tasks"])

    def queues_seen() -> set:  # heartbeats re-register within 5 s of the per-test flush
        return {tuple(w["queues"]) for w in gateway.get("/status").json["workers"]}
    eventually(lambda: {("init",), ("eval",)} <= queues_seen(), 10, "worker heartbeats")
    assert status["jobs"]["completed"] == 1
    metrics = gateway.get("/metrics").text
    assert 'prorl_jobs{status="completed"} 1.0' in metrics

    def stage_count(stage: str) -> float:  # workers flush their histograms every 2 s
        line = f'prorl_stage_duration_seconds_count{{stage="{stage}"}}'
        found = [x for x in gateway.get("/metrics").text.splitlines() if x.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0
    eventually(lambda: all(stage_count(s) >= 1 for s in ("init", "run", "eval")), 10, "stage histograms")
    spec = gateway.get("/openapi.json").json
    assert "/process" in spec["paths"] and "ProcessRequest" in spec["components"]["schemas"]
    assert gateway.get("/healthz").json == {"ok": True}


@pytest.mark.parametrize("protocol", ["vllm", "sglang", "llamacpp"])
def test_every_backend_protocol_is_token_exact(gateway, llm_servers, protocol):
    server = llm_servers[0]
    server.reset()
    added = gateway.post("/add_llm_server", json={"address": server.address(protocol), "type": protocol})
    assert added.status_code == 200
    result = gateway.process(math("MULTI: what is 10 - 4?", "6", max_iterations=3),
                             sampling_params={"seed": 3, "temperature": 0.7, "max_tokens": 32})
    assert result["reward"] == 1.0, result["error"]
    trajectory = result["trajectory"]
    calls = server.log()
    assert [c["protocol"] for c in calls] == [protocol] * 3
    full = trajectory["prompt_ids"] + trajectory["response_ids"]
    for call, turn in zip(calls, trajectory["turns"]):
        assert call["prompt_ids"] == full[:turn["context_len"]]
        assert call["logprobs"][:turn["output_len"]] == trajectory["response_logprobs"][
            turn["output_start"]:turn["output_start"] + turn["output_len"]]


def kill_run_worker_of(gateway, job_id: str, sig: int = signal.SIGKILL) -> None:
    """Signal the RUN worker executing ``job_id``, wait for it to exit, start a fresh RUN worker."""
    cluster = gateway.cluster
    pid = int(redis.Redis.from_url(cluster.state_url).hget(keys.job(job_id), "worker_pid"))
    victim = next(p for p in cluster.processes if p.popen.pid == pid)
    os.kill(pid, sig)
    victim.popen.wait(30)
    cluster.processes.remove(victim)
    cluster.start_worker(Stage.RUN, 8)


def test_killed_worker_ends_the_job_instead_of_leaving_it_running(gateway):
    job_id = gateway.submit({"data_source": "fault", "run_sleep_s": 120}, max_attempts=1)
    gateway.wait_for_stage(job_id, "run")
    kill_run_worker_of(gateway, job_id)
    result = gateway.result(job_id, wait=30)
    assert (result["status"], result["critical_error"]) == ("failed", "run")
    assert "worker lost during run" in result["error"]
    assert (result["outcome"], result["reward"], result["retryable"]) == ("env_error", None, True)
    gateway.cluster.wait_for_workers()
    assert gateway.process({"data_source": "fault"})["status"] == "completed"


def test_killed_worker_job_is_retried_from_init_when_attempts_remain(gateway):
    job_id = gateway.submit({"data_source": "fault", "run_sleep_s": 120, "sleep_first_attempt_only": True},
                            max_attempts=2)
    gateway.wait_for_stage(job_id, "run")
    kill_run_worker_of(gateway, job_id)
    result = gateway.result(job_id, wait=60)
    assert (result["status"], result["attempt"], result["critical_error"]) == ("completed", 2, None)
    assert result["eval"] == {"ran": True}
    assert [a["outcome"] for a in result["attempts"]] == ["env_error", "ok"]
    assert "worker lost during run" in result["attempts"][0]["detail"]
    gateway.cluster.wait_for_workers()


def test_math_agent_runs_python_in_a_sandbox_closed_after_run(gateway, backend):
    result = gateway.process(math("PYTOOL: what is 6 times 7?", "42", tools=["python"], max_iterations=3))
    assert (result["status"], result["reward"]) == ("completed", 1.0), result["error"]
    tool_messages = [m for m in result["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 1 and tool_messages[0]["content"].strip() == "42"
    assert result["trajectory"]["num_turns"] == 2 and result["trajectory"]["tools"][0]["function"]["name"] == "python"
    state = redis.Redis.from_url(gateway.cluster.state_url, decode_responses=True)
    sandbox = json.loads(state.hget(keys.job(result["job_id"]), "sandbox"))
    assert state.hlen(keys.node_sandboxes(sandbox["node"])) == 0  # stopped right after RUN
    assert state.hlen(keys.node_addresses(sandbox["node"])) == 0
    assert not os.path.exists(sandbox["workspace"]) and not os.path.exists(sandbox["socket_path"])


def test_sigterm_hands_in_flight_stages_back_after_the_grace_period(gateway):
    job_id = gateway.submit({"data_source": "fault", "run_sleep_s": 120, "sleep_first_attempt_only": True},
                            max_attempts=2)
    gateway.wait_for_stage(job_id, "run")
    started = time.monotonic()
    kill_run_worker_of(gateway, job_id, signal.SIGTERM)  # grace 1 s in the test cluster
    assert time.monotonic() - started < 20  # it did not wait for the 120 s stage
    result = gateway.result(job_id, wait=60)
    assert (result["status"], result["attempt"]) == ("completed", 2)
    state = redis.Redis.from_url(gateway.cluster.state_url, decode_responses=True)
    assert state.hget(keys.job(job_id), "retry_reason") == "worker shut down during run"
    gateway.cluster.wait_for_workers()


def test_killed_run_worker_leaves_no_sandbox_running(gateway, backend):
    cluster = gateway.cluster
    job_id = gateway.submit(math("SLOW question with tools", "1", tools=["python"]), max_attempts=1)
    eventually(lambda: len(backend.log()) == 1, 30, "RUN reached its backend, sandbox up")
    state = redis.Redis.from_url(cluster.state_url, decode_responses=True)
    sandbox = json.loads(state.hget(keys.job(job_id), "sandbox"))
    assert state.hlen(keys.node_sandboxes(sandbox["node"])) == 1
    kill_run_worker_of(gateway, job_id)
    result = gateway.result(job_id, wait=30)
    assert (result["status"], result["critical_error"]) == ("failed", "run")
    # RUN had adopted the sandbox; its owner is dead, so a worker of the node reaps it
    eventually(lambda: state.hlen(keys.node_sandboxes(sandbox["node"])) == 0, 30, "sandbox reaped")
    assert state.hlen(keys.node_addresses(sandbox["node"])) == 0
    assert not os.path.exists(sandbox["socket_path"])
    assert os.path.basename(sandbox["workspace"]).startswith(job_id + ".")
    eventually(lambda: not os.path.exists(sandbox["workspace"]), 10, "the reaped sandbox's workspace removed")
    cluster.wait_for_workers()


def test_a_conversation_stops_at_the_backends_own_context_length(gateway, qwen3_tokenizer, tmp_path):
    """The server holds 700 tokens (PRORL_MAX_MODEL_LEN is larger): the session learns that from
    /v1/models, caps max_tokens to what is left and the agent stops for context, instead of the
    server refusing an oversized request and the job failing."""
    server = start_llm_server(qwen3_tokenizer, tmp_path, "short-context", rules=rules_file([]), max_model_len=700)
    try:
        assert gateway.post("/add_llm_server", json={"address": server.address()}).status_code == 200
        result = gateway.process(math("Random replies never box an answer: what is 1 + 1?", "2",
                                      max_iterations=30), sampling_params={"max_tokens": 150})
        assert result["status"] == "completed", result["error"]
        trajectory = result["trajectory"]
        assert len(trajectory["prompt_ids"]) + len(trajectory["response_ids"]) <= 700
        assert 2 <= trajectory["num_turns"] < 30  # ended by the context, not by max_iterations
        served = server.log()
        assert len(served) == trajectory["num_turns"]
        assert all(len(r["prompt_ids"]) + len(r["output_ids"]) <= 700 for r in served)
    finally:
        server.process.stop()
