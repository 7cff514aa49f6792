"""The pipeline's own overhead: no-op jobs through the service versus a raw Celery chain.

Both run in one process tree, on one redis-server, in the same run:

* **service**: ``POST /process`` with task ``noop`` (no LLM call) to the gunicorn gateway of a
  :class:`~prorl_celery.dev.local.LocalCluster`; the job goes through INIT, RUN and EVAL on the
  three Celery worker pools and the response comes back when it has ended (db 0 broker, db 1
  job state);
* **baseline**: ``celery.chain`` of three no-op tasks on three queues served by three worker
  processes of :mod:`bench.raw_chain` with the same pool sizes, waited on with ``.get()``
  through a Redis result backend (db 2 broker, db 3 results).

Phases: warm-up; sequential latency in small alternating batches (drift hits both equally);
Redis commands per job of each side; throughput with C client threads in alternating rounds.
Only the ratios mean anything on a shared, noisy machine.

    python -m bench.overhead [--jobs N] [--concurrency C] [--quick]

Prints a table and writes the same figures to ``bench/results/overhead.json``.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import redis
from tqdm import tqdm

from bench._cli import run_benchmark
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import (
    DEFAULT_CONCURRENCY,
    LocalCluster,
    ManagedProcess,
    free_port,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "overhead.json"
TARGET_LATENCY_RATIO = 1.2  # issue 17's
TARGET_JOBS_PER_S = 100.0
TARGET_CPU_RATIO = 1.0  # issue 17's: a job's CPU over every process, service / raw chain
NOOP_BODY = {"task": "noop", "instance": {}}
SERVICE_DB, STATE_DB, RAW_BROKER_DB, RAW_RESULT_DB = 0, 1, 2, 3


# -- configuration ---------------------------------------------------------------------------------

@dataclass
class Plan:
    latency_jobs: int  # sequential jobs per side
    batch: int  # alternate sides every this many jobs
    jobs: int  # throughput jobs per side (all rounds together)
    concurrency: int  # client threads in the throughput phase
    rounds: int  # throughput rounds per side, alternating which side goes first
    warmup: int  # sequential warm-up jobs per side (plus one concurrent burst)
    count_jobs: int  # jobs per side for the Redis command count
    pools: dict[Stage, int]
    gateway_workers: int
    progress: bool


def parse_args(argv: list[str] | None) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, help="throughput jobs per side (default 2000; --quick 300)")
    parser.add_argument("--concurrency", type=int, help="client threads for throughput (default 16; --quick 8)")
    parser.add_argument("--latency-jobs", type=int, help="sequential jobs per side (default 400; --quick 60)")
    parser.add_argument("--batch", type=int, default=10, help="alternate sides every N sequential jobs")
    parser.add_argument("--rounds", type=int, help="throughput rounds per side (default 4; --quick 2)")
    parser.add_argument("--pools", default=",".join(str(DEFAULT_CONCURRENCY[s]) for s in Stage),
                        help="threads per stage pool init,run,eval, both sides (default %(default)s)")
    parser.add_argument("--gateway-workers", type=int, default=2, help="gunicorn workers (default 2)")
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    quick = args.quick
    sizes = [int(part) for part in args.pools.split(",")]
    if len(sizes) != 3 or min(sizes) < 1:
        parser.error("--pools: three positive numbers, init,run,eval")
    plan = Plan(
        latency_jobs=args.latency_jobs or (60 if quick else 400),
        batch=max(1, args.batch),
        jobs=args.jobs or (300 if quick else 2000),
        concurrency=args.concurrency or (8 if quick else 16),
        rounds=args.rounds or (2 if quick else 4),
        warmup=10 if quick else 40,
        count_jobs=20 if quick else 50,
        pools=dict(zip(Stage, sizes)),
        gateway_workers=args.gateway_workers,
        progress=not args.no_progress,
    )
    if min(plan.latency_jobs, plan.jobs, plan.concurrency, plan.rounds) < 1:
        parser.error("--jobs, --concurrency, --latency-jobs and --rounds must be positive")
    return plan


# -- the two sides -------------------------------------------------------------------------------

class Side:
    """One way of running a job end to end; ``one(client)`` blocks until the job has ended."""

    name: str

    def client(self) -> Any:
        return None

    def close(self, client: Any) -> None:
        pass

    def one(self, client: Any) -> dict[str, Any] | None:
        raise NotImplementedError


class ServiceSide(Side):
    name = "service"

    def __init__(self, gateway_url: str) -> None:
        self.url = gateway_url

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0)

    def close(self, client: httpx.Client) -> None:
        client.close()

    def one(self, client: httpx.Client) -> dict[str, Any]:
        response = client.post("/process", json=NOOP_BODY)
        if response.status_code != 200:
            raise RuntimeError(f"/process answered {response.status_code}: {response.text[:300]}")
        body = response.json()
        if body.get("status") != "completed":
            raise RuntimeError(f"noop job ended {body.get('status')}: {body.get('error')}")
        return body


class BaselineSide(Side):
    name = "baseline"

    def __init__(self) -> None:
        from bench import raw_chain  # after RAW_CHAIN_* are set in the environment
        self.raw_chain = raw_chain

    def one(self, client: Any) -> None:
        payload = uuid.uuid4().hex
        if self.raw_chain.run_one(payload, timeout_s=60.0) != payload:
            raise RuntimeError("the raw chain returned something else than its payload")


# -- processes --------------------------------------------------------------------------------------

class Processes:
    """Every process the benchmark starts; ``stop()`` ends them all (newest first)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.own: list[ManagedProcess] = []
        self.cluster: LocalCluster | None = None

    def spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=ROOT, start_new_session=True)
        process = ManagedProcess(name, popen, log_path)
        self.own.append(process)
        return process

    def all(self) -> list[ManagedProcess]:
        return self.own + (self.cluster.processes if self.cluster else [])

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()  # gateway and service workers
            self.cluster = None
        for process in reversed(self.own):  # baseline workers, then redis-server
            process.stop(grace_s=5.0)
        self.own.clear()


