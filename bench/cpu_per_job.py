"""CPU per one-turn LLM job in every service process, beside a raw Celery chain, in one run.

Issue 29's measure: what one rollout costs the service's processes (the gateway, the INIT, RUN
and EVAL workers, Redis), summed. One redis-server holds both sides:

- **service**: a :class:`~prorl_celery.dev.local.LocalCluster` (gunicorn gateway, the three
  stage pools, a scripted LLM server whose single reply takes ``--delay`` s). A round is
  ``--jobs`` one-turn math jobs, each submitted by its own ``POST /jobs`` (as v1 trainers and the
  verl agent loop submit), all at once, then waited for through ``POST /jobs/wait`` streams.
- **raw chain**: :mod:`bench.raw_chain`'s three no-op tasks chained over three queues, waited
  on through a Redis result backend, ``--chain-clients`` threads at a time: the least three
  Celery hand-overs cost on this machine (no HTTP, no job record, no LLM call).

Rounds alternate sides. The CPU of each process group is read from ``/proc/<pid>/stat``
(utime + stime of every process in the group: gunicorn's workers, a worker's threads), Redis's
from ``INFO cpu``, this process's (the client) from ``os.times()``, each over its side's
rounds only. ``--profile DIR`` records every service process with py-spy during the service
rounds (collapsed stacks, one file per process; ``py-spy`` must be on the PATH).

    python -m bench.cpu_per_job                       # 4 rounds of 500 jobs per side, about a minute
    python -m bench.cpu_per_job --quick               # 2 rounds of 200
    python -m bench.cpu_per_job --profile /tmp/prof   # plus py-spy of every service process

Prints the table and writes ``bench/results/cpu_per_job.json``. Target (issue 29): at most 6 ms
per job summed over the service's processes (gateway, INIT, RUN, EVAL, Redis).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench._cli import machine_note, markdown_table, run_benchmark
from bench.burst import SAMPLING, LightHTTP, group_cpu_s, instance, job_ids, run_async, streamed
from bench.overhead import Processes, start_baseline_workers, start_redis
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess, wait_until

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "cpu_per_job.json"
TARGET_MS = 6.0
SERVICE = ("gateway", "init", "run", "eval", "redis")
CHAIN = ("raw_init", "raw_run", "raw_eval", "redis", "client")
RAW_BROKER_DB, RAW_RESULT_DB = 2, 3


@dataclass
class Plan:
    jobs: int
    rounds: int
    delay_s: float
    connections: int
    style: str
    chain_clients: int
    idle_s: float
    pools: dict[Stage, int]
    chain_pools: dict[Stage, int]
    gateway_workers: int
    profile: str | None
    tree: str | None = None


def parse_args(argv: list[str] | None) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_per_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, help="jobs per round and side (default 500; --quick 200)")
    parser.add_argument("--rounds", type=int, help="rounds per side, alternating (default 4; --quick 2)")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds of the LLM's reply (default %(default)s)")
    parser.add_argument("--connections", type=int, default=256,
                        help="POST /jobs requests in flight at once (default %(default)s)")
    parser.add_argument("--style", choices=("jobs", "process"), default="jobs",
                        help="jobs: one POST /jobs each, then POST /jobs/wait; process: one blocking POST /process "
                             "each, --connections at a time (default %(default)s)")
    parser.add_argument("--chain-clients", type=int, default=16, help="raw chain client threads (default %(default)s)")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds of idle CPU measured before the rounds (default %(default)s)")
    parser.add_argument("--pools", default="16,1000,16", help="service threads init,run,eval (default %(default)s)")
    parser.add_argument("--chain-pools", default="16,16,16",
                        help="raw chain threads init,run,eval (default %(default)s)")
    parser.add_argument("--gateway-workers", type=int, default=2)
    parser.add_argument("--profile", metavar="DIR", help="py-spy record every service process into DIR")
    parser.add_argument("--tree", help="run the service of this tree (a checkout, e.g. `git archive HEAD~1 | tar -x "
                        "-C /tmp/old`) instead of this one's: an older tree's figures beside this one's, run by run")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 200 jobs")
    args = parser.parse_args(argv)

    def pools(text: str) -> dict[Stage, int]:
        sizes = [int(part) for part in text.split(",")]
        if len(sizes) != 3 or min(sizes) < 1:
            parser.error("pools: three positive numbers, init,run,eval")
        return dict(zip(Stage, sizes))
    return Plan(jobs=args.jobs or (200 if args.quick else 500), rounds=args.rounds or (2 if args.quick else 4),
                delay_s=args.delay, connections=args.connections, style=args.style,
                chain_clients=args.chain_clients, idle_s=args.idle,
                pools=pools(args.pools), chain_pools=pools(args.chain_pools), gateway_workers=args.gateway_workers,
                profile=str(Path(args.profile).resolve()) if args.profile else None,
                tree=str(Path(args.tree).resolve()) if args.tree else None)


# -- CPU readings ----------------------------------------------------------------------------------

def redis_cpu_s(client: redis.Redis) -> float:
    """redis-server's own CPU (every thread), from INFO cpu."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def snapshot(groups: dict[str, ManagedProcess], admin: redis.Redis) -> dict[str, float]:
    reading = {name: group_cpu_s(process) for name, process in groups.items()}
    reading["redis"] = redis_cpu_s(admin)
    reading["client"] = own_cpu_s()
    return reading


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before}


