"""Scaling of the service, three comparisons measured side by side in one run:

1. **RUN scaling**: throughput of LLM-bound jobs against RUN worker processes 1, 2, 4, 8 (each
   ``-c 1``, so processes are what scales), the LLM server simulating a fixed latency per
   request (``prorl llm-serve --scripted`` with a rule ``delay_s``: an ``asyncio.sleep``, so the
   server is never the bottleneck). Reported: jobs/s per count and efficiency against linear
   (jobs/s at N / (N x jobs/s at 1)). Target >= 90 %.
2. **Pipeline vs one worker per job**: the same handler on a mixed workload (some jobs with a
   slow INIT, some with a slow EVAL, every RUN LLM-bound) through the three-stage pipeline and
   through :mod:`bench.monolith` (one Celery task doing INIT, RUN and EVAL in sequence), with the
   same number of worker processes and the same cap on heavy stages running at once (see
   ``bench/README.md``). Reported: jobs/s of each and the ratio. Target >= 1.5.
3. **Backend routing**: the pool's min-count sticky routing (the real ``acquire_backend.lua`` on
   Redis) against hash routing (job id hash mod N) for the same stream of jobs with skewed
   lengths on 4 backends, in a discrete-event simulation: max/min backend load (turns served,
   peak in-flight) and prefix reuse (share of a job's turns on the backend of its previous turn);
   then the same measured on the real service with 4 scripted backends, from their request logs.

    python -m bench.scale [--quick] [--counts 1,2,4,8] [--jobs-per-process 6] [--pipeline-jobs 60]

Prints a table and writes ``bench/results/scale.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from bench._cli import run_benchmark
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess, _with_db, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
TARGET_EFFICIENCY = 0.9
TARGET_PIPELINE_RATIO = 1.5
HANDLERS = "scalebench=bench.scale_handler:StagedHandler"
SAMPLING = {"max_tokens": 8, "temperature": 0.0}
MONO_BROKER_DB, MONO_STATE_DB, MONO_RESULT_DB, ROUTING_DB = 2, 3, 4, 5


@dataclass
class Plan:
    counts: list[int]  # RUN worker processes, part 1
    jobs_per_process: int  # measured jobs per RUN process, part 1
    turns: int  # LLM turns per job, parts 1 and 2
    llm_delay_s: float  # simulated latency of one LLM request, part 1
    pipeline_jobs: int  # jobs per side and round, part 2
    rounds: int  # alternating rounds, part 2
    slow_s: float  # a slow INIT or EVAL, part 2
    fast_s: float  # the other stages, part 2
    pipeline_delay_s: float  # LLM latency, part 2
    sim_jobs: int  # simulated jobs, part 3
    sim_streams: int  # job streams simulated (figures are means and worst cases over them)
    sim_concurrency: int  # jobs in RUN at once in the simulation
    backends: int
    routing_jobs: int  # real jobs on 4 scripted backends, part 3
    seed: int
    parts: list[int]


def parse_args(argv: list[str] | None) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,2,4,8", help="RUN worker processes to measure (default %(default)s)")
    parser.add_argument("--jobs-per-process", type=int, help="measured jobs per RUN process (default 8; --quick 4)")
    parser.add_argument("--turns", type=int, default=4, help="LLM turns per job (default %(default)s)")
    parser.add_argument("--llm-delay", type=float, default=0.25, help="LLM latency per request, part 1 (s)")
    parser.add_argument("--pipeline-jobs", type=int, help="jobs per side and round, part 2 (default 60; --quick 24)")
    parser.add_argument("--rounds", type=int, help="alternating rounds, part 2 (default 2; --quick 1)")
    parser.add_argument("--slow", type=float, default=0.6, help="a slow INIT or EVAL, part 2 (s)")
    parser.add_argument("--fast", type=float, default=0.05, help="a fast INIT or EVAL, part 2 (s)")
    parser.add_argument("--pipeline-delay", type=float, default=0.25,
                        help="LLM latency per request, part 2 (s; default: part 1's)")
    parser.add_argument("--sim-jobs", type=int, default=4000, help="simulated jobs, part 3")
    parser.add_argument("--sim-streams", type=int, default=10, help="simulated job streams (seeds), part 3")
    parser.add_argument("--sim-concurrency", type=int, default=32, help="jobs in RUN at once, part 3 simulation")
    parser.add_argument("--routing-jobs", type=int, help="real jobs on 4 backends, part 3 (default 32; --quick 16)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--parts", default="1,2,3", help="which comparisons to run (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of about 2 minutes")
    args = parser.parse_args(argv)
    counts = sorted({int(c) for c in args.counts.split(",")})
    if not counts or counts[0] < 1:
        parser.error("--counts: positive numbers")
    quick = args.quick
    return Plan(counts=counts, jobs_per_process=args.jobs_per_process or (4 if quick else 8), turns=args.turns,
                llm_delay_s=args.llm_delay, pipeline_jobs=args.pipeline_jobs or (24 if quick else 60),
                rounds=args.rounds or (1 if quick else 2), slow_s=args.slow, fast_s=args.fast,
                pipeline_delay_s=args.pipeline_delay, sim_jobs=args.sim_jobs, sim_streams=args.sim_streams,
                sim_concurrency=args.sim_concurrency, backends=4,
                routing_jobs=args.routing_jobs or (16 if quick else 32), seed=args.seed,
                parts=sorted({int(p) for p in args.parts.split(",")}))


# -- processes ----------------------------------------------------------------------------------------

def rules_file(directory: Path, delay_s: float) -> Path:
    """One scripted rule: every SCALE prompt gets "ok" after ``delay_s`` (asyncio.sleep)."""
    path = directory / f"rules-{delay_s:g}.json"
    path.write_text(json.dumps([{"match": "SCALE", "replies": ["ok"], "delay_s": delay_s, "scope": "prompt"}]))
    return path


def llm_command(rules: Path, tokenizer: str, port: str = "{port}") -> list[str]:
    return [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer", tokenizer,
            "--port", port, "--log-level", "warning"]


def spawn(cluster: LocalCluster, name: str, command: list[str], env: dict[str, str]) -> ManagedProcess:
    """A child the cluster stops with the rest (newest first)."""
    assert cluster.log_dir is not None
    log_path = cluster.log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 cwd=ROOT, start_new_session=True)
    process = ManagedProcess(name, popen, log_path)
    cluster.processes.append(process)
    return process


def stop_workers(cluster: LocalCluster, prefixes: tuple[str, ...]) -> None:
    for process in [p for p in cluster.processes if p.name.startswith(prefixes)]:
        process.stop()
        cluster.processes.remove(process)


def start_llm_server(cluster: LocalCluster, rules: Path, tokenizer: str, name: str) -> str:
    port = free_port()
    process = spawn(cluster, name, llm_command(rules, tokenizer, str(port)), os.environ.copy())
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200, 120, name, process)
    return f"http://127.0.0.1:{port}"


# -- running jobs -------------------------------------------------------------------------------------

def through_service(client: httpx.Client, instances: list[dict[str, Any]]) -> tuple[float, list[dict]]:
    """Submit every job at once (POST /jobs), then collect the results; (wall s, results)."""
    started = time.perf_counter()
    ids = []
    for instance in instances:
        response = client.post("/jobs", json={"task": "scalebench", "instance": instance,
                                              "sampling_params": SAMPLING})
        response.raise_for_status()
        ids.append(response.json()["job_id"])
    results = []
    for job_id in ids:
        response = client.get(f"/jobs/{job_id}", params={"wait": 300})
        if response.status_code != 200:
            raise RuntimeError(f"job {job_id} not finished: {response.text[:300]}")
        results.append(response.json())
    wall = time.perf_counter() - started
    failed = [r for r in results if r["status"] != "completed"]
    if failed:
        raise RuntimeError(f"{len(failed)} job(s) did not complete, e.g. {failed[0]['status']}: {failed[0]['error']}")
    return wall, results


def through_monolith(monolith: Any, instances: list[dict[str, Any]]) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    pending = [monolith.job.apply_async(args=[uuid.uuid4().hex, instance, SAMPLING]) for instance in instances]
    results = [p.get(timeout=300, disable_sync_subtasks=False) for p in pending]
    return time.perf_counter() - started, results


# -- part 1: RUN worker processes ---------------------------------------------------------------------

def run_scaling(cluster: LocalCluster, client: httpx.Client, plan: Plan) -> dict[str, Any]:
    """All RUN processes start at once (one start-up wait); a measurement with N of them has
    the others stop consuming ``run`` (Celery remote control), so exactly N take jobs."""
    from celery import Celery

    cluster.start_worker(Stage.INIT, 16, name="init-scale")
    cluster.start_worker(Stage.EVAL, 16, name="eval-scale")
    names = [cluster.start_worker(Stage.RUN, 1, name=f"run-scale{i}").name for i in range(max(plan.counts))]
    cluster.wait_for_workers()
    control = Celery("scale-control", broker=cluster.broker_url).control
    nodes = sorted({node for reply in control.ping(timeout=5.0) for node in reply},
                   key=lambda n: int(n.split("@")[0].removeprefix("run-scale")) if n.startswith("run-") else -1)
    run_nodes = [n for n in nodes if n.startswith("run-scale")]
    if len(run_nodes) != len(names):
        raise RuntimeError(f"expected {len(names)} RUN workers to answer a ping, got {run_nodes}")
    rows = []
    instance = {"turns": plan.turns, "init_s": 0, "eval_s": 0}
    consuming = set(run_nodes)
    for count in plan.counts:
        wanted = set(run_nodes[:count])
        if consuming - wanted:
            control.cancel_consumer(Stage.RUN.value, destination=sorted(consuming - wanted), reply=True)
        if wanted - consuming:
            control.add_consumer(Stage.RUN.value, destination=sorted(wanted - consuming), reply=True)
        consuming = wanted
        through_service(client, [dict(instance, tag=f"w{count}-{i}") for i in range(count)])  # warm-up
        jobs = count * plan.jobs_per_process
        wall, results = through_service(client, [dict(instance, tag=f"m{count}-{i}") for i in range(jobs)])
        run_s = statistics.median(r["timing"]["run_s"] for r in results)
        queued_s = statistics.median(r["timing"]["queued_s"] for r in results)
        rows.append({"processes": count, "jobs": jobs, "wall_s": wall, "jobs_per_s": jobs / wall,
                     "run_s_median": run_s, "queued_s_median": queued_s})
        print(f"  RUN x{count}: {jobs} jobs in {wall:.2f} s = {jobs / wall:.2f} jobs/s "
              f"(RUN stage median {run_s * 1e3:.0f} ms)", file=sys.stderr)
    base = rows[0]["jobs_per_s"] / rows[0]["processes"]
    for row in rows:
        row["efficiency"] = row["jobs_per_s"] / (row["processes"] * base)
    stop_workers(cluster, ("init-scale", "eval-scale", "run-scale"))
    return {"rows": rows, "ideal_run_s": plan.turns * plan.llm_delay_s, "llm_delay_s": plan.llm_delay_s,
            "turns": plan.turns}


# -- part 2: pipeline vs one worker per job -----------------------------------------------------------

#: the same four worker processes on both sides; heavy stages (INIT, EVAL) at most 4 at once on both
PIPELINE_LAYOUT = ((Stage.INIT, 1, 2), (Stage.RUN, 2, 8), (Stage.EVAL, 1, 2))
MONOLITH_PROCESSES, MONOLITH_THREADS = 4, 1


def mixed_workload(plan: Plan, rng: random.Random, tag: str) -> list[dict[str, Any]]:
    """40 % slow INIT, 40 % slow EVAL, 20 % both fast; every RUN LLM-bound."""
    jobs = []
    for i in range(plan.pipeline_jobs):
        kind = rng.choices(["slow_init", "slow_eval", "fast"], weights=[4, 4, 2])[0]
        jobs.append({"turns": plan.turns, "tag": f"{tag}-{i}",
                     "init_s": plan.slow_s if kind == "slow_init" else plan.fast_s,
                     "eval_s": plan.slow_s if kind == "slow_eval" else plan.fast_s})
    return jobs


def pipeline_vs_monolith(cluster: LocalCluster, client: httpx.Client, plan: Plan, base_url: str,
                         llm_url: str) -> dict[str, Any]:
    for stage, processes, threads in PIPELINE_LAYOUT:
        for i in range(processes):
            cluster.start_worker(stage, threads, name=f"{stage.value}-pipe{i}")
    # the baseline: its own broker, result backend and job-state databases on the same server
    env = {**cluster.service_env(), "PRORL_REDIS_URL": _with_db(base_url, MONO_STATE_DB),
           "PRORL_BROKER_URL": _with_db(base_url, MONO_BROKER_DB),
           "MONO_BROKER_URL": _with_db(base_url, MONO_BROKER_DB),
           "MONO_RESULT_BACKEND": _with_db(base_url, MONO_RESULT_DB)}
    os.environ.update({k: env[k] for k in ("MONO_BROKER_URL", "MONO_RESULT_BACKEND")})
    from bench import monolith  # after MONO_* are set
    from prorl_celery.llm.pool import BackendPool
    BackendPool(redis.Redis.from_url(env["PRORL_REDIS_URL"], decode_responses=True)).add(llm_url, "vllm")
    mono_workers = [spawn(cluster, f"mono{i}", [sys.executable, "-m", "celery", "-A", "bench.monolith", "worker",
                                                "-Q", monolith.QUEUE, "-P", "threads", "-c", str(MONOLITH_THREADS),
                                                "-n", f"mono{i}-{os.getpid()}@%h", "--without-gossip",
                                                "--without-mingle", "-l", "info"], env)
                    for i in range(MONOLITH_PROCESSES)]
    cluster.wait_for_workers()

    def monolith_up() -> bool:
        for process in mono_workers:
            if process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited; log: {process.log_path}\n{process.tail()}")
        return bool(monolith.app.control.ping(timeout=1.0)) and len(monolith.app.control.ping(timeout=1.0)) >= len(
            mono_workers)
    wait_until(monolith_up, 120, "baseline workers")

    rng = random.Random(plan.seed)
    warm = mixed_workload(Plan(**{**asdict(plan), "pipeline_jobs": 8}), rng, "warm")
    through_service(client, warm)
    through_monolith(monolith, warm)
    sides: dict[str, dict[str, float]] = {"pipeline": {"jobs": 0, "wall_s": 0.0},
                                          "monolith": {"jobs": 0, "wall_s": 0.0}}
    rounds = []
    timings: dict[str, list[float]] = defaultdict(list)
    for number in range(plan.rounds):
        workload = mixed_workload(plan, rng, f"r{number}")
        order = ("pipeline", "monolith") if number % 2 == 0 else ("monolith", "pipeline")
        for side in order:
            wall, results = (through_service(client, workload) if side == "pipeline"
                             else through_monolith(monolith, workload))
            if side == "pipeline":
                for key in ("queued_s", "init_s", "run_s", "eval_s"):
                    timings[key] += [r["timing"][key] for r in results]
            sides[side]["jobs"] += len(workload)
            sides[side]["wall_s"] += wall
            rounds.append({"round": number, "side": side, "jobs": len(workload), "wall_s": wall,
                           "jobs_per_s": len(workload) / wall})
            print(f"  {side}: {len(workload)} jobs in {wall:.2f} s = {len(workload) / wall:.2f} jobs/s",
                  file=sys.stderr)
    for numbers in sides.values():
        numbers["jobs_per_s"] = numbers["jobs"] / numbers["wall_s"]
    mean = lambda key: statistics.fmean(j[key] for j in workload)  # noqa: E731
    return {
        **sides, "ratio": sides["pipeline"]["jobs_per_s"] / sides["monolith"]["jobs_per_s"], "rounds": rounds,
        "layout": {"pipeline": [f"{s.value} {p}x-c{t}" for s, p, t in PIPELINE_LAYOUT],
                   "monolith": f"{MONOLITH_PROCESSES}x-c{MONOLITH_THREADS}"},
        "pipeline_timing_mean_s": {k: statistics.fmean(v) for k, v in timings.items()},
        "workload": {"mean_init_s": mean("init_s"), "mean_eval_s": mean("eval_s"), "turns": plan.turns,
                     "llm_delay_s": plan.pipeline_delay_s},
    }


# -- part 3: routing ------------------------------------------------------------------------------------

def skewed_turns(rng: random.Random) -> int:
    """80 % short jobs (1-4 turns), 20 % long ones (20-40 turns)."""
    return rng.randint(1, 4) if rng.random() < 0.8 else rng.randint(20, 40)


class Policy:
    name = ""
    sticky = True

    def pick(self, job_id: str, in_flight: dict[str, int]) -> str:
        raise NotImplementedError

    def done(self, address: str) -> None:
        pass


class MinCountPolicy(Policy):
    """The product's: ``BackendPool.acquire`` (acquire_backend.lua) once per job, kept for every turn."""

    name = "min-count sticky (the pool)"

    def __init__(self, client: redis.Redis, addresses: list[str]) -> None:
        from prorl_celery.llm.pool import BackendPool
        self.pool = BackendPool(client)
        self.pool.clear()
        for address in addresses:
            self.pool.add(address)

    def pick(self, job_id: str, in_flight: dict[str, int]) -> str:
        assignment = self.pool.acquire()
        assert assignment is not None
        return assignment.address

    def done(self, address: str) -> None:
        self.pool.release(address)


