"""What the dashboard pages show, read from Redis with bounded queries.

Every read here is bounded by a constant, never by the number of jobs stored: the jobs list
walks the creation-time index (``prorl_celery.state.keys.RECENT_JOBS``) one page at a time from a
cursor, and the throughput chart samples the most recent jobs only.
"""
from __future__ import annotations

import math
import time
from typing import Any

from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.services import Services
from prorl_celery.state import keys
from prorl_celery.state.metrics import STAGE_BUCKETS, bucket_label, read_metrics
from prorl_celery.state.store import JobRecord, decode_record

from .status_views import service_status

#: rows of one jobs-list page (default and largest)
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
#: ids one jobs-list request examines at most: a filter that matches rarely returns a short
#: page and a cursor to go on, rather than scanning every job
SCAN_LIMIT = 2000
SCAN_CHUNK = 250
SERIES_MINUTES = 60
QUANTILES = (0.5, 0.9, 0.99)

#: fields of the store's JobRecord a jobs-list row shows (decoded by the store): only those, never
#: the trajectory (it can be megabytes); every scalar field would read twice as many (the rare
#: filter's scan took 1.5x as long)
ROW_FIELDS = ("id", "task", "status", "created_at", "ended_at", "reward", "backend", "generation",
              "init_s", "run_s", "eval_s", "active_s", "critical_error", "attempt")


# -- the dashboard ---------------------------------------------------------------------------------

def overview(services: Services, now: float | None = None) -> dict[str, Any]:
    """Everything ``/dashboard`` shows; ``status`` is exactly what ``GET /status`` returns."""
    now = time.time() if now is None else now
    status = service_status(services)
    nodes = sorted({w["node"] for w in status["workers"] if w.get("node")})
    pipe = services.redis.pipeline(transaction=False)
    for node in nodes:
        pipe.hlen(keys.node_sandboxes(node))
    sandboxes = dict(zip(nodes, pipe.execute()))
    counters, histograms = read_metrics(services.redis, [stage.value for stage in Stage])
    return {
        "status": status,
        "sandboxes": sandboxes,
        "counters": counters,
        "durations": {stage: stage_percentiles(h) for stage, h in histograms.items()},
        "series": minute_series(services, now),
        "now": now,
    }


def stage_percentiles(histogram: dict[str, float]) -> dict[str, Any]:
    """p50/p90/p99 and mean from a cumulative histogram, interpolated as Prometheus'
    ``histogram_quantile`` does; a quantile in the +Inf bucket is reported as its lower bound."""
    count = histogram.get(bucket_label(float("inf")), 0.0)
    out: dict[str, Any] = {"count": int(count),
                           "mean": round(histogram.get("sum", 0.0) / count, 6) if count else None}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = _quantile(q, histogram, count) if count else None
    return out


def _quantile(q: float, histogram: dict[str, float], count: float) -> float:
    rank = q * count
    lower, below = 0.0, 0.0
    for bound in STAGE_BUCKETS:
        cumulative = histogram.get(bucket_label(bound), below)
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            fraction = (rank - below) / inside if inside else 1.0
            return round(lower + (bound - lower) * fraction, 6)
        lower, below = bound, cumulative
    return lower


