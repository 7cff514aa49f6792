"""The final result of a job, as ``/process`` and ``GET /jobs/<id>`` return it."""
from __future__ import annotations

from typing import Any

from .status import JobStatus, Stage
from .store import JobStore


def build_result(store: JobStore, record: dict[str, Any]) -> dict[str, Any]:
    """Shape a job record into the ProRL Agent Server result (well-formed in every status)."""
    instance = record.get("instance") or {}
    trajectory = record.get("trajectory")
    extra = record.get("extra") or {}
    status = JobStatus(record["status"])
    result: dict[str, Any] = {
        "job_id": record["id"],
        "task": record.get("task"),
        "status": status.value,
        "stage": status.stage.value if status.stage else None,
        "reward": record.get("reward") if record.get("reward") is not None else 0.0,
        "instance_id": instance.get("instance_id"),
        "trajectory_id": instance.get("trajectory_id"),
        "critical_error": record.get("critical_error") or None,
        "error": record.get("error"),
        "timing": store.timing(record, now=record.get("ended_at")).to_dict(),
        "backend": record.get("backend") or None,
        "generation": int(record["generation"]) if record.get("generation") else None,
        "attempt": int(record.get("attempt") or 1),
        "nodes": {stage.value: record.get(f"{stage.value}_node") or None for stage in Stage},
        "trajectory": trajectory,
        "messages": (trajectory or {}).get("messages", []),
        "eval": record.get("eval") or {},
        "artifacts": extra.pop("artifacts", {}),
    }
    result.update({k: v for k, v in extra.items() if k not in result})
    return result


def pending_result(store: JobStore, record: dict[str, Any]) -> dict[str, Any]:
    """What a caller sees while the job is still on its way."""
    status = JobStatus(record["status"])
    return {"job_id": record["id"], "status": status.value,
            "stage": status.stage.value if status.stage else None,
            "timing": store.timing(record).to_dict()}
