"""Cluster-wide counters and stage-duration histograms, kept in Redis for ``/metrics``.

Workers buffer observations in memory and flush them every ``FLUSH_S`` from a background
thread, so a stage pays no Redis round trip for its metrics; every gateway process reads the
same totals on each scrape. A stage duration is stored in the one bucket it falls in
(``keys.stage_buckets``), and made cumulative, Prometheus style, when read: a flush writes one
field per bucket that saw stages, not every bucket at or above them (twelve for a short stage).
"""
from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import Counter, defaultdict

import redis

from prorl_celery.state import keys

log = logging.getLogger(__name__)
FLUSH_S = 2.0
#: upper bounds (s) of the stage-duration histogram buckets, Prometheus style (cumulative)
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, float("inf"))
COUNTERS = {
    "tokens_generated": "model tokens returned by LLM backends",
    "tokens_observed": "observation tokens appended to trajectories",
    "llm_requests": "generation requests sent to LLM backends",
    "lease_expiries": "stages ended because their worker was lost",
    "republished_messages": "INIT/EVAL messages published again because theirs was lost before its claim",
    "retries": "stage failures outside the policy retried (from INIT on a fresh sandbox, or EVAL alone)",
    "warm_pool_hits": "sandboxes INIT took ready from a warm pool",
    "warm_pool_misses": "sandboxes INIT started itself while a warm pool had none of that kind ready",
}


def bucket_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


_LABELS = tuple(bucket_label(bound) for bound in STAGE_BUCKETS)


class MetricsBuffer:
    """Per-process buffer of observations, flushed to Redis in the background."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._counters: Counter[str] = Counter()
        self._stages: dict[str, Counter[str]] = defaultdict(Counter)
        self._sums: defaultdict[str, float] = defaultdict(float)  # seconds (a Counter is typed for ints)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[name] += amount
        self._ensure_flushing()

    def observe_stage(self, stage: str, seconds: float) -> None:
        label = _LABELS[bisect_left(STAGE_BUCKETS, seconds)]  # the first bound >= seconds
        with self._lock:
            self._stages[stage][label] += 1
            self._sums[stage] += seconds
        self._ensure_flushing()

    def flush(self) -> None:
        with self._lock:
            counters, stages, sums = self._counters, self._stages, self._sums
            self._counters, self._stages, self._sums = Counter(), defaultdict(Counter), defaultdict(float)
        if not (counters or stages):
            return
        pipe = self.redis.pipeline(transaction=True)  # all of a flush lands, or none (then it is kept)
        for name, amount in counters.items():
            pipe.hincrby(keys.METRIC_COUNTERS, name, amount)
        for stage, buckets in stages.items():
            for label, amount in buckets.items():
                pipe.hincrby(keys.stage_buckets(stage), label, amount)
            pipe.hincrbyfloat(keys.stage_buckets(stage), "sum", sums[stage])
        try:
            pipe.execute()
        except Exception:
            self._restore(counters, stages, sums)  # Redis was away: count them in the next flush
            raise

    def _restore(self, counters: Counter[str], stages: dict[str, Counter[str]], sums: dict[str, float]) -> None:
        with self._lock:
            self._counters.update(counters)
            for stage, buckets in stages.items():
                self._stages[stage].update(buckets)
            for stage, seconds in sums.items():
                self._sums[stage] += seconds

    def _ensure_flushing(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="prorl-metrics", daemon=True)
                    self._thread.start()

    def close(self) -> None:
        """Stop the background thread."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_S):
            try:
                self.flush()
            except redis.RedisError as error:
                log.warning("metrics flush failed: %s", error)


def read_metrics(client: redis.Redis, stages: list[str]) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """(counters, histograms by stage); a histogram maps each bucket label to the stages at or
    below its bound (cumulative, from the first bucket that has any) and 'sum' to their seconds."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.METRIC_COUNTERS)
    for stage in stages:
        pipe.hgetall(keys.stage_histogram(stage))  # cumulative, written by older versions
        pipe.hgetall(keys.stage_buckets(stage))
    counters, *replies = pipe.execute()
    histograms = {stage: _cumulative(replies[2 * i], replies[2 * i + 1]) for i, stage in enumerate(stages)}
    return {name: int(counters.get(name, 0)) for name in COUNTERS}, histograms


def _cumulative(legacy: dict[str, str], buckets: dict[str, str]) -> dict[str, float]:
    """One cumulative histogram of an older version's (already cumulative) and ours (per bucket)."""
    histogram = {label: float(value) for label, value in legacy.items()}
    below = 0.0
    for label in _LABELS:
        below += float(buckets.get(label, 0))
        if below:
            histogram[label] = histogram.get(label, 0.0) + below
    if "sum" in buckets:
        histogram["sum"] = histogram.get("sum", 0.0) + float(buckets["sum"])
    return histogram
