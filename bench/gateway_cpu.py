"""The gateway's CPU per blocking ``POST /process``, this tree's beside a baseline tree's, in one run.

    python -m bench.gateway_cpu --baseline /tmp/base-gw            # both gateways, one cluster
    python -m bench.gateway_cpu --baseline /tmp/base-gw --rounds 8 --jobs 200 --clients 1,8

One redis-server and one set of INIT/RUN/EVAL workers (this tree's) serve two gunicorn
gateways: this tree's and ``--baseline``'s (its own code on ``PYTHONPATH``, same settings,
same Redis, same broker). No-op jobs (``task: noop``) go to one gateway then the other in
alternating rounds of ``--jobs`` each, from ``--clients`` keep-alive httpx clients at once
(every value given is a phase). Each round reads the gateway's CPU (master and workers, every
thread, from ``/proc/<pid>/task/<tid>/schedstat``) before and after, and every call's latency.
Load from other processes hits both sides alike, round by round: the ratio (this tree /
baseline) is what the run says.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench._cli import markdown_table, run_benchmark
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "gateway_cpu.json"
NOOP_BODY = {"task": "noop", "instance": {}}


def group_cpu_s(pgid: int) -> float:
    """CPU seconds of every live thread of every process in process group ``pgid``, from
    ``schedstat`` (nanoseconds: a round of ~0.2 s of CPU is ~20 ticks of ``/proc/<pid>/stat``)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[2]) != pgid:
                continue
            for task in os.listdir(f"/proc/{entry}/task"):
                total += int(Path(f"/proc/{entry}/task/{task}/schedstat").read_text().split()[0])
        except OSError:
            continue
    return total / 1e9


def spawn_gateway(cluster: LocalCluster, tree: Path, workers: int, log_dir: Path) -> tuple[str, ManagedProcess]:
    """A gunicorn gateway running ``tree``'s code on the cluster's Redis and broker."""
    url = f"http://127.0.0.1:{free_port()}"
    env = {**cluster.service_env(), "PYTHONPATH": str(tree)}
    log_path = log_dir / f"gateway-{tree.name}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf",
                                  "-w", str(workers), "-b", url.removeprefix("http://"), "api:create_app()"],
                                 cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    process = ManagedProcess(f"gateway-{tree.name}", popen, log_path)
    wait_until(lambda: httpx.get(url + "/healthz").status_code == 200, 60, f"gateway of {tree}", process)
    return url, process


def run_jobs(url: str, jobs: int, clients: int, latencies: list[float] | None = None) -> float:
    """``jobs`` blocking /process calls from ``clients`` keep-alive clients; wall seconds (and
    each call's seconds appended to ``latencies``)."""
    lock, left, errors = threading.Lock(), [jobs], []

    def work() -> None:
        try:
            with httpx.Client(base_url=url, timeout=60.0) as client:
                while True:
                    with lock:
                        if left[0] <= 0:
                            return
                        left[0] -= 1
                    sent = time.perf_counter()
                    response = client.post("/process", json=NOOP_BODY)
                    if latencies is not None:
                        latencies.append(time.perf_counter() - sent)
                    if response.status_code != 200 or response.json().get("status") != "completed":
                        raise RuntimeError(f"/process answered {response.status_code}: {response.text[:200]}")
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
    threads = [threading.Thread(target=work, daemon=True) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed") from errors[0]
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="prorl-gateway-cpu-"))
    result: dict[str, Any] = {"benchmark": "gateway_cpu", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "log_dir": str(log_dir), "loadavg_before": os.getloadavg(),
                              "baseline": str(args.baseline), "plan": {k: str(v) for k, v in vars(args).items()}}
    pools = {Stage.INIT: 4, Stage.RUN: 16, Stage.EVAL: 4}
    with LocalCluster(llm_command=None, gateway_workers=args.workers, concurrency=pools,
                      log_dir=log_dir / "service") as cluster:
        gateway = next(p for p in cluster.processes if p.name == "gateway")
        base_url, base_process = spawn_gateway(cluster, args.baseline, args.workers, log_dir)
        try:
            sides = {"this": (cluster.gateway_url, gateway.popen.pid), "baseline": (base_url, base_process.popen.pid)}
            for url, _ in sides.values():  # warm-up: every worker, both paths
                run_jobs(url, 100, max(args.clients))
            phases = []
            for clients in args.clients:
                per_round: dict[str, list[float]] = {name: [] for name in sides}
                walls: dict[str, float] = dict.fromkeys(sides, 0.0)
                latencies: dict[str, list[float]] = {name: [] for name in sides}
                for number in range(args.rounds):
                    order = list(sides) if number % 2 == 0 else list(sides)[::-1]
                    for name in order:
                        url, pgid = sides[name]
                        before = group_cpu_s(pgid)
                        walls[name] += run_jobs(url, args.jobs, clients, latencies[name])
                        per_round[name].append((group_cpu_s(pgid) - before) * 1e3 / args.jobs)
                ratios = [a / b for a, b in zip(per_round["this"], per_round["baseline"]) if b > 0]
                phases.append({"clients": clients, "cpu_ms_per_job": per_round,
                               "median_ms": {n: statistics.median(v) for n, v in per_round.items()},
                               "jobs_per_s": {n: args.jobs * args.rounds / w for n, w in walls.items()},
                               "p50_latency_ms": {n: statistics.median(v) * 1e3 for n, v in latencies.items()},
                               "ratio_median_of_rounds": statistics.median(ratios),
                               "ratio_of_medians": statistics.median(per_round["this"])
                               / statistics.median(per_round["baseline"])})
            result["phases"] = phases
        finally:
            base_process.stop()
    result["loadavg_after"] = os.getloadavg()
    return result


def report(result: dict[str, Any]) -> str:
    rows = [[str(p["clients"]), f"{p['median_ms']['this']:.2f}", f"{p['median_ms']['baseline']:.2f}",
             f"{p['ratio_of_medians']:.2f}", f"{p['ratio_median_of_rounds']:.2f}",
             f"{p['jobs_per_s']['this']:.0f} / {p['jobs_per_s']['baseline']:.0f}",
             f"{p['p50_latency_ms']['this']:.2f} / {p['p50_latency_ms']['baseline']:.2f}"] for p in result["phases"]]
    load = result["loadavg_before"]
    lines = [f"gateway CPU per POST /process (noop), this tree vs {result['baseline']} "
             f"(load {load[0]:.2f} before, {result['loadavg_after'][0]:.2f} after)", ""]
    lines += markdown_table(["clients", "this ms/job", "baseline ms/job", "ratio of medians",
                             "median ratio of rounds", "jobs/s this / baseline", "p50 ms this / baseline"], rows)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a tree to compare with (git archive of main)")
    parser.add_argument("--jobs", type=int, default=150, help="jobs per round and side (default 150)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per side and phase (default 6)")
    parser.add_argument("--clients", default="1,8", help="client counts, one phase each (default 1,8)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per gateway (default 2)")
    args = parser.parse_args(argv)
    args.clients = [int(part) for part in args.clients.split(",")]
    args.baseline = args.baseline.resolve()
    if not (args.baseline / "api" / "__init__.py").exists():
        parser.error(f"--baseline: {args.baseline} holds no api package")
    return run_benchmark(lambda: run(args), report, RESULTS, lambda result: True)


if __name__ == "__main__":
    sys.exit(main())
