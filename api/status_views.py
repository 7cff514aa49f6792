"""Observability endpoints: ``/status``, ``/healthz``, ``/metrics``, ``/openapi.json``."""
from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from handlers import registered_tasks
from prorl_celery.core.status import Stage
from prorl_celery.services import Services
from prorl_celery.state import keys
from prorl_celery.state.metrics import COUNTERS, STAGE_BUCKETS, bucket_label, read_metrics
from prorl_celery.state.nodes import live_workers, node_states, warm_pools

from .extension import app_services
from .openapi import openapi_document

bp = Blueprint("status", __name__)
def service_status(services: Services) -> dict[str, Any]:
    counts = services.store.status_counts()
    broker = services.broker_redis
    depth = {stage: broker.llen(keys.broker_queue(stage.value)) for stage in Stage}
    workers = live_workers(services.redis, services.settings.heartbeat_s)
    started = services.store.service_started()
    return {
        "state": "started" if started else "stopped",
        "status": "running" if started else "stopped",  # v1's name for the state
        # v1: jobs accepted and not yet ended (queued or executing in any stage)
        "pending_jobs": sum(counts[stage.pending.value] + counts[stage.active.value] for stage in Stage),
        "stages": {stage.value: {"queued": counts[stage.pending.value], "active": counts[stage.active.value],
                                 "broker_depth": depth[stage]} for stage in Stage},
        "jobs": counts,
        # how the jobs that ended did (prorl_celery.core.outcomes): only ok and agent_error are rewards
        "outcomes": services.store.outcome_counts(),
        "generation": services.pool.generation(),
        # each with its health: healthy (routed to), since (when it entered that state), detail
        "backends": [b.__dict__ for b in services.pool.list()],
        "workers": workers,
        # the INIT workers' warm pools added up (each worker's own is in its entry)
        "warm_pool": warm_pools(workers),
        # by node: up, draining, drained or gone, with when each was last seen
        "nodes": node_states(services.redis, services.settings.heartbeat_s),
        "tasks": registered_tasks(),
    }


@bp.get("/status")
def status():
    return jsonify(service_status(app_services()))


@bp.get("/healthz")
def healthz():
    app_services().redis.ping()
    return jsonify({"ok": True})


class RedisStateCollector:
    """Reads the shared state on each scrape, so every gateway process reports the same."""

    def collect(self):
        state = service_status(app_services())
        queued = GaugeMetricFamily("prorl_stage_queued", "jobs waiting for a stage", labels=["stage"])
        active = GaugeMetricFamily("prorl_stage_active", "jobs executing a stage", labels=["stage"])
        for stage, numbers in state["stages"].items():
            queued.add_metric([stage], numbers["queued"])
            active.add_metric([stage], numbers["active"])
        jobs = GaugeMetricFamily("prorl_jobs", "jobs by status (terminal ones counted since start)",
                                 labels=["status"])
        for name, count in state["jobs"].items():
            jobs.add_metric([name], count)
        outcomes = CounterMetricFamily("prorl_job_outcomes", "jobs that ended, by outcome class "
                                       "(ok and agent_error carry a valid reward)", labels=["outcome"])
        for name, count in state["outcomes"].items():
            outcomes.add_metric([name], count)
        assigned = GaugeMetricFamily("prorl_backend_assignments", "jobs assigned per backend", labels=["address"])
        inflight = GaugeMetricFamily("prorl_backend_in_flight", "jobs in RUN per backend", labels=["address"])
        healthy = GaugeMetricFamily("prorl_backend_healthy", "1: the backend is routed to; 0: out of routing "
                                    "until a probe answers", labels=["address"])
        for backend in state["backends"]:
            assigned.add_metric([backend["address"]], backend["assigned"])
            inflight.add_metric([backend["address"]], backend["in_flight"])
            healthy.add_metric([backend["address"]], 1 if backend["healthy"] else 0)
        workers = GaugeMetricFamily("prorl_workers", "workers seen in the last 30 s")
        workers.add_metric([], len(state["workers"]))
        ready = GaugeMetricFamily("prorl_warm_pool_ready", "ready sandboxes in an INIT worker's warm pool",
                                  labels=["worker", "node"])
        refill = GaugeMetricFamily("prorl_warm_pool_refill_seconds", "median time an INIT worker's warm pool "
                                   "took to start and warm a sandbox (last 64)", labels=["worker", "node"])
        for worker in state["workers"]:
            pool = worker.get("warm_pool")
            if pool:
                ready.add_metric([worker["name"], worker["node"] or ""], pool["ready"])
                if pool.get("refill_s_p50") is not None:
                    refill.add_metric([worker["name"], worker["node"] or ""], pool["refill_s_p50"])
        yield from (queued, active, jobs, outcomes, assigned, inflight, healthy, workers, ready, refill)
        yield from cluster_metrics(app_services())


def cluster_metrics(services: Services):
    """Counters and stage-duration histograms the workers flush to Redis."""
    counters, histograms = read_metrics(services.redis, [stage.value for stage in Stage])
    for name, help_text in COUNTERS.items():
        family = CounterMetricFamily(f"prorl_{name}", help_text)
        family.add_metric([], counters[name])
        yield family
    durations = HistogramMetricFamily("prorl_stage_duration_seconds", "time a stage executed",
                                      labels=["stage"])
    for stage, histogram in histograms.items():
        buckets = [(bucket_label(b), histogram.get(bucket_label(b), 0.0)) for b in STAGE_BUCKETS]
        durations.add_metric([stage], buckets, histogram.get("sum", 0.0))
    yield durations


_registry = CollectorRegistry()
_registry.register(RedisStateCollector())


@bp.get("/metrics")
def metrics():
    return Response(generate_latest(_registry), mimetype=CONTENT_TYPE_LATEST)


@bp.get("/openapi.json")
def openapi():
    return jsonify(openapi_document())