def start_redis(processes: Processes) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: install it (apt-get install redis-server)")
    port = free_port()
    process = processes.spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                        "--appendonly", "no", "--maxclients", "10000"])
    url = f"redis://127.0.0.1:{port}"
    wait_until(lambda: redis.Redis.from_url(url).ping(), 20, "redis-server", process)
    return url


def start_baseline_workers(processes: Processes, pools: dict[Stage, int], env: dict[str, str]) -> None:
    for stage, count in pools.items():
        queue = f"raw_{stage.value}"
        processes.spawn(queue, [sys.executable, "-m", "celery", "-A", "bench.raw_chain", "worker",
                                "-Q", queue, "-P", "threads", "-c", str(count), "-n", f"{queue}-{os.getpid()}@%h",
                                "--without-gossip", "--without-mingle", "-l", "info"], env=env)


def cpu_seconds_by_group(processes: list[ManagedProcess]) -> dict[str, float]:
    """User + system CPU seconds of every live process in each child's process group."""
    groups = {p.popen.pid: p.name for p in processes}
    ticks = os.sysconf("SC_CLK_TCK")
    totals = {name: 0.0 for name in groups.values()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pgrp = int(fields[2])
        if pgrp in groups:
            totals[groups[pgrp]] += (int(fields[11]) + int(fields[12])) / ticks
    return totals


def component(name: str) -> str:
    """Group process names: gateway, service init/run/eval, raw_init/run/eval, redis."""
    if name in {"gateway", "redis"} or name.startswith("raw_"):
        return name
    stage = name.split("-")[0]
    return f"service_{stage}" if stage in {s.value for s in Stage} else name


# -- measurements -----------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary_ms(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": percentile(values, 0.5) * 1e3, "p95_ms": percentile(values, 0.95) * 1e3,
            "p99_ms": percentile(values, 0.99) * 1e3, "mean_ms": statistics.fmean(values) * 1e3 if values else 0.0,
            "min_ms": min(values) * 1e3 if values else 0.0}


def bar(plan: Plan, total: int, desc: str) -> tqdm:
    # disable=None: no bar when stderr is not a terminal (logs, CI)
    return tqdm(total=total, desc=desc, unit="job", disable=None if plan.progress else True, leave=False,
                dynamic_ncols=True)


def sequential(side: Side, count: int, on_job: Callable[[float, Any], None] | None = None,
               progress: tqdm | None = None) -> list[float]:
    client = side.client()
    latencies = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            body = side.one(client)
            elapsed = time.perf_counter() - start
            latencies.append(elapsed)
            if on_job:
                on_job(elapsed, body)
            if progress is not None:
                progress.update(1)
    finally:
        side.close(client)
    return latencies


