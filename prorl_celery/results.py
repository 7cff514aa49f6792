"""The final result of a job, as ``/process`` and ``GET /jobs/<id>`` return it."""
from __future__ import annotations

from typing import Any

from .status import Stage
from .store import JobRecord, JobStore
from .wire_v1 import v1_fields


def build_result(store: JobStore, record: JobRecord) -> dict[str, Any]:
    """Shape a job record into the result: our fields and the ProRL Agent Server v1 ones
    (``wire_v1``), well-formed in every status."""
    status = record.status
    reward = record.reward if record.reward is not None else 0.0
    timing = store.timing(record, now=record.ended_at).to_dict()
    extra = dict(record.extra)  # a copy: artifacts move out of it
    result: dict[str, Any] = {
        "job_id": record.id,
        "task": record.task,
        "status": status.value,
        "stage": status.stage.value if status.stage else None,
        "reward": reward,
        "instance_id": record.instance.get("instance_id"),
        "trajectory_id": record.instance.get("trajectory_id"),
        "critical_error": record.critical_error,
        "error": record.error,
        "timing": timing,
        "backend": record.backend,
        "generation": record.generation,
        "attempt": record.attempt,
        "nodes": {stage.value: record.stage_node(stage) for stage in Stage},
        "trajectory": record.trajectory,
        "eval": record.eval,
        "artifacts": extra.pop("artifacts", {}),
        "ignored_sampling_params": record.ignored_params,
        **v1_fields(status=status.value, reward=reward, trajectory=record.trajectory,
                    run_result=record.run_result, timing=timing),
    }
    result.update({k: v for k, v in extra.items() if k not in result})
    return result


def pending_result(store: JobStore, record: JobRecord) -> dict[str, Any]:
    """What a caller sees while the job is still on its way."""
    status = record.status
    return {"job_id": record.id, "status": status.value,
            "stage": status.stage.value if status.stage else None,
            "timing": store.timing(record).to_dict()}
