"""The job store and the backend pool against a real redis-server: atomicity and accounting."""
from __future__ import annotations

import math
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from prorl_celery.core.errors import JobNotFound, ServiceStopped
from prorl_celery.core.status import ALLOWED_FROM, JobStatus, Stage, can_transition
from prorl_celery.llm.pool import BackendPool
from prorl_celery.state import keys
from prorl_celery.state.store import JobRecord, JobStore, outcome

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(redis_url):
    connection = redis.Redis.from_url(redis_url + "/5", decode_responses=True)
    connection.flushdb()
    yield connection
    connection.flushdb()


@pytest.fixture
def store(client) -> JobStore:
    return JobStore(client, result_ttl_s=60)


def new_job(store: JobStore, job_id: str = "j1", budget: float = 10.0) -> None:
    created, status = store.create(job_id, {"task": "noop", "instance": {}, "budget_s": budget})
    assert (created, status) == (True, JobStatus.PENDING_INIT)


def test_create_is_idempotent_and_refused_when_stopped(store):
    new_job(store)
    assert store.create("j1", {"task": "other"}) == (False, JobStatus.PENDING_INIT)
    assert store.load("j1").task == "noop"
    store.set_service_state(False)
    with pytest.raises(ServiceStopped):
        store.create("j2", {"task": "noop"})
    with pytest.raises(JobNotFound):
        store.load("j2")


def test_the_record_is_decoded_once_into_typed_fields(store):
    store.create("j1", {"task": "math", "instance": {"problem": "p"}, "budget_s": 10, "attempt": 1,
                        "max_attempts": 2, "ignored_params": ["top_k"]})
    claim = store.claim_stage("j1", Stage.INIT, {"init_node": "n1", "worker_pid": 42})
    record = claim.record
    assert isinstance(record, JobRecord) and record.status is JobStatus.INIT
    assert (record.id, record.task, record.instance) == ("j1", "math", {"problem": "p"})
    assert record.ignored_params == ["top_k"]
    assert (record.attempt, record.max_attempts, record.worker_pid, record.budget_s) == (1, 2, 42, 10.0)
    assert record.resumed_at is not None and record.resumed_at >= record.created_at > 0
    # absent fields read as their defaults; the stage's node by stage
    assert (record.trajectory, record.reward, record.init_result, record.extra) == (None, None, {}, {})
    assert record.stage_node(Stage.INIT) == "n1" and record.stage_node(Stage.RUN) is None
    # None is stored as "" (a hash holds text) and reads None again
    store.finish("j1", JobStatus.FAILED, outcome("init", "ValueError: bad", backend=None), attempt=1)
    record = store.load("j1")
    assert (record.critical_error, record.error, record.backend) == ("init", "ValueError: bad", None)
    assert store.redis.hget(keys.job("j1"), "backend") == "" and record.attempt == 1
    assert record.ended_at is not None and record.status.terminal


def test_json_fields_read_back_what_json_dumps_wrote_beyond_strict_json(store):
    """msgspec decodes the JSON fields; what it refuses (NaN, -Infinity, a lone surrogate, all
    of which the store's json.dumps writes) must still read back, not fail the record."""
    trajectory = {"response_logprobs": [-0.5, float("-inf")], "score": float("nan"), "text": "a\ud800b",
                  "nested": {"ids": [1, 2], "ok": True}}
    store.create("j1", {"task": "math", "instance": {"problem": "p"}})
    store.claim_stage("j1", Stage.INIT)
    assert store.finish("j1", JobStatus.FAILED, {"trajectory": trajectory}, attempt=1).ok
    read = store.load("j1").trajectory
    assert read["response_logprobs"] == [-0.5, float("-inf")] and math.isnan(read["score"])
    assert read["text"] == "a\ud800b" and read["nested"] == {"ids": [1, 2], "ok": True}
    store.create("j2", {"task": "math", "instance": {"problem": "q", "ids": [3]}})
    assert store.load("j2").instance == {"problem": "q", "ids": [3]}


def test_a_stage_is_claimed_once(store):
    new_job(store)
    with ThreadPoolExecutor(8) as pool:
        claims = list(pool.map(lambda _: store.claim_stage("j1", Stage.INIT), range(8)))
    assert sum(c.ok for c in claims) == 1
    assert {c.previous for c in claims if not c.ok} == {JobStatus.INIT}
    assert not store.claim_stage("j1", Stage.RUN).ok  # not handed over yet


def test_terminal_state_is_set_exactly_once(store):
    new_job(store)
    store.claim_stage("j1", Stage.INIT)
    outcomes = [JobStatus.CANCELLED, JobStatus.FAILED, JobStatus.TIMEOUT] * 4
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda s: store.finish("j1", s) if s != JobStatus.CANCELLED
                                else store.cancel("j1"), outcomes))
    assert sum(r.ok for r in results) == 1
    assert store.status_counts()[store.status("j1").value] == 1
    assert store.status_counts()["init"] == 0
    assert store.wait("j1", 0.1).terminal