# -- the two sides ---------------------------------------------------------------------------------

async def service_round(gateway_url: str, size: int, connections: int, tag: str) -> list[dict[str, Any]]:
    """``size`` jobs, one ``POST /jobs`` each (``connections`` at a time), then every result
    through one ``POST /jobs/wait`` stream."""
    http = LightHTTP(gateway_url, concurrency=connections)
    ids = job_ids(tag, size)

    async def submit(i: int) -> None:
        status, reply = await http.request("POST", "/jobs", {"instance": instance(tag, i), "job_id": ids[i],
                                                             "sampling_params": SAMPLING})
        if status != 202:
            raise RuntimeError(f"POST /jobs: {status} {reply}")
    await asyncio.gather(*(submit(i) for i in range(size)))
    return await streamed(LightHTTP(gateway_url), ids)


async def process_round(gateway_url: str, size: int, connections: int, tag: str) -> list[dict[str, Any]]:
    """``size`` blocking ``POST /process``, ``connections`` at a time (a trainer's threads)."""
    http = LightHTTP(gateway_url, concurrency=connections)
    ids = job_ids(tag, size)

    async def one(i: int) -> dict[str, Any]:
        status, reply = await http.request("POST", "/process", {"instance": instance(tag, i), "job_id": ids[i],
                                                                "sampling_params": SAMPLING})
        if status != 200:
            raise RuntimeError(f"POST /process: {status} {reply}")
        return reply
    return list(await asyncio.gather(*(one(i) for i in range(size))))


def chain_round(raw_chain: Any, size: int, threads: int) -> None:
    """``size`` raw chains from ``threads`` client threads, each waiting for its chain's end."""
    left = [size]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                payload = uuid.uuid4().hex
                if raw_chain.run_one(payload, timeout_s=60.0) != payload:
                    raise RuntimeError("the raw chain returned something else than its payload")
        except BaseException as error:  # noqa: BLE001 - raised below
            errors.append(error)
    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(f"raw chain: {len(errors)} client thread(s) failed") from errors[0]


