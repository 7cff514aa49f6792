"""The node registry's words that other modules also spell."""
from prorl_celery.state.nodes import POOLED_JOB_PREFIX, _job_of
from prorl_celery.worker.warm_pool import POOL_PREFIX


def test_a_warm_pools_sandbox_is_told_apart_from_a_jobs():
    assert POOLED_JOB_PREFIX == POOL_PREFIX
    assert _job_of('{"job_id": "pool-1a2b", "worker": "w"}').startswith(POOLED_JOB_PREFIX)
    assert _job_of('{"job_id": "job-7"}') == "job-7" and _job_of("not json") == ""
