"""Service configuration, read once from ``PRORL_*`` environment variables.

Every setting is documented in docs/configuration.md's table (tests/unit/test_docs.py keeps the two in step).
Code below the edge receives a ``Settings`` object (or plain values from it), never
``os.environ``. The one exception is gunicorn's ``PRORL_GATEWAY_*``, read in
``api/gunicorn_conf.py`` before any service module may be imported (see there).

The development settings at the end (fixture cache, llama.cpp sdist, vLLM venv) are read afresh
on each use (``dev_settings()``): tools and tests point them elsewhere within one process.
"""
from __future__ import annotations

import socket
from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRORL_", extra="ignore")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding all job state")
    broker_url: str | None = Field(None, description="Celery broker; defaults to redis_url")
    node: str = Field(default_factory=socket.gethostname, description="this node's name")
    redis_retry_s: float = Field(
        20.0, ge=0, description="a worker's Redis command that meets a connection error (Redis restarting, "
        "loading its AOF, failing over) is retried with backoff for this long before the stage counts it "
        "as a failure")
    redis_sentinel_master: str = Field(
        "prorl", min_length=1, description="with a sentinel:// URL (redis_url, broker_url): the name the "
        "sentinels monitor the primary under")
    redis_sentinel_password: str | None = Field(
        None, description="with a sentinel:// URL: the sentinels' own password (requirepass of "
        "redis-sentinel); the primary's goes in the URL as for redis://")
    redis_wait_replicas: int = Field(
        0, ge=0, description="the gateway answers 202 only once this many replicas hold the new jobs "
        "(Redis WAIT after the records and their INIT messages are written); 0: on the primary's word "
        "alone. A WAIT that times out answers 503 service_unavailable, and the jobs still run")
    redis_wait_timeout_ms: int = Field(
        2000, gt=0, description="longest the gateway's WAIT for redis_wait_replicas waits")
    gateway_redis_retry_s: float = Field(
        2.0, ge=0, description="the gateway's Redis retry (as redis_retry_s): a blink is ridden out, a "
        "longer outage answers 503 service_unavailable, which clients retry")

    job_timeout_s: float = Field(1800.0, gt=0, description="default active-time budget of a job")
    max_job_timeout_s: float = Field(4 * 3600.0, gt=0, description="largest budget a job may ask for")
    visibility_timeout_s: int = Field(
        60, gt=0, description="seconds after which the broker redelivers a message a worker fetched "
        "but never started (a killed worker's prefetched stages); a duplicate is a no-op"
    )
    result_ttl_s: int = Field(24 * 3600, gt=0, description="how long finished jobs stay fetchable")

    tokenizer: str | None = Field(None, description="default tokenizer directory (per job: sampling_params.tokenizer)")
    tokenizers_dir: str | None = Field(
        None, description="directory of tokenizer directories; sampling_params.custom_tokenizer names one")
    max_model_len: int = Field(32768, gt=0, description="context length prompt + generation must fit")
    default_max_tokens: int = Field(1024, gt=0, description="max_tokens when a job does not set one")
    llm_timeout_s: float = Field(600.0, gt=0, description="timeout of one LLM HTTP request")
    backend_wait_poll_s: float = Field(0.5, gt=0, description="poll period while no backend is registered")
    backend_probe_timeout_s: float = Field(
        2.0, gt=0, description="timeout of one backend health probe (connect, then each read): "
        "/add_llm_server's, and each re-probe of an unhealthy backend")
    backend_probe_interval_s: float = Field(
        10.0, gt=0, description="an unhealthy backend (out of routing) is probed again this often, by one "
        "RUN worker of the cluster on its reaper tick, and routed to again once it answers")

    handlers: str = Field("", description="extra handlers, 'name=module:Class,...' (beside entry points)")

    max_attempts: int = Field(3, ge=1, le=10, description="attempts of a job whose failure is outside the "
                              "policy (env_error, backend_error, eval_error, a lost worker); 1: no retry")
    eval_timeout_s: float = Field(900.0, gt=0, description="longest an evaluation may take; past it (or past the "
                                  "job's budget) the job ends eval_error, retried, never timeout")
    shutdown_grace_s: float = Field(20.0, ge=0, description="on SIGTERM, time in-flight stages get to finish")
    lease_s: float = Field(30.0, gt=0, description="a stage whose worker is silent this long is failed")
    reaper_interval_s: float = Field(5.0, gt=0, description="how often the lease reaper looks")
    heartbeat_s: float = Field(5.0, gt=0, description="worker heartbeat period; silent for 6 of them = dead")
    republish_after_s: float = Field(
        90.0, gt=0, description="a job in pending_init or pending_eval this long whose message is not in its "
        "queue (its worker died between fetch and claim, or its publisher before publishing) is published "
        "again by the reaper; above enqueue's 30 s of publish retries")

    run_slots: int | None = Field(
        None, ge=1, description="RUN stages one RUN worker process runs at once on its shared event loop; "
        "default: the worker's -c")

    stage_batch: int = Field(
        32, ge=1, description="most jobs one INIT/RUN/EVAL message carries, for jobs whose handler lists "
        "that stage in batched_stages (1: one message per job)")

    journal: bool = Field(True, description="journal every RUN turn in Redis (model ids and logprobs, tool actions, "
                          "observations), so a retried RUN resumes at the last journaled turn and a finished "
                          "job can be replayed or forked")
    journal_max_events: int = Field(
        20_000, ge=1, description="most events one job's journal holds (a turn is 2 or more); past it the "
        "rest of the rollout is not journaled")
    journal_max_bytes: int = Field(
        64 * 2**20, ge=1024, description="most bytes one job's journal holds; past it the rest of the rollout "
        "is not journaled")

    task_events: bool = Field(False, description="workers send Celery task events (Flower) from start")

    runtime: str = Field("auto", description="sandbox runtime: auto | bubblewrap | apptainer | process")
    sandbox_dir: str = Field("/tmp/prorl-sandboxes", description="sandbox state and job workspaces")
    warm_pool_size: int = Field(
        0, ge=0, description="ready sandboxes an INIT worker process keeps of each kind (request) its jobs "
        "ask for, tool server answering and tools started; 0: no warm pool")
    warm_pool_max_mb: float = Field(
        2048.0, gt=0, description="most resident memory (MB) an INIT worker's warm pool holds, summed over its "
        "ready sandboxes; it also never fills the node's last 2 sandboxes' worth of available memory")
    warm_pool_images: str = Field(
        "", description="kinds the warm pool fills from start, 'image[+tool...]' comma separated "
        "(dev+python: a math job with the python tool); others are kept once a job asks for them")

    api_token: str | None = Field(None, description="bearer token for the job endpoints (auth off when unset)")
    admin_token: str | None = Field(None, description="bearer token for /start, /stop and the LLM server endpoints")
    backend_allowlist: str = Field("", description="hosts or CIDRs /add_llm_server accepts, comma separated")

    max_request_bytes: int = Field(10 * 1024 * 1024, gt=0, description="largest accepted request body")
    process_wait_s: float | None = Field(None, description="longest /process wait; default job budget + 60 s")

    uvloop: bool = Field(True, description="stages run on uvloop's event loop (False: asyncio's own)")
    def handler_options(self) -> dict[str, str]:
        """The handlers' own configuration (``handlers.registry.configure``): handlers never read
        these settings themselves."""
        return {"swe_repos": self.swe_repos}

    swe_repos: str = Field("", description="os.pathsep-separated swe git bundle directories, before the shipped ones")

    # development and test tooling
    fixtures_dir: str | None = Field(None, description="fixture cache; default ~/.cache/prorl-celery/fixtures")
    llamacpp_sdist: str | None = Field(None, description="a local llama-cpp-python sdist (else it is downloaded)")
    vllm_python: str | None = Field(None, description="the python of a venv with vllm (else the default venvs)")

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.redis_url


def dev_settings() -> Settings:
    """The settings as the environment has them now (development tooling: see the module doc)."""
    return Settings()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
