"""What the Sentinel deployment costs a submit: ``POST /jobs`` on one redis-server against a
Sentinel group (a primary, a replica, three sentinels), with and without the gateway's WAIT for
the replica (``PRORL_REDIS_WAIT_REPLICAS``), in one run on this machine.

Each mode gets a cluster of its own, started as ``prorl up`` starts it (``LocalCluster``: the
gateway's gunicorn and the three stock worker pools; ``--redis sentinel``'s group for the
Sentinel modes), with no LLM server: the jobs wait for a backend, so only submission is timed.
Per mode, in alternating rounds:

- **sequential**: one client, one ``POST /jobs`` of one job at a time: the latency a job pays;
- **concurrent**: 32 clients at once, one job per request: what the gateway's group commit (one
  WAIT for every submit it groups) makes of it;
- **batch**: one ``POST /jobs`` of 100 jobs (the trainer client's ``submit_many``).

    python -m bench.replication [--jobs 200] [--rounds 3]

Prints a table of each mode's figures and their ratio to one redis-server's, and writes
``bench/results/replication.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench._cli import machine_note, markdown_table, run_benchmark
from prorl_celery.dev.devmodels import ensure_tokenizer
from prorl_celery.dev.local import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "replication.json"
MODES = {"server": (False, "0"), "sentinel": (True, "0"), "sentinel+wait": (True, "1")}
CLIENTS = 32
BATCH = 100


def job(tag: str) -> dict[str, Any]:
    return {"job_id": f"{tag}-{uuid.uuid4().hex}", "sampling_params": {"max_tokens": 16},
            "instance": {"data_source": "math", "problem": "What is 2 + 3?", "answer": "5"}}


def sequential(url: str, jobs: int) -> float:
    """Mean latency (ms) of one-job submits, one at a time."""
    with httpx.Client(base_url=url, timeout=30) as client:
        started = time.perf_counter()
        for _ in range(jobs):
            client.post("/jobs", json=job("seq")).raise_for_status()
        return (time.perf_counter() - started) / jobs * 1000


def concurrent(url: str, jobs: int) -> float:
    """Jobs per second accepted from CLIENTS clients submitting one job per request."""
    async def main() -> float:
        async with httpx.AsyncClient(base_url=url, timeout=30,
                                     limits=httpx.Limits(max_connections=CLIENTS)) as client:
            async def one_client(count: int) -> None:
                for _ in range(count):
                    (await client.post("/jobs", json=job("con"))).raise_for_status()
            started = time.perf_counter()
            await asyncio.gather(*(one_client(jobs // CLIENTS) for _ in range(CLIENTS)))
            return (jobs // CLIENTS) * CLIENTS / (time.perf_counter() - started)
    return asyncio.run(main())


def batch(url: str) -> float:
    """Milliseconds to accept one POST /jobs of BATCH jobs."""
    started = time.perf_counter()
    httpx.post(url + "/jobs", json=[job("batch") for _ in range(BATCH)], timeout=60).raise_for_status()
    return (time.perf_counter() - started) * 1000


def run(jobs: int, rounds: int) -> dict[str, Any]:
    figures: dict[str, dict[str, list[float]]] = {mode: {"sequential_ms": [], "concurrent_per_s": [],
                                                         "batch_ms": []} for mode in MODES}
    tokenizer = str(ensure_tokenizer("qwen3"))
    clusters: dict[str, LocalCluster] = {}
    try:
        for mode, (sentinel, wait) in MODES.items():
            cluster = LocalCluster(redis_sentinel=sentinel, tokenizer=tokenizer,
                                   log_dir=Path(tempfile.mkdtemp(prefix=f"bench-replication-{mode}-")),
                                   env={"PRORL_REDIS_WAIT_REPLICAS": wait, "PRORL_NODE": f"bench-{mode}-{os.getpid()}"})
            cluster.start()
            clusters[mode] = cluster
            sequential(cluster.gateway_url, 20)  # warm: the gateway's imports, the pools' connections
        for _ in range(rounds):
            for mode, cluster in clusters.items():
                figures[mode]["sequential_ms"].append(sequential(cluster.gateway_url, jobs))
                figures[mode]["concurrent_per_s"].append(concurrent(cluster.gateway_url, jobs))
                figures[mode]["batch_ms"].append(batch(cluster.gateway_url))
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return {"jobs": jobs, "rounds": rounds, "figures": figures,
            "machine": {"cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())}}


def report(result: dict[str, Any]) -> str:
    base = {name: statistics.median(values) for name, values in result["figures"]["server"].items()}
    rows = []
    for mode, figures in result["figures"].items():
        median = {name: statistics.median(values) for name, values in figures.items()}
        ratio = {name: value / base[name] for name, value in median.items()}
        rows.append([mode, f"{median['sequential_ms']:.2f} ms ({ratio['sequential_ms']:.2f}x)",
                     f"{median['concurrent_per_s']:.0f}/s ({ratio['concurrent_per_s']:.2f}x)",
                     f"{median['batch_ms']:.1f} ms ({ratio['batch_ms']:.2f}x)"])
    return "\n".join([f"POST /jobs, medians of {result['rounds']} rounds ({machine_note(result)}); "
                      f"ratios to one redis-server's", "",
                      *markdown_table(["Redis", "one job, one at a time", f"{CLIENTS} clients",
                                       f"{BATCH} jobs in one request"], rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per sequential and concurrent measure")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    return run_benchmark(lambda: run(args.jobs, args.rounds), report, RESULTS, lambda result: True)


if __name__ == "__main__":
    raise SystemExit(main())