def concurrent(side: Side, jobs: int, threads: int, progress: tqdm | None = None,
               at_start: Callable[[], None] = lambda: None) -> tuple[float, list[float]]:
    """Run ``jobs`` jobs from ``threads`` client threads; returns (wall seconds, job latencies).
    ``at_start`` is called once every thread has its client, right before the first job: a
    client is made once per trainer thread, not per job (an ``httpx.Client`` loads its CA bundle,
    about 22 ms of CPU, even for a plain-HTTP URL), so CPU per job is counted from there."""
    lock = threading.Lock()
    remaining = [jobs]
    latencies: list[float] = []
    errors: list[BaseException] = []
    ready = threading.Semaphore(0)
    go, stop = threading.Event(), threading.Event()

    def work() -> None:
        client = None
        try:
            client = side.client()
            ready.release()
            go.wait()
            while not stop.is_set():
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                start = time.perf_counter()
                side.one(client)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
                if progress is not None:
                    progress.update(1)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)
            stop.set()
            ready.release()
        finally:
            if client is not None:
                side.close(client)

    pool = [threading.Thread(target=work, name=f"{side.name}-client-{i}", daemon=True) for i in range(threads)]
    for thread in pool:
        thread.start()
    for _ in pool:
        ready.acquire()
    at_start()
    started = time.perf_counter()
    go.set()
    try:
        for thread in pool:
            while thread.is_alive():
                thread.join(0.2)
    finally:
        stop.set()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{side.name}: {len(errors)} client thread(s) failed") from errors[0]
    return wall, latencies


def redis_commands(client: redis.Redis, run: Callable[[], None], jobs: int) -> dict[str, Any]:
    """Redis commands per job while ``run`` executes (server-wide: both DBs of the side)."""
    client.config_resetstat()
    run()
    stats = client.info("commandstats")
    per_command = {name.removeprefix("cmdstat_"): value["calls"] / jobs for name, value in stats.items()}
    per_command.pop("info", None)
    per_command.pop("config|resetstat", None)
    per_command.pop("config", None)
    total = sum(per_command.values())
    top = dict(sorted(per_command.items(), key=lambda kv: -kv[1])[:12])
    return {"per_job": round(total, 1), "top": {k: round(v, 2) for k, v in top.items()}}


# -- the run ----------------------------------------------------------------------------------------

