"""``prorl tokens check`` for a job whose agent called the per-job OpenAI endpoint.

Such a job's ids are what the backend saw by construction; what can go wrong is the agent's
re-sent history not matching what was served (a rewrite, a template that is not
prefix-preserving). The endpoint then started a new segment and recorded a drift event; this
report lists them: 0 drift for a prefix-preserving agent, else where (call, message, token) and why.
"""
from __future__ import annotations

from typing import Any


def endpoint_record(document: dict[str, Any]) -> dict[str, Any] | None:
    """The endpoint summary of a result (or of a bare trajectory with segments), or None."""
    if isinstance(document.get("endpoint"), dict):
        return document["endpoint"]
    trajectory = document.get("trajectory", document)
    if isinstance(trajectory, dict) and "drift_events" in trajectory:
        return {"drift_events": trajectory["drift_events"], "segments": len(trajectory.get("segments") or [1])}
    return None


def describe(document: dict[str, Any]) -> tuple[bool, str]:
    """(no drift, the report) for a result whose agent used the per-job endpoint."""
    endpoint = endpoint_record(document) or {}
    trajectory = document.get("trajectory", document) or {}
    events = list(endpoint.get("drift_events") or trajectory.get("drift_events") or [])
    segments = trajectory.get("segments") or [trajectory]
    calls = endpoint.get("calls", trajectory.get("num_turns"))
    lines = []
    for index, segment in enumerate(segments):
        ids = len(segment.get("prompt_ids", [])) + len(segment.get("response_ids", []))
        model = sum(segment.get("response_mask", []))
        lines.append(f"  segment {index}: {ids} ids ({model} model tokens), exactly what the backend received")
    if not events:
        head = f"0 drift: {calls} calls in 1 segment; every served id was kept across turns"
        return True, "\n".join([head, *lines])
    drifted = sum(int(e.get("drifted_tokens", 0)) for e in events)
    head = f"drift: {len(events)} event(s), {drifted} served ids not reproduced, {len(segments)} segments"
    for event in events:
        where = f"message {event['message']}" if event.get("message") is not None else f"token {event.get('token')}"
        lines.append(f"  segment {event.get('segment')} started at call {event.get('call')}: {where}: "
                     f"{event.get('reason')} ({event.get('kept_tokens', '?')} ids kept, "
                     f"{event.get('drifted_tokens', '?')} drifted)")
    return False, "\n".join([head, *lines])
