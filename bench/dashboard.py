"""The dashboard's reads stay bounded as jobs pile up, side by side with a full scan, in one run.

A redis-server is started on a loopback port; ``--jobs`` job records (default 10,000; a tenth of
them completed, one in a thousand cancelled) are written through ``JobStore``. Then, alternating
in batches, on the same Redis:

* ``jobs_page``: ``dashboard_data.job_page`` (first page of 50, newest first) versus the
  baseline a naive listing would do: read every id of the index and every record's row fields,
  then take the newest 50;
* ``rare_filter``: ``job_page(status="cancelled")``, one request (at most ``SCAN_LIMIT`` ids),
  versus the full scan filtered the same way;
* ``overview``: the whole ``/dashboard`` JSON (``dashboard_data.overview``), reported with its
  p50 and its ratio to the full scan.

Target: the first jobs page is >= 10x faster than the full scan at 10,000 jobs.

    python -m bench.dashboard [--jobs N] [--rounds N]

Prints a table and writes ``bench/results/dashboard.json``; exit 0 when the target holds.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from api import dashboard_data
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.dev.local import free_port, redis_server_binary, wait_until
from prorl_celery.services import Services
from prorl_celery.state import keys

from ._cli import run_benchmark

RESULTS = Path(__file__).resolve().parent / "results" / "dashboard.json"
TARGET_PAGE_RATIO = 10.0


def full_scan(client: redis.Redis, status: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The baseline: every id, every record, filter and sort in Python."""
    ids = client.zrevrange(keys.RECENT_JOBS, 0, -1)
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), *dashboard_data.ROW_FIELDS)
    rows = [dict(zip(dashboard_data.ROW_FIELDS, values)) for values in pipe.execute()]
    return [r for r in rows if r["status"] and (status is None or r["status"] == status)][:limit]


def fill(services: Services, jobs: int) -> None:
    store = services.store
    for i in range(jobs):
        job_id = f"bench-{i:07d}"
        store.create(job_id, {"task": "math", "budget_s": 60, "attempt": 1})
        if i % 1000 == 7:
            store.cancel(job_id)
        elif i % 10 == 0:
            for stage in Stage:
                store.claim_stage(job_id, stage)
                if stage.next:
                    store.hand_over(job_id, stage)
            store.finish(job_id, JobStatus.COMPLETED, {"reward": float(i % 20 == 0)})


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(jobs: int, rounds: int) -> dict[str, Any]:
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server is needed (apt-get install redis-server)")
    port = free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"redis://127.0.0.1:{port}/1"
        wait_until(lambda: redis.Redis.from_url(url).ping(), 20, "redis-server")
        services = Services(Settings(redis_url=url))
        fill(services, jobs)
        client = services.redis
        sides = {
            "jobs_page": (lambda: dashboard_data.job_page(services), lambda: full_scan(client)),
            "rare_filter": (lambda: dashboard_data.job_page(services, status="cancelled"),
                            lambda: full_scan(client, "cancelled")),
            "overview": (lambda: dashboard_data.overview(services), lambda: full_scan(client)),
        }
        samples: dict[str, dict[str, list[float]]] = {name: {"dashboard": [], "full_scan": []} for name in sides}
        for _ in range(rounds):  # alternate, so that load drift hits both sides
            for name, (ours, baseline) in sides.items():
                samples[name]["dashboard"].append(timed(ours))
                samples[name]["full_scan"].append(timed(baseline))
        results = {}
        for name, sides_samples in samples.items():
            ours, base = (statistics.median(sides_samples[k]) for k in ("dashboard", "full_scan"))
            results[name] = {"dashboard_p50_ms": round(ours * 1000, 3), "full_scan_p50_ms": round(base * 1000, 3),
                             "ratio": round(base / ours, 2)}
        return {"jobs": jobs, "rounds": rounds, "results": results}
    finally:
        server.terminate()
        server.wait(10)


def report(result: dict[str, Any]) -> str:
    lines = [f"dashboard reads with {result['jobs']} jobs stored ({result['rounds']} rounds, p50)",
             f"{'read':<12} {'dashboard ms':>13} {'full scan ms':>13} {'ratio':>7}"]
    for name, r in result["results"].items():
        lines.append(f"{name:<12} {r['dashboard_p50_ms']:>13.2f} {r['full_scan_p50_ms']:>13.2f} "
                     f"{r['ratio']:>6.1f}x")
    ratio = result["results"]["jobs_page"]["ratio"]
    lines.append(f"target: first jobs page >= {TARGET_PAGE_RATIO:g}x faster than a full scan: "
                 + ("met" if ratio >= TARGET_PAGE_RATIO else f"MISSED ({ratio}x)"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    return run_benchmark(lambda: measure(args.jobs, args.rounds), report, RESULTS,
                         lambda r: r["results"]["jobs_page"]["ratio"] >= TARGET_PAGE_RATIO)


if __name__ == "__main__":
    sys.exit(main())
