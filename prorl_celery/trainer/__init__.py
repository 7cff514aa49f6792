"""The trainer SDK: what a training loop imports, and nothing of the service.

It talks to the gateway over HTTP only (httpx), and imports ``prorl_celery.core`` alone of the
project: never Celery, Flask or Redis (``tests/integration/test_imports.py`` enforces both). Its public names
are here; the modules behind them are its own business:

    from prorl_celery.trainer import RolloutClient, DAPOCollector, CollectorConfig, reward_of

- ``RolloutClient`` / ``AsyncRolloutClient``: submit, wait, stream, cancel, register backends
  (``client``);
- ``RolloutOutcome``, ``reward_of``, ``is_trainable``: the one rule for a valid reward;
- ``DAPOCollector`` / ``AsyncDAPOCollector`` and ``CollectorConfig``: DAPO batches (``dapo``);
  ``ForkOf``, ``before_last_turn``: fork groups in them (``dapo_forks``);
- ``samples_of`` and ``Sample``: a rollout's training samples (main agent, sub-agents, rewrites,
  auxiliary calls), each token-exact with its reward (``samples``);
- ``VLLMWeightSync``: weight updates with rollouts in flight (``weights``);
- ``assign_backends``: LLM servers split across deployments (``assignment``);
- ``integrations.trl`` and ``integrations.verl``: the trainer adapters (optional extras).
"""
from prorl_celery.trainer.assignment import assign_backends
from prorl_celery.trainer.client import (
    AsyncRolloutClient,
    CancelOutcome,
    ClientError,
    GatewayError,
    GatewayUnavailable,
    JobRequest,
    RequestRejected,
    RetryPolicy,
    RewardInvalid,
    RolloutClient,
    RolloutOutcome,
    WaitTimeout,
    is_trainable,
    new_job_id,
    reward_of,
)
from prorl_celery.trainer.dapo import AsyncDAPOCollector, DAPOCollector
from prorl_celery.trainer.dapo_forks import before_last_turn, fork_point
from prorl_celery.trainer.dapo_types import (
    Batch,
    CollectorConfig,
    ForkOf,
    ForkPoint,
    Group,
    Rollout,
    RolloutsFailing,
    StepStats,
)
from prorl_celery.trainer.samples import Sample, samples_of
from prorl_celery.trainer.weights import VLLMWeightSync, WeightSyncError

__all__ = [
    "AsyncDAPOCollector", "AsyncRolloutClient", "Batch", "CancelOutcome", "ClientError", "CollectorConfig",
    "DAPOCollector", "ForkOf", "ForkPoint", "GatewayError", "GatewayUnavailable", "Group", "JobRequest",
    "RequestRejected", "RetryPolicy", "RewardInvalid", "Rollout", "RolloutClient", "RolloutOutcome", "RolloutsFailing",
    "Sample", "StepStats", "VLLMWeightSync", "WaitTimeout", "WeightSyncError", "assign_backends", "before_last_turn",
    "fork_point", "is_trainable", "new_job_id", "reward_of", "samples_of",
]