def test_timer_counts_only_executing_stages(store):
    new_job(store, budget=10.0)
    time.sleep(0.3)  # queued: not counted
    claim = store.claim_stage("j1", Stage.INIT)
    assert claim.budget_left_s == pytest.approx(10.0, abs=0.01)
    time.sleep(0.2)
    store.hand_over("j1", Stage.INIT)
    time.sleep(0.3)  # queued again
    claim = store.claim_stage("j1", Stage.RUN)
    assert claim.budget_left_s == pytest.approx(9.8, abs=0.1)
    time.sleep(0.1)
    store.finish("j1", JobStatus.TIMEOUT)
    timing = store.timing(store.load("j1"))
    assert timing.init_s == pytest.approx(0.2, abs=0.1) and timing.run_s == pytest.approx(0.1, abs=0.1)
    assert timing.eval_s == 0 and timing.queued_s == pytest.approx(0.6, abs=0.15)
    assert timing.active_s == pytest.approx(timing.init_s + timing.run_s)


def test_finished_jobs_expire_after_the_result_ttl(client):
    store = JobStore(client, result_ttl_s=1)
    new_job(store)
    store.cancel("j1")
    assert 0 < client.ttl("prorl:job:j1") <= 1
    assert store.active_job_ids() == []


def test_wait_returns_when_the_job_ends(store):
    new_job(store)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(store.wait, "j1", 10)
        time.sleep(0.2)
        store.cancel("j1")
        started = time.monotonic()
        assert waiting.result() == JobStatus.CANCELLED
        assert time.monotonic() - started < 1


def test_transition_table_matches_the_pipeline():
    for stage in Stage:
        assert can_transition(stage.pending, stage.active)
        if stage.next:
            assert can_transition(stage.active, stage.next.pending)
    assert not any(can_transition(t, JobStatus.CANCELLED) for t in JobStatus if t.terminal)
    assert ALLOWED_FROM[JobStatus.COMPLETED] == {JobStatus.EVAL}


def test_pool_balances_concurrent_acquisitions(client):
    pool = BackendPool(client)
    for i in range(3):
        pool.add(f"http://b{i}:8000/v1")
    with ThreadPoolExecutor(8) as threads:
        picks = list(threads.map(lambda _: pool.acquire().address, range(300)))
    assert set(Counter(picks).values()) == {100}
    assert {b.in_flight for b in pool.list()} == {100}


def test_acquire_writes_the_assignment_to_the_job_only_on_its_attempt_in_run(client, store):
    pool = BackendPool(client)
    pool.add("http://a/v1", "sglang")
    new_job(store, "j1")
    for stage in (Stage.INIT, Stage.RUN):
        assert store.claim_stage("j1", stage).ok
        if stage is Stage.INIT:
            assert store.hand_over("j1", Stage.INIT).ok
    assert pool.acquire("j1", attempt=2).address == "http://a/v1"  # another attempt: counted, not written
    assert client.hget(keys.job("j1"), "backend") is None
    assert pool.acquire("j1", attempt=1).protocol == "sglang"
    assert client.hmget(keys.job("j1"), ["backend", "backend_protocol", "generation"]) == ["http://a/v1", "sglang", "0"]
    store.finish("j1", JobStatus.CANCELLED)
    client.hdel(keys.job("j1"), "backend")
    pool.acquire("j1", attempt=1)  # no longer in RUN
    assert client.hget(keys.job("j1"), "backend") is None
    assert [b.in_flight for b in pool.list()] == [3]


def test_new_backend_starts_at_the_lowest_count_and_clear_bumps_generation(client):
    pool = BackendPool(client)
    pool.add("http://a/v1")
    for _ in range(50):
        pool.acquire()
    pool.add("http://b/v1", "sglang")
    assert {b.address: b.assigned for b in pool.list()} == {"http://a/v1": 50, "http://b/v1": 50}
    generation = pool.clear()
    assert pool.acquire() is None and generation == pool.generation() == 1
    pool.add("http://c/v1")
    assert pool.acquire().generation == 1


def test_only_keys_module_spells_redis_keys():
    pattern = re.compile(r"""["']prorl:""")
    offenders = [str(p.relative_to(ROOT)) for folder in ("prorl_celery", "api", "handlers", "singularity")
                 for p in (ROOT / folder).rglob("*.py") if p.name != "keys.py" and pattern.search(p.read_text())]
    assert offenders == []