def start_profilers(plan: Plan, groups: dict[str, ManagedProcess], round_: int) -> list[subprocess.Popen]:
    """py-spy on each service process (the gateway's workers through ``--subprocesses``): the GIL
    holder's stack only, so the samples follow where the Python CPU goes, 200 a second."""
    if not plan.profile:
        return []
    Path(plan.profile).mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["py-spy", "record", "--gil", "--nonblocking", "--subprocesses", "-r", "200",
                              "--format", "raw", "-o", str(Path(plan.profile) / f"{name}-r{round_}.txt"),
                              "-p", str(process.popen.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, process in groups.items() if name != "llm"]


def stop_profilers(profilers: list[subprocess.Popen]) -> None:
    for profiler in profilers:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for profiler in profilers:
        try:
            profiler.wait(60)
        except subprocess.TimeoutExpired:
            profiler.kill()
            profiler.wait()


# -- the run ---------------------------------------------------------------------------------------

def rules(directory: Path, delay_s: float) -> Path:
    path = directory / "cpu-rules.json"
    path.write_text(json.dumps([{"match": "CPUJOB", "replies": ["The answer is \\boxed{2}."], "delay_s": delay_s,
                                 "scope": "prompt"}]))
    return path


def run(plan: Plan) -> dict[str, Any]:
    from prorl_celery.dev.devmodels import ensure_tokenizer

    log_dir = Path(tempfile.mkdtemp(prefix="prorl-cpu-per-job-"))
    result: dict[str, Any] = {
        "benchmark": "cpu_per_job", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "log_dir": str(log_dir),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_before": os.getloadavg()},
        "plan": {**plan.__dict__, "pools": {s.value: n for s, n in plan.pools.items()},
                 "chain_pools": {s.value: n for s, n in plan.chain_pools.items()}},
        "rounds": []}
    processes = Processes(log_dir)
    try:
        base = start_redis(processes)
        admin = redis.Redis.from_url(base)
        raw_env = {"RAW_CHAIN_BROKER_URL": f"{base}/{RAW_BROKER_DB}",
                   "RAW_CHAIN_RESULT_BACKEND": f"{base}/{RAW_RESULT_DB}"}
        os.environ.update(raw_env)
        start_baseline_workers(processes, plan.chain_pools, {**os.environ, **raw_env})
        tokenizer = str(ensure_tokenizer("qwen3"))
        llm = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules(log_dir, plan.delay_s)),
               "--tokenizer", tokenizer, "--port", "{port}", "--log-level", "warning"]
        tree = plan.tree or str(ROOT)
        env = {"PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])}
        cluster = LocalCluster(redis_url=base, llm_command=llm, tokenizer=tokenizer, concurrency=dict(plan.pools),
                               gateway_workers=plan.gateway_workers, log_dir=log_dir / "service", env=env)
        processes.cluster = cluster
        print(f"starting redis, the service of {tree} and the raw chain's workers (logs in {log_dir})",
              file=sys.stderr, flush=True)
        here = os.getcwd()
        os.chdir(tree)  # `python -m` puts the working directory first on sys.path: the tree's own
        try:
            cluster.start()
        finally:
            os.chdir(here)
        from bench import raw_chain  # after RAW_CHAIN_* are in the environment

        wait_until(lambda: raw_chain.run_one("ping", timeout_s=2.0) == "ping", 90, "raw chain workers")
        named = {p.name: p for p in processes.all()}
        workers = {s.value: next(p for n, p in named.items() if n.startswith(f"{s.value}-")) for s in Stage}
        service = {"gateway": named["gateway"], **workers, "llm": named["llm"]}
        chain = {name: named[name] for name in ("raw_init", "raw_run", "raw_eval")}
        everything = {**service, **chain}
        # warm-up: imports, connections, thread pools, the tokenizer's caches on both sides
        one_round = service_round if plan.style == "jobs" else process_round
        run_async(one_round(cluster.gateway_url, min(plan.jobs, 100), plan.connections, "CPUJOB warm"))
        chain_round(raw_chain, min(plan.jobs, 100), plan.chain_clients)
        # idle: what each process spends per second with no job at all (heartbeats, polling, the
        # reaper), which a round pays for its whole wall time
        before = snapshot(everything, admin)
        time.sleep(plan.idle_s)
        idle = spent(before, snapshot(everything, admin))
        result["idle_ms_per_s"] = {k: v * 1e3 / plan.idle_s for k, v in idle.items()}
        print("  idle, ms of CPU per second: " + ", ".join(f"{k} {v:.2f}" for k, v in result["idle_ms_per_s"].items()),
              file=sys.stderr, flush=True)
        for round_ in range(plan.rounds):
            for side in (("service", "chain") if round_ % 2 == 0 else ("chain", "service")):
                time.sleep(1.0)  # let the previous round's tail (EVAL, acks) settle
                profilers = start_profilers(plan, service, round_) if side == "service" else []
                before = snapshot(everything, admin)
                started = time.perf_counter()
                if side == "service":
                    results = run_async(one_round(cluster.gateway_url, plan.jobs, plan.connections,
                                                  f"CPUJOB r{round_}"))
                    bad = [r for r in results if r.get("status") != "completed"]
                    if bad:
                        raise RuntimeError(f"{len(bad)} jobs not completed, e.g. {bad[0]}")
                else:
                    chain_round(raw_chain, plan.jobs, plan.chain_clients)
                wall = time.perf_counter() - started
                usage = spent(before, snapshot(everything, admin))
                stop_profilers(profilers)
                per_job = {name: seconds * 1e3 / plan.jobs for name, seconds in usage.items()}
                result["rounds"].append({"round": round_, "side": side, "jobs": plan.jobs, "wall_s": wall,
                                         "cpu_ms_per_job": per_job})
                print(f"  round {round_} {side:<7} {plan.jobs} jobs in {wall:.1f} s: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in per_job.items() if v >= 0.005) + " ms/job",
                      file=sys.stderr, flush=True)
        result["summary"] = summarize(result["rounds"])
        result["loadavg_after"] = os.getloadavg()
        return result
    finally:
        processes.stop()


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side, CPU ms per job by process over all its rounds (the rounds' mean: equal sizes)."""
    by_side: dict[str, dict[str, float]] = {}
    for side in ("service", "chain"):
        mine = [r["cpu_ms_per_job"] for r in rounds if r["side"] == side]
        by_side[side] = {k: sum(r[k] for r in mine) / len(mine) for k in mine[0]}
    service = sum(by_side["service"][k] for k in SERVICE)
    chain = sum(by_side["chain"][k] for k in CHAIN)
    return {"per_process": by_side, "service_ms": service, "chain_ms": chain, "ratio": service / chain,
            "ok": service <= TARGET_MS}


def report(result: dict[str, Any]) -> str:
    summary = result["summary"]
    service, chain = summary["per_process"]["service"], summary["per_process"]["chain"]
    plan = result["plan"]
    lines = [f"CPU per one-turn job (LLM reply {plan['delay_s']:g} s; {plan['jobs']} jobs x {plan['rounds']} rounds a "
             f"side, " + ("one POST /jobs each" if plan["style"] == "jobs" else
                                  f"blocking POST /process, {plan['connections']} at a time")
             + "), beside the raw Celery chain; " + machine_note(result)
             + f", {result['loadavg_after'][0]:.1f} after", ""]
    lines += markdown_table(
        ["side", *SERVICE, "llm", "client", "summed (service: gateway..redis; chain: workers, redis, client)"],
        [["service", *(f"{service[k]:.2f}" for k in SERVICE), f"{service['llm']:.2f}", f"{service['client']:.2f}",
          f"**{summary['service_ms']:.2f} ms**"],
         ["raw chain", "", f"{chain['raw_init']:.2f}", f"{chain['raw_run']:.2f}", f"{chain['raw_eval']:.2f}",
          f"{chain['redis']:.2f}", "", f"{chain['client']:.2f}", f"**{summary['chain_ms']:.2f} ms**"]])
    lines += ["", f"service / raw chain: {summary['ratio']:.2f}x; target <= {TARGET_MS:g} ms per job summed over the "
              f"service's processes: {'OK' if summary['ok'] else 'MISSED'}"]
    idle = result["idle_ms_per_s"]
    lines.append("idle, ms of CPU per second (no job running): " + ", ".join(
        f"{k} {idle[k]:.2f}" for k in (*SERVICE, "raw_init", "raw_run", "raw_eval")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(argv)
    return run_benchmark(lambda: run(plan), report, RESULTS, lambda r: r["summary"]["ok"])


if __name__ == "__main__":
    sys.exit(main())