def run(plan: Plan) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="prorl-bench-"))
    processes = Processes(log_dir)
    result: dict[str, Any] = {
        "benchmark": "overhead", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "log_dir": str(log_dir),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_before": os.getloadavg(),
                    "versions": {pkg: _version(pkg) for pkg in ("celery", "kombu", "redis", "gunicorn", "flask")}},
        "plan": {**plan.__dict__, "pools": {s.value: n for s, n in plan.pools.items()}},
    }
    try:
        print(f"starting redis-server, the service and the baseline workers (logs in {log_dir})", flush=True)
        base = start_redis(processes)
        redis_admin = redis.Redis.from_url(base)
        raw_env = {"RAW_CHAIN_BROKER_URL": f"{base}/{RAW_BROKER_DB}",
                   "RAW_CHAIN_RESULT_BACKEND": f"{base}/{RAW_RESULT_DB}"}
        os.environ.update(raw_env)
        start_baseline_workers(processes, plan.pools, {**os.environ, **raw_env})
        cluster = LocalCluster(redis_url=base, llm_command=None, gateway_workers=plan.gateway_workers,
                               concurrency=dict(plan.pools), log_dir=log_dir / "service")
        processes.cluster = cluster
        cluster.start()
        service, baseline = ServiceSide(cluster.gateway_url), BaselineSide()
        sides = (service, baseline)
        raw_workers = [p for p in processes.own if p.name.startswith("raw_")]

        def baseline_up() -> bool:
            for process in raw_workers:
                if process.popen.poll() is not None:
                    raise SystemExit(f"{process.name} exited; log: {process.log_path}\n{process.tail()}")
            return baseline.raw_chain.run_one("ping", timeout_s=2.0) == "ping"
        wait_until(baseline_up, 90, "baseline workers")

        # 2. warm-up: every client path, every worker thread, every gateway worker
        with bar(plan, 2 * (plan.warmup + plan.concurrency * 4), "warm-up") as progress:
            for side in sides:
                sequential(side, plan.warmup, progress=progress)
                concurrent(side, plan.concurrency * 4, plan.concurrency, progress)

        late_before = baseline.raw_chain.late_wakeups()

        # 3. latency: sequential, alternating batches, the leading side alternating too
        latencies: dict[str, list[float]] = {s.name: [] for s in sides}
        breakdown: dict[str, list[float]] = {"gateway_ms": [], "queued_ms": [], "active_ms": [],
                                             "init_ms": [], "run_ms": [], "eval_ms": []}

        def record_service(elapsed: float, body: dict[str, Any]) -> None:
            timing = body["timing"]
            in_service = timing["active_s"] + timing["queued_s"]
            breakdown["gateway_ms"].append((elapsed - in_service) * 1e3)
            breakdown["queued_ms"].append(timing["queued_s"] * 1e3)
            breakdown["active_ms"].append(timing["active_s"] * 1e3)
            for stage in Stage:
                breakdown[f"{stage.value}_ms"].append(timing[f"{stage.value}_s"] * 1e3)

        with bar(plan, 2 * plan.latency_jobs, "latency") as progress:
            done, turn = 0, 0
            while done < plan.latency_jobs:
                count = min(plan.batch, plan.latency_jobs - done)
                for side in (sides if turn % 2 == 0 else sides[::-1]):
                    latencies[side.name] += sequential(side, count, record_service if side is service else None,
                                                       progress)
                done, turn = done + count, turn + 1
        lat = {name: summary_ms(values) for name, values in latencies.items()}
        result["latency"] = {
            **lat,
            "ratio_p50": lat["service"]["p50_ms"] / lat["baseline"]["p50_ms"],
            "ratio_p95": lat["service"]["p95_ms"] / lat["baseline"]["p95_ms"],
            "service_breakdown_median_ms": {k: statistics.median(v) for k, v in breakdown.items()},
        }

        # Redis commands per job (one side at a time; idle polling of the other side included)
        result["redis_commands"] = {
            side.name: redis_commands(redis_admin, lambda side=side: sequential(side, plan.count_jobs), plan.count_jobs)
            for side in sides}

        # 4. throughput: alternating rounds, CPU time of every process per job
        per_round = max(1, plan.jobs // plan.rounds)
        walls = {s.name: 0.0 for s in sides}
        counts = {s.name: 0 for s in sides}
        loaded: dict[str, list[float]] = {s.name: [] for s in sides}
        rounds: list[dict[str, Any]] = []
        cpu: dict[str, dict[str, float]] = {s.name: {} for s in sides}
        with bar(plan, 2 * per_round * plan.rounds, f"throughput x{plan.concurrency}") as progress:
            for number in range(plan.rounds):
                for side in (sides if number % 2 == 0 else sides[::-1]):
                    start: dict[str, Any] = {}
                    wall, values = concurrent(side, per_round, plan.concurrency, progress,
                                              at_start=partial(_cpu_snapshot, start, processes))
                    after, client_after = cpu_seconds_by_group(processes.all()), _own_cpu()
                    before, client_before = start["before"], start["client"]
                    walls[side.name] += wall
                    counts[side.name] += len(values)
                    loaded[side.name] += values
                    rounds.append({"round": number, "side": side.name, "jobs": len(values), "wall_s": wall,
                                   "jobs_per_s": len(values) / wall})
                    usage = cpu[side.name]
                    for name in after:
                        key = component(name)
                        usage[key] = usage.get(key, 0.0) + after[name] - before.get(name, 0.0)
                    usage["client"] = usage.get("client", 0.0) + client_after - client_before
        rate = {name: counts[name] / walls[name] for name in walls}
        by_round: dict[int, dict[str, float]] = {}
        for entry in rounds:
            by_round.setdefault(entry["round"], {})[entry["side"]] = entry["jobs_per_s"]
        result["throughput"] = {
            "concurrency": plan.concurrency,
            **{name: {"jobs": counts[name], "wall_s": walls[name], "jobs_per_s": rate[name],
                      "latency_under_load": summary_ms(loaded[name])} for name in walls},
            "ratio": rate["service"] / rate["baseline"],
            "ratio_median_of_rounds": statistics.median(
                by_round[n]["service"] / by_round[n]["baseline"] for n in by_round),
            "rounds": rounds,
            "cpu_ms_per_job": {name: {k: round(v * 1e3 / counts[name], 3) for k, v in sorted(usage.items())
                                      if v * 1e3 / counts[name] >= 0.005}
                               for name, usage in cpu.items()},
        }
        # every process's CPU in a side's rounds, that side's jobs' (the other side's idle pollers too)
        cpu_ratio = (sum(cpu["service"].values()) / counts["service"]) / \
            (sum(cpu["baseline"].values()) / counts["baseline"])
        result["targets"] = {
            "latency_ratio_p50": {"limit": TARGET_LATENCY_RATIO, "value": result["latency"]["ratio_p50"],
                                  "ok": result["latency"]["ratio_p50"] <= TARGET_LATENCY_RATIO},
            "latency_ratio_p95": {"limit": TARGET_LATENCY_RATIO, "value": result["latency"]["ratio_p95"],
                                  "ok": result["latency"]["ratio_p95"] <= TARGET_LATENCY_RATIO},
            "service_jobs_per_s": {"limit": TARGET_JOBS_PER_S, "value": rate["service"],
                                   "ok": rate["service"] >= TARGET_JOBS_PER_S},
            "cpu_ratio_per_job": {"limit": TARGET_CPU_RATIO, "value": cpu_ratio,
                                  "ok": cpu_ratio <= TARGET_CPU_RATIO},
        }
        result["baseline_late_wakeups"] = baseline.raw_chain.late_wakeups() - late_before
        result["machine"]["loadavg_after"] = os.getloadavg()
        return result
    finally:
        processes.stop()


def _cpu_snapshot(into: dict[str, Any], processes: Processes) -> None:
    """The CPU seconds so far of every process (``before``) and of this one (``client``)."""
    into.update(before=cpu_seconds_by_group(processes.all()), client=_own_cpu())


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- report -----------------------------------------------------------------------------------------

def report(result: dict[str, Any]) -> str:
    lat, thr, targets = result["latency"], result["throughput"], result["targets"]
    s, b = lat["service"], lat["baseline"]
    lines = [
        "",
        (f"pipeline overhead: noop job via POST /process vs raw Celery chain  "
         f"({result['machine']['cpus']} CPUs, load {result['machine']['loadavg_before'][0]:.2f} before, "
         f"pools init/run/eval {'/'.join(str(v) for v in result['plan']['pools'].values())}, "
         f"{result['plan']['gateway_workers']} gateway workers)"),
        "",
        f"{'sequential latency':<28}{'service':>12}{'baseline':>12}{'ratio':>10}",
        f"{'  p50 (ms)':<28}{s['p50_ms']:>12.2f}{b['p50_ms']:>12.2f}{lat['ratio_p50']:>10.2f}",
        f"{'  p95 (ms)':<28}{s['p95_ms']:>12.2f}{b['p95_ms']:>12.2f}{lat['ratio_p95']:>10.2f}",
        f"{'  p99 (ms)':<28}{s['p99_ms']:>12.2f}{b['p99_ms']:>12.2f}{s['p99_ms'] / b['p99_ms']:>10.2f}",
        f"{'  mean (ms)':<28}{s['mean_ms']:>12.2f}{b['mean_ms']:>12.2f}{s['mean_ms'] / b['mean_ms']:>10.2f}",
        f"{'  jobs':<28}{s['n']:>12}{b['n']:>12}",
        "",
        f"{'throughput (' + str(thr['concurrency']) + ' clients)':<28}{'service':>12}{'baseline':>12}{'ratio':>10}",
        (f"{'  jobs/s':<28}{thr['service']['jobs_per_s']:>12.1f}{thr['baseline']['jobs_per_s']:>12.1f}"
         f"{thr['ratio']:>10.2f}"),
        f"{'  ratio, median of rounds':<28}{'':>24}{thr['ratio_median_of_rounds']:>10.2f}",
        (f"{'  p50 under load (ms)':<28}{thr['service']['latency_under_load']['p50_ms']:>12.1f}"
         f"{thr['baseline']['latency_under_load']['p50_ms']:>12.1f}"),
        f"{'  jobs':<28}{thr['service']['jobs']:>12}{thr['baseline']['jobs']:>12}",
        "",
        "where a service job's sequential time goes (medians, ms): "
        + ", ".join(f"{k.removesuffix('_ms')} {v:.2f}" for k, v in lat["service_breakdown_median_ms"].items()),
        "redis commands per job: " + ", ".join(f"{name} {v['per_job']:.0f}" for name, v in
                                                result["redis_commands"].items()),
    ]
    for name, usage in thr["cpu_ms_per_job"].items():
        total = sum(usage.values())
        lines.append(f"CPU ms per job, {name} (total {total:.2f}): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in sorted(usage.items(), key=lambda kv: -kv[1])))
    if result.get("baseline_late_wakeups"):
        lines.append(f"baseline: {result['baseline_late_wakeups']} .get() call(s) waited over 1 s and then found "
                     "the result already stored (a lost or late pub/sub wake-up; see bench/raw_chain.py)")
    lines += ["", "targets:"]
    for name, target in targets.items():
        op = ">=" if name == "service_jobs_per_s" else "<="
        lines.append(f"  {name:<22}{target['value']:>10.2f}  {op} {target['limit']:<6}  "
                     f"{'OK' if target['ok'] else 'MISSED'}")
    lines.append(f"\nJSON: {RESULTS}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(argv)

    return run_benchmark(lambda: run(plan), report, RESULTS, lambda r: all(t["ok"] for t in r["targets"].values()))


if __name__ == "__main__":
    sys.exit(main())