def minute_series(services: Services, now: float) -> dict[str, Any]:
    """Jobs ended and mean reward of the completed ones, per minute over the last hour (the
    current minute last), from the exact per-minute counters that ``transition.lua`` keeps."""
    current = int(now // 60) * 60
    starts = [current - 60 * (SERIES_MINUTES - 1 - i) for i in range(SERIES_MINUTES)]
    pipe = services.redis.pipeline(transaction=False)
    for start in starts:
        pipe.hgetall(keys.minute_stats(start))
    completed, not_completed, mean_reward = [], [], []
    ended = {s.value for s in JobStatus if s.terminal} - {JobStatus.COMPLETED.value}
    for counts in pipe.execute():
        done = int(counts.get(JobStatus.COMPLETED.value, 0))
        completed.append(done)
        not_completed.append(sum(int(counts.get(status, 0)) for status in ended))
        mean_reward.append(round(float(counts.get("reward_sum", 0.0)) / done, 6) if done else None)
    return {
        "minutes": starts,
        "start": starts[0],
        "completed": completed,
        "not_completed": not_completed,
        "mean_reward": mean_reward,
    }


# -- the jobs list ---------------------------------------------------------------------------------

def parse_cursor(text: str | None) -> tuple[float, str] | None:
    """``<created_at>:<job id>`` of the last row shown, or None for the first page."""
    if not text:
        return None
    score, sep, job_id = text.partition(":")
    try:
        value = float(score)
    except ValueError:
        raise ValueError("cursor: expected '<created_at>:<job id>' from a previous page") from None
    if not sep or not job_id or not math.isfinite(value):
        raise ValueError("cursor: expected '<created_at>:<job id>' from a previous page")
    return value, job_id


def job_page(services: Services, *, status: str | None = None, task: str | None = None,
             cursor: str | None = None, limit: int = PAGE_SIZE) -> dict[str, Any]:
    """Newest jobs first, at most ``limit`` rows, examining at most ``SCAN_LIMIT`` ids.

    ``next`` is the cursor of the following page (None at the end of the index); a rare
    filter may return fewer rows than ``limit`` with a ``next`` cursor to continue from.
    """
    if status and status not in {s.value for s in JobStatus}:
        raise ValueError(f"status: unknown status {status!r}; one of "
                         + ", ".join(s.value for s in JobStatus))
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit: must be between 1 and {MAX_PAGE_SIZE}")
    position = parse_cursor(cursor)
    client = services.redis
    rows: list[dict[str, Any]] = []
    scanned = 0
    exhausted = False
    while len(rows) < limit and scanned < SCAN_LIMIT:
        # unfiltered, every id makes a row: read no more than the page needs
        wanted = SCAN_CHUNK if (status or task) else limit - len(rows)
        chunk = _index_chunk(client, position, min(wanted, SCAN_LIMIT - scanned))
        if not chunk:
            exhausted = True
            break
        pipe = client.pipeline(transaction=False)
        for job_id, _ in chunk:
            pipe.hmget(keys.job(job_id), *ROW_FIELDS)
        for (job_id, score), values in zip(chunk, pipe.execute()):
            scanned += 1
            position = (score, job_id)
            raw = {name: value for name, value in zip(ROW_FIELDS, values) if value is not None}
            if "status" not in raw:  # the record expired; its id lingers in the index
                continue
            # filtered on the text as stored: only the rows shown are decoded
            if (status and raw["status"] != status) or (task and raw.get("task") != task):
                continue
            rows.append(_row(decode_record(raw)))
            if len(rows) == limit:
                break
    more = not exhausted and position is not None and bool(_index_chunk(client, position, 1))
    return {"jobs": rows, "next": f"{position[0]!r}:{position[1]}" if more and position else None,
            "scanned": scanned, "limit": limit, "status": status, "task": task}


def _index_chunk(client, position: tuple[float, str] | None, count: int) -> list[tuple[str, float]]:
    """Up to ``count`` (id, created_at) strictly older than ``position`` in the index order.

    Ids with equal scores come in reverse lexical order, so of the ties at the cursor's score
    only those sorting before the cursor's id are still to come."""
    if position is None:
        return client.zrevrangebyscore(keys.RECENT_JOBS, "+inf", "-inf", start=0, num=count, withscores=True)
    score, last_id = position
    ties = [(m, s) for m, s in client.zrevrangebyscore(keys.RECENT_JOBS, score, score, start=0, num=SCAN_LIMIT,
                                                       withscores=True) if m < last_id]
    older = client.zrevrangebyscore(keys.RECENT_JOBS, f"({score!r}", "-inf", start=0,
                                    num=max(0, count - len(ties)), withscores=True) if len(ties) < count else []
    return (ties + older)[:count]


def _row(record: JobRecord) -> dict[str, Any]:
    return {
        "job_id": record.id, "task": record.task, "status": record.status.value,
        "stage": record.status.stage.value if record.status.stage else None,
        "created_at": record.created_at, "ended_at": record.ended_at,
        "reward": record.reward, "backend": record.backend,
        "generation": record.generation,
        "timing": {"init_s": record.init_s, "run_s": record.run_s, "eval_s": record.eval_s},
        "active_s": record.active_s,
        "critical_error": record.critical_error,
        "attempt": record.attempt,
    }