class HashPolicy(Policy):
    name = "hash(job id) mod N"

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    def pick(self, job_id: str, in_flight: dict[str, int]) -> str:
        digest = int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=8).digest(), "big")
        return self.addresses[digest % len(self.addresses)]


class StickyLeastInFlight(Policy):
    """Reference, not in the product: sticky, but picks the backend with the fewest jobs in RUN now
    (the pool keeps that count too) instead of the fewest assignments ever."""

    name = "sticky least in-flight (reference)"

    def pick(self, job_id: str, in_flight: dict[str, int]) -> str:
        return min(in_flight, key=lambda a: (in_flight[a], a))


class PerTurnRoundRobin(Policy):
    """Reference, not in the product: a plain load balancer, every request to the next backend."""

    name = "per-request round robin (not sticky)"
    sticky = False

    def __init__(self) -> None:
        self.counter = 0

    def pick(self, job_id: str, in_flight: dict[str, int]) -> str:
        self.counter += 1
        return sorted(in_flight)[self.counter % len(in_flight)]


def turn_time(index: int, turn: int) -> float:
    """0.5-1.5 time units, the same for a given job and turn under every policy."""
    digest = hashlib.blake2b(f"{index}/{turn}".encode(), digest_size=8).digest()
    return 0.5 + int.from_bytes(digest, "big") / 2**64


