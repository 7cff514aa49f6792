"""The final result of a job, as ``/process`` and ``GET /jobs/<id>`` return it."""
from __future__ import annotations

from typing import Any

from .status import JobStatus, Stage
from .store import JobStore
from .wire_v1 import v1_fields


def build_result(store: JobStore, record: dict[str, Any]) -> dict[str, Any]:
    """Shape a job record into the result: our fields and the ProRL Agent Server v1 ones
    (``wire_v1``), well-formed in every status."""
    instance = record.get("instance") or {}
    trajectory = record.get("trajectory")
    extra = record.get("extra") or {}
    status = JobStatus(record["status"])
    reward = float(record["reward"]) if record.get("reward") is not None else 0.0
    timing = store.timing(record, now=record.get("ended_at")).to_dict()
    result: dict[str, Any] = {
        "job_id": record["id"],
        "task": record.get("task"),
        "status": status.value,
        "stage": status.stage.value if status.stage else None,
        "reward": reward,
        "instance_id": instance.get("instance_id"),
        "trajectory_id": instance.get("trajectory_id"),
        "critical_error": record.get("critical_error") or None,
        "error": record.get("error"),
        "timing": timing,
        "backend": record.get("backend") or None,
        "generation": int(record["generation"]) if record.get("generation") else None,
        "attempt": int(record.get("attempt") or 1),
        "nodes": {stage.value: record.get(f"{stage.value}_node") or None for stage in Stage},
        "trajectory": trajectory,
        "eval": record.get("eval") or {},
        "artifacts": extra.pop("artifacts", {}),
        "ignored_sampling_params": record.get("ignored_params") or [],
        **v1_fields(status=status.value, reward=reward, trajectory=trajectory,
                    run_result=record.get("run_result") or {}, timing=timing),
    }
    result.update({k: v for k, v in extra.items() if k not in result})
    return result


def pending_result(store: JobStore, record: dict[str, Any]) -> dict[str, Any]:
    """What a caller sees while the job is still on its way."""
    status = JobStatus(record["status"])
    return {"job_id": record["id"], "status": status.value,
            "stage": status.stage.value if status.stage else None,
            "timing": store.timing(record).to_dict()}