def test_a_given_up_attempt_cannot_move_the_retried_job(store):
    store.create("j1", {"task": "noop", "instance": {}, "budget_s": 10, "attempt": 1, "max_attempts": 2})
    store.claim_stage("j1", Stage.INIT)
    store.hand_over("j1", Stage.INIT, attempt=1)
    store.claim_stage("j1", Stage.RUN)
    # the reaper gives attempt 1 up and retries from INIT; attempt 2 reaches RUN again
    assert store.transition("j1", JobStatus.PENDING_INIT, timer="pause", only_from=JobStatus.RUN, attempt=1,
                            fields={"attempt": 2}).ok
    store.claim_stage("j1", Stage.INIT)
    assert store.hand_over("j1", Stage.INIT, attempt=2).ok
    store.claim_stage("j1", Stage.RUN)
    zombie = store.hand_over("j1", Stage.RUN, {"run_result": {"stale": True}}, attempt=1)
    assert not zombie.ok and store.load("j1").run_result == {}
    assert store.hand_over("j1", Stage.RUN, attempt=2).ok


def test_a_given_up_attempt_cannot_update_the_retried_jobs_fields(store):
    store.create("j1", {"task": "noop", "instance": {}, "budget_s": 10, "attempt": 1, "max_attempts": 2})
    store.claim_stage("j1", Stage.INIT)
    assert store.update("j1", {"sandbox": {"id": "sb-1"}}, status=JobStatus.INIT, attempt=1)
    assert store.transition("j1", JobStatus.PENDING_INIT, timer="pause", only_from=JobStatus.INIT, attempt=1,
                            fields={"attempt": 2, "sandbox": None}).ok
    store.claim_stage("j1", Stage.INIT)
    # attempt 1's INIT, still running somewhere, starts its sandbox late: it must not land
    assert not store.update("j1", {"sandbox": {"id": "sb-late"}}, status=JobStatus.INIT, attempt=1)
    assert store.load("j1").sandbox is None
    assert store.update("j1", {"sandbox": {"id": "sb-2"}}, status=JobStatus.INIT, attempt=2)
    assert not store.update("j1", {"backend": "b"}, status=JobStatus.RUN, attempt=2)  # not in RUN
    assert (store.load("j1").sandbox, store.load("j1").backend) == ({"id": "sb-2"}, None)


def test_metrics_kept_when_a_flush_cannot_reach_redis(redis_url):
    from prorl_celery.dev.local import free_port
    from prorl_celery.state.metrics import MetricsBuffer, read_metrics

    live = redis.Redis.from_url(redis_url, decode_responses=True)
    live.delete(keys.METRIC_COUNTERS, keys.stage_histogram("run"), keys.stage_buckets("run"))
    buffer = MetricsBuffer(redis.Redis(port=free_port(), socket_connect_timeout=0.5))  # nothing listens
    buffer.count("tokens_generated", 7)
    buffer.observe_stage("run", 0.2)
    with pytest.raises(redis.ConnectionError):
        buffer.flush()
    buffer.redis = live  # Redis is back
    buffer.count("tokens_generated", 3)
    buffer.flush()
    assert live.hget(keys.METRIC_COUNTERS, "tokens_generated") == "10"
    assert read_metrics(live, ["run"])[1]["run"]["sum"] == pytest.approx(0.2)


def test_stage_histograms_are_cumulative_when_read(redis_url):
    """A stage is stored in its one bucket (a flush writes only the buckets that saw stages) and
    read back cumulative, added to what an older version wrote cumulative already."""
    from prorl_celery.state.metrics import STAGE_BUCKETS, MetricsBuffer, bucket_label, read_metrics

    live = redis.Redis.from_url(redis_url, decode_responses=True)
    live.delete(keys.stage_histogram("init"), keys.stage_buckets("init"))
    buffer = MetricsBuffer(live)
    for seconds in (0.003, 0.01, 0.2, 0.2, 7.0, 4000.0):  # 0.01 is its bucket's bound: in it
        buffer.observe_stage("init", seconds)
    buffer.flush()
    # one field per bucket hit and the sum, not the 12 buckets of each duration's cumulative line
    assert live.hgetall(keys.stage_buckets("init")).keys() == {"0.01", "0.5", "10.0", "+Inf", "sum"}
    older = {bucket_label(b): "2" for b in STAGE_BUCKETS if b >= 5.0} | {"sum": "3.0"}  # two 1.5 s stages
    live.hset(keys.stage_histogram("init"), mapping=older)
    histogram = read_metrics(live, ["init"])[1]["init"]
    expected = {0.01: 2, 0.05: 2, 0.1: 2, 0.5: 4, 1.0: 4, 5.0: 6, 10.0: 7, 30.0: 7, 60.0: 7, 300.0: 7,
                1800.0: 7, float("inf"): 8}
    assert {label: histogram[label] for label in map(bucket_label, STAGE_BUCKETS)} == \
        {bucket_label(b): float(n) for b, n in expected.items()}
    assert histogram["sum"] == pytest.approx(3.0 + 0.003 + 0.01 + 0.4 + 7.0 + 4000.0)