def simulate(policy: Policy, jobs: list[tuple[str, int]], addresses: list[str], concurrency: int) -> dict[str, Any]:
    """Closed loop: ``concurrency`` jobs in RUN at once; a turn holds its backend ``turn_time``."""
    in_flight = {a: 0 for a in addresses}
    served = {a: 0 for a in addresses}
    assigned_jobs = {a: 0 for a in addresses}
    peak = {a: 0 for a in addresses}
    area = {a: 0.0 for a in addresses}  # integral of in-flight over time
    last_t, clock = 0.0, 0.0
    same = changed = 0
    events: list[tuple[float, int, int, str]] = []  # (time, job index, turn number, backend)
    backend_of: dict[int, str] = {}  # a sticky policy's pick for the whole job
    last_backend: dict[int, str] = {}
    queue = iter(range(len(jobs)))

    def advance(now: float) -> None:
        nonlocal last_t
        for a in addresses:
            area[a] += in_flight[a] * (now - last_t)
        last_t = now

    def start_turn(index: int, turn: int, now: float) -> None:
        nonlocal same, changed
        job_id, _ = jobs[index]
        if turn == 0 and policy.sticky:
            backend_of[index] = policy.pick(job_id, in_flight)
        address = backend_of[index] if policy.sticky else policy.pick(job_id, in_flight)
        if turn == 0:
            assigned_jobs[address] += 1
        elif last_backend[index] == address:
            same += 1
        else:
            changed += 1
        last_backend[index] = address
        in_flight[address] += 1
        peak[address] = max(peak[address], in_flight[address])
        served[address] += 1
        heapq.heappush(events, (now + turn_time(index, turn), index, turn, address))

    for index in [next(queue, None) for _ in range(concurrency)]:
        if index is not None:
            start_turn(index, 0, 0.0)
    while events:
        clock, index, turn, address = heapq.heappop(events)
        advance(clock)
        in_flight[address] -= 1
        if turn + 1 < jobs[index][1]:
            start_turn(index, turn + 1, clock)
            continue
        if policy.sticky:
            policy.done(backend_of[index])
        following = next(queue, None)
        if following is not None:
            start_turn(following, 0, clock)
    mean_in_flight = {a: area[a] / clock for a in addresses}
    return {"policy": policy.name, "turns_served": served, "jobs": assigned_jobs, "peak_in_flight": peak,
            "mean_in_flight": mean_in_flight,
            "load_max_min": max(served.values()) / max(1, min(served.values())),
            "peak_max_min": max(peak.values()) / max(1, min(peak.values())),
            "prefix_reuse": same / max(1, same + changed), "makespan": clock}


