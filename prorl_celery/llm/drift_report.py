"""``prorl tokens check`` for a job whose agent called the per-job OpenAI endpoint.

Such a job's ids are what the backend saw by construction; what can go wrong is the agent's
re-sent history not matching what was served (a rewrite, a template that is not
prefix-preserving). The endpoint then started a new sample (origin ``rewrite``) and recorded a drift event; this
report lists them: 0 drift for a prefix-preserving agent, else where (call, message, token) and why.
"""
from __future__ import annotations

from typing import Any


def samples_of(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The trajectory's own samples: ``samples``, else ``segments`` (a server from before
    samples), else the trajectory itself as its one sample."""
    return list(trajectory.get("samples") or trajectory.get("segments") or [trajectory])


def endpoint_record(document: dict[str, Any]) -> dict[str, Any] | None:
    """The endpoint summary of a result (or of a bare trajectory with samples), or None."""
    if isinstance(document.get("endpoint"), dict):
        return document["endpoint"]
    trajectory = document.get("trajectory", document)
    if isinstance(trajectory, dict) and "drift_events" in trajectory:
        return {"drift_events": trajectory["drift_events"], "segments": len(samples_of(trajectory))}
    return None


def describe(document: dict[str, Any]) -> tuple[bool, str]:
    """(no drift, the report) for a result whose agent used the per-job endpoint: one line per
    sample of the trajectory's own ``samples`` (issue 37: the head once said "1 segment" for a
    rollout of a main agent and its sub-agent), then one per drift event."""
    endpoint = endpoint_record(document) or {}
    trajectory = document.get("trajectory", document) or {}
    events = list(endpoint.get("drift_events") or trajectory.get("drift_events") or [])
    samples = samples_of(trajectory)
    calls = endpoint.get("calls", trajectory.get("num_turns"))
    lines = []
    for index, sample in enumerate(samples):
        ids = len(sample.get("prompt_ids", [])) + len(sample.get("response_ids", []))
        model = sum(sample.get("response_mask", []))
        origin = f" ({sample['origin']})" if sample.get("origin") else ""
        lines.append(f"  sample {sample.get('sample', index)}{origin}: {ids} ids ({model} model tokens), "
                     f"exactly what the backend received")
    count = f"{len(samples)} sample{'s' if len(samples) != 1 else ''}"
    if not events:
        head = f"0 drift: {calls} calls in {count}; every served id was kept across turns"
        return True, "\n".join([head, *lines])
    drifted = sum(int(e.get("drifted_tokens", 0)) for e in events)
    head = f"drift: {len(events)} event(s), {drifted} served ids not reproduced, {count}"
    for event in events:
        where = f"message {event['message']}" if event.get("message") is not None else f"token {event.get('token')}"
        lines.append(f"  sample {event.get('sample', event.get('segment'))} started at call {event.get('call')}: "
                     f"{where}: {event.get('reason')} ({event.get('kept_tokens', '?')} ids kept, "
                     f"{event.get('drifted_tokens', '?')} drifted)")
    return False, "\n".join([head, *lines])
