"""Batched script calls (``store.run_script_many``) on a redis-server of this module's own: one
round trip for many jobs, with no ``SCRIPT EXISTS`` before it, and NOSCRIPT after a flushed
script cache answered by loading the script and sending those calls again."""
from __future__ import annotations

import redis

from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.state.store import JobStore, Move
from tests.support.services import flushed_client, own_redis_fixture

own_redis = own_redis_fixture("redis-script-pipelines")


def calls_by_command(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): info["calls"] for name, info in stats.items()}


def test_many_jobs_move_in_one_pipeline_without_asking_whether_the_script_exists(own_redis):
    with flushed_client(own_redis) as client:
        store = JobStore(client, result_ttl_s=60)
        store.create("warm-up", {"task": "noop", "instance": {}, "budget_s": 10})  # both scripts loaded
        store.claim_stage("warm-up", Stage.INIT)
        client.config_resetstat()
        jobs = [(f"j{i}", {"task": "noop", "instance": {}, "budget_s": 10}) for i in range(3)]
        assert store.create_many(jobs) == [(True, JobStatus.PENDING_INIT)] * 3
        claims = store.claim_stages([job_id for job_id, _ in jobs], Stage.INIT)
        assert all(claim.ok and claim.record is not None for claim in claims)
        calls = calls_by_command(client)
        assert calls["evalsha"] == 6 and "script|exists" not in calls and "script|load" not in calls, calls


def test_a_flushed_script_cache_is_loaded_again_and_only_the_refused_calls_are_resent(own_redis):
    with flushed_client(own_redis) as client:
        store = JobStore(client, result_ttl_s=60)
        jobs = [(f"j{i}", {"task": "noop", "instance": {}, "budget_s": 10}) for i in range(3)]
        store.create_many(jobs)
        client.script_flush()  # a Redis restarted without its scripts
        moves = [Move(job_id, Stage.INIT.active, "resume") for job_id, _ in jobs]
        assert all(t.ok for t in store.transition_many(moves))
        assert [store.status(job_id) for job_id, _ in jobs] == [JobStatus.INIT] * 3
        client.script_flush()
        assert store.create_many([("k1", jobs[0][1]), ("k2", jobs[0][1])]) == [(True, JobStatus.PENDING_INIT)] * 2
        # each moved once: a NOSCRIPT call never ran, so sending it again cannot move a job twice
        assert not any(t.ok for t in store.transition_many(moves))