def routing(cluster: LocalCluster, client: httpx.Client, plan: Plan, base_url: str, rules: Path,
            tokenizer: str, first_llm: str) -> dict[str, Any]:
    rng = random.Random(plan.seed)
    addresses = [f"http://backend-{i}:8000/v1" for i in range(plan.backends)]
    state = redis.Redis.from_url(_with_db(base_url, ROUTING_DB), decode_responses=True)
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    turns_mean = []
    for _ in range(plan.sim_streams):  # one job stream per seed, the same stream for every policy
        jobs = [(uuid.UUID(int=rng.getrandbits(128)).hex, skewed_turns(rng)) for _ in range(plan.sim_jobs)]
        turns_mean.append(statistics.fmean(t for _, t in jobs))
        for policy in (MinCountPolicy(state, addresses), HashPolicy(addresses), StickyLeastInFlight(),
                       PerTurnRoundRobin()):
            runs[policy.name].append(simulate(policy, jobs, addresses, plan.sim_concurrency))
    simulated = [{"policy": name, **{f"{key}_{how}": fn(r[key] for r in results)
                                     for key in ("load_max_min", "peak_max_min", "prefix_reuse")
                                     for how, fn in (("mean", statistics.fmean), ("worst", max))},
                  "example_turns_served": list(results[0]["turns_served"].values())}
                 for name, results in runs.items()]

    # the real service: 4 scripted backends, jobs with skewed turn counts, reuse read from their logs
    servers = [first_llm.removesuffix("/v1")] + [start_llm_server(cluster, rules, tokenizer, f"llm-route{i}")
                                                  for i in range(1, plan.backends)]
    client.post("/clear_llm_server").raise_for_status()
    for server in servers:
        httpx.post(server + "/_reset").raise_for_status()
        client.post("/add_llm_server", json={"address": server + "/v1", "type": "vllm"}).raise_for_status()
    real_jobs = [{"turns": min(skewed_turns(rng), 12), "tag": f"route{i}", "init_s": 0, "eval_s": 0}
                 for i in range(plan.routing_jobs)]
    through_service(client, real_jobs)
    from transformers import AutoTokenizer
    decode = AutoTokenizer.from_pretrained(tokenizer).decode
    turns_by_job: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for server in servers:
        for entry in httpx.get(server + "/_log").json():
            text = decode(entry["prompt_ids"])
            tag = text.split("SCALE ", 1)[1].split()[0] if "SCALE " in text else "?"
            turns_by_job[tag].append((entry["started"], server))
    same = changed = 0
    served: dict[str, int] = {s: 0 for s in servers}
    for visits in turns_by_job.values():
        visits.sort()
        for (_, previous), (_, current) in zip(visits, visits[1:]):
            same, changed = (same + 1, changed) if previous == current else (same, changed + 1)
        for _, server in visits:
            served[server] += 1
    expected_turns = sum(j["turns"] for j in real_jobs)
    measured = {"jobs": len(real_jobs), "turns_logged": sum(served.values()), "turns_expected": expected_turns,
                "jobs_seen": len(turns_by_job), "turns_per_backend": list(served.values()),
                "load_max_min": max(served.values()) / max(1, min(served.values())),
                "prefix_reuse": same / max(1, same + changed)}
    return {"simulation": {"jobs": plan.sim_jobs, "streams": plan.sim_streams, "concurrency": plan.sim_concurrency,
                           "backends": plan.backends, "turns_mean": statistics.fmean(turns_mean),
                           "policies": simulated},
            "service": measured}


# -- the run --------------------------------------------------------------------------------------------

def run(plan: Plan) -> dict[str, Any]:
    from prorl_celery.dev.devmodels import ensure_tokenizer

    tokenizer = str(ensure_tokenizer("qwen3"))
    log_dir = Path(tempfile.mkdtemp(prefix="prorl-bench-scale-"))
    env = {"PRORL_HANDLERS": HANDLERS, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_BACKEND_WAIT_POLL_S": "0.05"}
    part1_rules, part2_rules = rules_file(log_dir, plan.llm_delay_s), rules_file(log_dir, plan.pipeline_delay_s)
    cluster = LocalCluster(concurrency={}, llm_command=llm_command(part1_rules, tokenizer), tokenizer=tokenizer,
                           env=env, gateway_workers=2, log_dir=log_dir)
    from prorl_celery.celery_app import app as service_app
    result: dict[str, Any] = {"plan": asdict(plan), "log_dir": str(log_dir),
                              "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
                              # with Celery's threads pool a full worker only fetches again on the
                              # hub's next 1 s poll: every hand-over into a busy pool pays for it
                              "worker_disable_prefetch": bool(service_app.conf.worker_disable_prefetch)}
    with cluster, httpx.Client(base_url=cluster.gateway_url, timeout=600) as client:
        base_url = cluster.state_url
        assert cluster.llm_url is not None
        if 1 in plan.parts:
            print("part 1: RUN worker processes", file=sys.stderr)
            result["run_scaling"] = run_scaling(cluster, client, plan)
        # parts 2 and 3 on a server with their own latency: registered instead of the first
        pipeline_llm = start_llm_server(cluster, part2_rules, tokenizer, "llm-pipeline") + "/v1"
        client.post("/clear_llm_server").raise_for_status()
        client.post("/add_llm_server", json={"address": pipeline_llm, "type": "vllm"}).raise_for_status()
        if 2 in plan.parts:
            print("part 2: pipeline vs one worker per job", file=sys.stderr)
            result["pipeline"] = pipeline_vs_monolith(cluster, client, plan, base_url, pipeline_llm)
        if 3 in plan.parts:
            print("part 3: routing", file=sys.stderr)
            if not any(p.name.startswith("run") for p in cluster.processes):
                for stage, processes, threads in PIPELINE_LAYOUT:
                    for i in range(processes):
                        cluster.start_worker(stage, threads, name=f"{stage.value}-pipe{i}")
                cluster.wait_for_workers()
            result["routing"] = routing(cluster, client, plan, base_url, part2_rules, tokenizer, pipeline_llm)
    result["machine"]["loadavg_after"] = os.getloadavg()
    result["targets"] = {}
    if "run_scaling" in result:
        efficiency = result["run_scaling"]["rows"][-1]["efficiency"]
        result["targets"]["run_efficiency_at_max"] = {"limit": TARGET_EFFICIENCY, "value": efficiency,
                                                      "ok": efficiency >= TARGET_EFFICIENCY}
    if "pipeline" in result:
        ratio = result["pipeline"]["ratio"]
        result["targets"]["pipeline_ratio"] = {"limit": TARGET_PIPELINE_RATIO, "value": ratio,
                                               "ok": ratio >= TARGET_PIPELINE_RATIO}
    return result


def report(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = ["", f"bench.scale ({machine['cpus']} CPUs, load {machine['loadavg_before'][0]:.2f} before, "
                 f"{machine['loadavg_after'][0]:.2f} after, service workers with worker_disable_prefetch="
                 f"{result.get('worker_disable_prefetch')})"]
    if "run_scaling" in result:
        lines += report_scaling(result["run_scaling"])
    if "pipeline" in result:
        lines += report_pipeline(result["pipeline"])
    if "routing" in result:
        lines += report_routing(result["routing"])
    lines += ["", "targets:"]
    for name, target in result["targets"].items():
        lines.append(f"  {name:<24}{target['value']:>8.3f}  >= {target['limit']:<5} "
                     f"{'OK' if target['ok'] else 'MISSED'}")
    lines.append(f"\nJSON: {RESULTS}")
    return "\n".join(lines)


def report_scaling(scaling: dict[str, Any]) -> list[str]:
    lines = ["", f"1. RUN worker processes (-c 1 each), {scaling['turns']} LLM turns x {scaling['llm_delay_s']:g} s "
             f"per job (ideal RUN {scaling['ideal_run_s']:.2f} s)",
             f"{'processes':>12}{'jobs':>8}{'jobs/s':>10}{'linear':>10}{'efficiency':>12}{'RUN p50 ms':>12}"]
    base = scaling["rows"][0]["jobs_per_s"] / scaling["rows"][0]["processes"]
    for row in scaling["rows"]:
        lines.append(f"{row['processes']:>12}{row['jobs']:>8}{row['jobs_per_s']:>10.2f}{row['processes'] * base:>10.2f}"
                     f"{row['efficiency']:>11.0%}{row['run_s_median'] * 1e3:>12.0f}")
    return lines


def report_pipeline(pipe: dict[str, Any]) -> list[str]:
    work = pipe["workload"]
    lines = ["", (f"2. three-stage pipeline ({', '.join(pipe['layout']['pipeline'])}) vs one worker per job "
                   f"({pipe['layout']['monolith']}), mixed workload: mean INIT {work['mean_init_s']:.2f} s, "
                   f"mean EVAL {work['mean_eval_s']:.2f} s, RUN {work['turns']} x {work['llm_delay_s']:g} s"),
              f"{'':>12}{'jobs':>8}{'wall s':>10}{'jobs/s':>10}",
              f"{'pipeline':>12}{pipe['pipeline']['jobs']:>8}{pipe['pipeline']['wall_s']:>10.2f}"
              f"{pipe['pipeline']['jobs_per_s']:>10.2f}",
              f"{'monolith':>12}{pipe['monolith']['jobs']:>8}{pipe['monolith']['wall_s']:>10.2f}"
              f"{pipe['monolith']['jobs_per_s']:>10.2f}",
              f"{'ratio':>12}{'':>18}{pipe['ratio']:>10.2f}",
              "   pipeline job, mean s: " + ", ".join(f"{k.removesuffix('_s')} {v:.3f}"
                                                      for k, v in pipe["pipeline_timing_mean_s"].items())]
    return lines


def report_routing(routing_: dict[str, Any]) -> list[str]:
    sim = routing_["simulation"]
    lines = ["", (f"3. routing, simulated: {sim['streams']} streams of {sim['jobs']} jobs "
                   f"(mean {sim['turns_mean']:.1f} turns: 80 % 1-4, 20 % 20-40), {sim['concurrency']} in RUN at once, "
                   f"{sim['backends']} backends; "
                   "mean (worst) over the streams"),
             f"{'policy':<40}{'turns max/min':>16}{'peak in-flight max/min':>24}{'prefix reuse':>14}"]
    for row in sim["policies"]:
        lines.append(f"{row['policy']:<40}{row['load_max_min_mean']:>8.3f} ({row['load_max_min_worst']:.3f})"
                     f"{row['peak_max_min_mean']:>16.2f} ({row['peak_max_min_worst']:.2f})"
                     f"{row['prefix_reuse_mean']:>14.1%}")
    real = routing_["service"]
    lines += [(f"   measured on the service (4 scripted backends, {real['jobs']} jobs, {real['turns_logged']} of "
               f"{real['turns_expected']} turns logged): prefix reuse {real['prefix_reuse']:.1%}, turns per "
               f"backend {real['turns_per_backend']} (max/min {real['load_max_min']:.2f})")]
    return lines


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(argv)
    return run_benchmark(lambda: run(plan), report, RESULTS, lambda r: all(t["ok"] for t in r["targets"].values()))


if __name__ == "__main__":
    sys.exit(main())
