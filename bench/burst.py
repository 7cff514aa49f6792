"""A burst of LLM-bound rollouts launched at once, against the physical floor, in one run.

Every job is a one-turn math rollout whose single LLM call takes ``--delay`` seconds at a
scripted server (``prorl llm-serve --scripted``, a rule with ``delay_s``: an ``asyncio.sleep``,
so the server holds every request at once and is never the bottleneck). The ideal makespan is
the delay. For each burst size, side by side on the same cluster and the same LLM server:

- **floor**: the same number of requests sent straight to the scripted server (``POST
  /v1/completions`` with the job's prompt ids, as the RUN stage sends them), all at once from
  one asyncio client: what the machine can do with no service in between;
- **batched**: ``POST /jobs`` in batches (the client's ``submit_many``), then every result
  streamed back by one ``POST /jobs/wait`` (NDJSON, a line per job as it ends; what the
  client's ``wait_all`` and ``as_completed`` do);
- **single**: one ``POST /jobs`` per job, all at once (how v1 trainers and the verl agent loop
  submit, and issue 29's measure), then the same ``POST /jobs/wait`` stream;
- **batched-perjob**: the same submission, then one ``GET /jobs/<id>?wait=`` per job, all at
  once (how the client waited before ``POST /jobs/wait``): not run unless named in
  ``--styles``, e.g. ``--styles floor,batched-perjob,batched`` to compare the two waits;
- **process**: one blocking ``POST /process`` per job, all at once (how v1 trainers call).

Reported per (size, style): makespan and makespan / ideal, the peak number of requests in
flight at the LLM server (from its request log), the gateway's memory (peak RSS of the gunicorn
process group), and the RUN worker's CPU per job and RSS (idle before the burst, peak during).

    python -m bench.burst                      # 256, 1000 and 4000 jobs of 10 s, both styles
    python -m bench.burst --quick              # 64 and 256 jobs of 2 s
    python -m bench.burst --sizes 1000 --styles process --delay 10 --repeat 2
    python -m bench.burst --sizes 1000 --baseline /tmp/old    # beside an older tree, interleaved
    python -m bench.burst --sizes 1000 --styles floor,batched-perjob,batched   # both waits, one run

Each size gets a cluster of its own (RUN ``-c`` = the size unless ``--run-concurrency``), warmed
by one wave of short jobs first; styles are interleaved over ``--repeat`` rounds. With
``--baseline TREE`` (a checkout, e.g. ``git archive main | tar -x -C /tmp/old``) every round runs
a cluster of that tree's service and one of this tree's, one after the other (order alternating),
and the report gives this tree's makespan over the baseline's of the same round. Prints a table
and writes ``bench/results/burst.json``.
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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._cli import machine_note, markdown_table, run_benchmark
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess
from prorl_celery.trainer.client import TERMINAL_STATUSES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "burst.json"
TARGET_RATIO = 1.25
TARGET_SIZE = 1000
STYLES = ("floor", "batched", "single", "batched-perjob", "process")
#: ids per POST /jobs/wait (the gateway's cap, api.schemas.MAX_WAIT_IDS)
WAIT_CHUNK = 10_000
SAMPLING = {"max_tokens": 64, "temperature": 0.0}
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Plan:
    sizes: list[int]
    styles: list[str]
    delay_s: float
    warm_delay_s: float
    repeat: int
    run_concurrency: int | None
    init_concurrency: int
    eval_concurrency: int
    gateway_workers: int
    gateway_threads: int | None
    warmup: bool
    baseline: str | None = None
    profile: str | None = None


def parse_args(argv: list[str] | None) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="burst sizes (default 256,1000,4000; --quick 64,256)")
    parser.add_argument("--styles", default="floor,batched,process",
                        help="what to run for each size (default %(default)s)")
    parser.add_argument("--delay", type=float, help="seconds of one LLM call (default 10; --quick 2)")
    parser.add_argument("--warm-delay", type=float, default=0.5, help="LLM delay of the warm-up wave (s)")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds of the styles")
    parser.add_argument("--run-concurrency", type=int, help="RUN worker -c (default: the burst size)")
    parser.add_argument("--init-concurrency", type=int, default=16)
    parser.add_argument("--eval-concurrency", type=int, default=16)
    parser.add_argument("--gateway-workers", type=int, default=2)
    parser.add_argument("--gateway-threads", type=int, help="PRORL_GATEWAY_THREADS for the gateway (default: its own)")
    parser.add_argument("--no-warmup", action="store_true", help="measure a cold cluster (no warm-up wave)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 and 256 jobs of 2 s")
    parser.add_argument("--baseline", help="a tree of an older service to run beside this one, interleaved")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy record --gil the RUN and INIT workers during each batched/process burst into "
                             "DIR (collapsed stacks, one file per size, style, round, tree and worker)")
    args = parser.parse_args(argv)
    sizes = args.sizes or ("64,256" if args.quick else "256,1000,4000")
    styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    unknown = set(styles) - set(STYLES)
    if unknown:
        parser.error(f"--styles: unknown {sorted(unknown)}")
    return Plan(sizes=[int(s) for s in sizes.split(",")], styles=styles,
                delay_s=args.delay if args.delay is not None else (2.0 if args.quick else 10.0),
                warm_delay_s=args.warm_delay, repeat=args.repeat, run_concurrency=args.run_concurrency,
                init_concurrency=args.init_concurrency, eval_concurrency=args.eval_concurrency,
                gateway_workers=args.gateway_workers, gateway_threads=args.gateway_threads,
                warmup=not args.no_warmup,
                baseline=str(Path(args.baseline).resolve()) if args.baseline else None,
                profile=str(Path(args.profile).resolve()) if args.profile else None)


# -- processes -------------------------------------------------------------------------------------

def group_pids(process: ManagedProcess) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[2]) == process.popen.pid:
                pids.append(int(entry))
    return pids


def group_rss_mb(process: ManagedProcess) -> float:
    total = 0
    for pid in group_pids(process):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except OSError:
            pass
    return total * PAGE / 2**20


def group_cpu_s(process: ManagedProcess) -> float:
    total = 0.0
    for pid in group_pids(process):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


class Sampler:
    """Peak RSS of some process groups, sampled every 0.2 s on a thread."""

    def __init__(self, processes: dict[str, ManagedProcess]) -> None:
        self.processes = processes
        self.peak = {name: 0.0 for name in processes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for name, process in self.processes.items():
                self.peak[name] = max(self.peak[name], group_rss_mb(process))
            self._stop.wait(0.2)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def rules_file(directory: Path, plan: Plan) -> Path:
    path = directory / "burst-rules.json"
    path.write_text(json.dumps([
        {"match": "BURSTWARM", "replies": ["The answer is \\boxed{2}."], "delay_s": plan.warm_delay_s,
         "scope": "prompt"},
        {"match": "BURST", "replies": ["The answer is \\boxed{2}."], "delay_s": plan.delay_s, "scope": "prompt"},
    ]))
    return path


def start_cluster(plan: Plan, size: int, log_dir: Path, tokenizer: str, rules: Path,
                  tree: Path = ROOT) -> LocalCluster:
    """The service of ``tree`` (its gateway, workers and LLM server import from there)."""
    env = {"PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    if plan.gateway_threads:
        env["PRORL_GATEWAY_THREADS"] = str(plan.gateway_threads)
    command = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer", tokenizer,
               "--port", "{port}", "--log-level", "warning"]
    cluster = LocalCluster(tokenizer=tokenizer, llm_command=command, env=env, gateway_workers=plan.gateway_workers,
                           concurrency={Stage.INIT: plan.init_concurrency,
                                        Stage.RUN: plan.run_concurrency or size,
                                        Stage.EVAL: plan.eval_concurrency},
                           log_dir=log_dir)
    cluster.start()
    return cluster


def named(cluster: LocalCluster, prefix: str) -> ManagedProcess:
    return next(p for p in cluster.processes if p.name.startswith(prefix))


# -- the three styles ----------------------------------------------------------------------------

def instance(tag: str, index: int) -> dict[str, Any]:
    return {"data_source": "math", "problem": f"{tag} {index}: what is 1 + 1?", "answer": "2"}


def llm_base(cluster: LocalCluster) -> str:
    assert cluster.llm_url
    return cluster.llm_url.removesuffix("/v1")


def peak_in_flight(log: list[dict[str, Any]]) -> int:
    events = []
    for gen in log:
        events.append((gen["started"], 1))
        events.append((gen["finished"] or gen["started"], -1))
    peak = current = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        current += step
        peak = max(peak, current)
    return peak


def llm_spread(log: list[dict[str, Any]]) -> dict[str, float]:
    """When the requests reached the LLM server and when it answered them, from the first arrival."""
    if not log:
        return {}
    first = min(g["started"] for g in log)
    return {"llm_last_arrival_s": max(g["started"] for g in log) - first,
            "llm_last_answer_s": max(g["finished"] or g["started"] for g in log) - first}


class LightHTTP:
    """A minimal asyncio HTTP/1.1 client, one connection per request.

    The benchmark's client shares the two cores with the service: httpx costs 5-15 ms of CPU per
    request at a thousand connections, which would bill the client's cost to whatever it
    measures. This one costs a fraction of that, and is used the same way on every side."""

    def __init__(self, base: str, concurrency: int | None = None) -> None:
        host_port = base.removeprefix("http://").split("/", 1)[0]
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self._slots = asyncio.Semaphore(concurrency) if concurrency else None

    async def request(self, method: str, path: str, body: Any = None, retries: int = 20) -> tuple[int, Any]:
        if self._slots is None:
            return await self._request(method, path, body, retries)
        async with self._slots:
            return await self._request(method, path, body, retries)

    async def _request(self, method: str, path: str, body: Any, retries: int) -> tuple[int, Any]:
        reader, writer = await self._send(method, path, body, retries)
        try:
            status, length, chunked = await self._head(reader)
            if chunked:
                data = b"".join([chunk async for chunk in self._chunks(reader)])
            elif length is not None:
                data = await reader.readexactly(length)
            else:
                data = await reader.read()
        finally:
            writer.close()
        return status, json.loads(data) if data else None

    async def stream_lines(self, method: str, path: str, body: Any = None, retries: int = 20) -> AsyncIterator[Any]:
        """A chunked NDJSON reply (``POST /jobs/wait``), each line decoded as it arrives; blank
        lines (the gateway's keep-alives) are skipped."""
        reader, writer = await self._send(method, path, body, retries)
        try:
            status, length, chunked = await self._head(reader)
            if status != 200 or not chunked:
                data = await (reader.readexactly(length) if length is not None else reader.read())
                raise RuntimeError(f"{method} {path}: {status} {data[:500]!r}")
            rest = b""
            async for chunk in self._chunks(reader):
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            writer.close()

    async def _send(self, method: str, path: str, body: Any,
                    retries: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        payload = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
        for attempt in range(retries):
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                break
            except OSError:  # a full accept backlog refuses: retry as any client would
                await asyncio.sleep(0.05 * (attempt + 1))
        else:
            raise ConnectionError(f"cannot connect to {self.host}:{self.port}")
        writer.write(head + payload)
        return reader, writer

    @staticmethod
    async def _head(reader: asyncio.StreamReader) -> tuple[int, int | None, bool]:
        """Status, Content-Length and whether the body is chunked."""
        status = int((await reader.readline()).split()[1])
        length, chunked = None, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        return status, length, chunked

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while (size := int((await reader.readline()).strip() or b"0", 16)):
            yield await reader.readexactly(size)
            await reader.readline()


async def floor(cluster: LocalCluster, size: int, tag: str, prompt_ids: list[int],
                t0: list[float]) -> tuple[float, list]:
    """The same burst straight to the scripted server: no service in between."""
    client = LightHTTP(llm_base(cluster))
    body = {"model": "m", "prompt": prompt_ids, "max_tokens": 64, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}

    async def one(i: int) -> None:
        status, reply = await client.request("POST", "/v1/completions", body)
        if status != 200:
            raise RuntimeError(f"the LLM server answered {status}: {reply}")
    t0.append(time.time())
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(size)))
    return time.perf_counter() - started, []


def job_ids(tag: str, size: int) -> list[str]:
    return [f"{tag.replace(' ', '-')}-{os.getpid()}-{time.time_ns()}-{i}" for i in range(size)]


async def batched(cluster: LocalCluster, size: int, tag: str, t0: list[float],
                  per_job: bool = False, single: bool = False) -> tuple[float, list[dict]]:
    """submit_many (POST /jobs in batches; ``single``: one POST /jobs per job, all at once), then
    one POST /jobs/wait stream per WAIT_CHUNK ids (``per_job``: every job's GET /jobs/<id>?wait=,
    all at once, instead; also on a baseline tree from before POST /jobs/wait, whose batched
    style waited so)."""
    from prorl_celery.trainer.client import AsyncRolloutClient, JobRequest

    ids = job_ids(tag, size)
    gateway = LightHTTP(cluster.gateway_url)

    async def result(job_id: str) -> dict:
        while True:
            status, reply = await gateway.request("GET", f"/jobs/{job_id}?wait=600")
            if status == 200:
                return reply
            if status != 202:
                raise RuntimeError(f"GET /jobs/{job_id}: {status} {reply}")
    if not per_job and not await streams_waits(gateway):
        per_job = True  # a baseline tree from before POST /jobs/wait: its batched style waited per job
    async with AsyncRolloutClient(cluster.gateway_url, timeout_s=600) as client:
        requests = [JobRequest(instance(tag, i), SAMPLING, job_id, None, None) for i, job_id in enumerate(ids)]
        t0.append(time.time())
        started = time.perf_counter()
        if single:
            await asyncio.gather(*(submit_one(gateway, request.body()) for request in requests))
        else:
            await client.submit_many(requests)
        if per_job:
            results = list(await asyncio.gather(*(result(job_id) for job_id in ids)))
        else:
            chunks = await asyncio.gather(*(streamed(gateway, ids[i:i + WAIT_CHUNK])
                                            for i in range(0, len(ids), WAIT_CHUNK)))
            results = [r for chunk in chunks for r in chunk]
        return time.perf_counter() - started, results


async def submit_one(gateway: LightHTTP, body: dict[str, Any]) -> None:
    status, reply = await gateway.request("POST", "/jobs", body)
    if status != 202:
        raise RuntimeError(f"POST /jobs: {status} {reply}")


async def streams_waits(gateway: LightHTTP) -> bool:
    """Does this gateway serve POST /jobs/wait? (Not a tree older than it.)"""
    lines = []
    try:
        async for line in gateway.stream_lines("POST", "/jobs/wait", {"job_ids": ["burst-probe"], "timeout_s": 0}):
            lines.append(line)
    except RuntimeError:  # 404/405 from an older gateway
        return False
    return bool(lines)


async def streamed(gateway: LightHTTP, ids: list[str]) -> list[dict]:
    """Every job's result through one POST /jobs/wait, as the jobs end."""
    results = [line async for line in gateway.stream_lines("POST", "/jobs/wait",
                                                            {"job_ids": ids, "timeout_s": 600})]
    unfinished = [r for r in results if r.get("status") not in TERMINAL_STATUSES]
    if unfinished or len(results) != len(ids):
        raise RuntimeError(f"POST /jobs/wait: {len(results)} lines for {len(ids)} jobs, "
                           f"not ended: {unfinished[:3]}")
    return results


async def process(cluster: LocalCluster, size: int, tag: str, t0: list[float]) -> tuple[float, list[dict]]:
    """One blocking POST /process per job, all at once."""
    gateway = LightHTTP(cluster.gateway_url)
    ids = job_ids(tag, size)

    async def one(i: int) -> dict:
        status, reply = await gateway.request("POST", "/process", {"instance": instance(tag, i), "job_id": ids[i],
                                                                   "sampling_params": SAMPLING})
        if status != 200:
            raise RuntimeError(f"POST /process: {status} {reply}")
        return reply
    t0.append(time.time())
    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(size)))
    return time.perf_counter() - started, list(results)


def admitted_s(cluster: LocalCluster, results: list[dict], t0: float) -> float | None:
    """When the last job of the burst was created in Redis, from the burst's start."""
    import redis

    if not results:
        return None
    client = redis.Redis.from_url(cluster.state_url, decode_responses=True)
    pipe = client.pipeline(transaction=False)
    for result in results:
        pipe.hget(f"prorl:job:{result['job_id']}", "created_at")
    created = [float(v) for v in pipe.execute() if v]
    return max(created) - t0 if created else None


def run_async(coro: Any) -> Any:
    """On uvloop's loop when installed (cheaper per connection), as the workers run theirs."""
    from prorl_celery.core.event_loops import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def prompt_of_job(cluster: LocalCluster, tokenizer: str) -> list[int]:
    """The prompt ids the RUN stage sends for a burst job (the floor sends the same): a warm-up
    job's prompt, its tag made the measured one's."""
    from prorl_celery.llm.tokenizer import load_tokenizer

    with httpx.Client(base_url=cluster.gateway_url, timeout=120) as client:
        result = client.post("/process", json={"instance": instance("BURSTWARM", 0), "sampling_params": SAMPLING})
    tok = load_tokenizer(tokenizer)
    text = tok.decode(result.json()["trajectory"]["prompt_ids"], skip_special_tokens=False)
    return tok.encode(text.replace("BURSTWARM", "BURST floor"))


def measure(cluster: LocalCluster, plan: Plan, size: int, style: str, tag: str,
            prompt_ids: list[int]) -> dict[str, Any]:
    httpx.post(llm_base(cluster) + "/_reset").raise_for_status()
    gateway, run_worker = named(cluster, "gateway"), named(cluster, "run-")
    idle = {"gateway_rss_mb": group_rss_mb(gateway), "run_rss_mb": group_rss_mb(run_worker)}
    cpu_before = {name: group_cpu_s(p) for name, p in (("gateway", gateway), ("run", run_worker),
                                                        ("init", named(cluster, "init-")),
                                                        ("eval", named(cluster, "eval-")),
                                                        ("llm", named(cluster, "llm")))}
    own_before = time.process_time()
    t0: list[float] = []
    profilers = [start_profile(plan, worker, f"{size}-{style}-{tag.replace(' ', '-')}-{kind}")
                 for kind, worker in (("run", run_worker), ("init", named(cluster, "init-")))] \
        if style != "floor" else []
    with Sampler({"gateway": gateway, "run": run_worker}) as sampler:
        if style == "floor":
            makespan, results = run_async(floor(cluster, size, tag, prompt_ids, t0))
        elif style in ("batched", "batched-perjob", "single"):
            makespan, results = run_async(batched(cluster, size, tag, t0, per_job=style == "batched-perjob",
                                                  single=style == "single"))
        else:
            makespan, results = run_async(process(cluster, size, tag, t0))
    own_cpu = time.process_time() - own_before
    for profiler in profilers:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            profiler.wait(60)
    cpu = {name: group_cpu_s(named(cluster, prefix)) - cpu_before[name]
           for name, prefix in (("gateway", "gateway"), ("run", "run-"), ("init", "init-"), ("eval", "eval-"),
                                ("llm", "llm"))}
    cpu["client"] = own_cpu
    log = httpx.get(llm_base(cluster) + "/_log", timeout=120).json()
    bad = [r for r in results if r.get("status") != "completed"]
    row = {"size": size, "style": style, "makespan_s": makespan, "ratio": makespan / plan.delay_s,
           "peak_in_flight": peak_in_flight(log), "llm_requests": len(log), **llm_spread(log),
           "admitted_s": admitted_s(cluster, results, t0[0]), "not_completed": len(bad),
           "example_error": (bad[0].get("error") if bad else None),
           "gateway_rss_idle_mb": idle["gateway_rss_mb"], "gateway_rss_peak_mb": sampler.peak["gateway"],
           "run_rss_idle_mb": idle["run_rss_mb"], "run_rss_peak_mb": sampler.peak["run"],
           "cpu_ms_per_job": {k: v * 1e3 / size for k, v in cpu.items()}}
    print(f"  {size:>5} {style:<14} makespan {makespan:6.2f} s ({row['ratio']:.2f}x ideal), peak in flight "
          f"{row['peak_in_flight']}, all admitted after {row['admitted_s'] or 0:.2f} s, "
          f"gateway {row['gateway_rss_peak_mb']:.0f} MB, RUN {row['run_rss_peak_mb']:.0f} MB, "
          f"RUN CPU {row['cpu_ms_per_job']['run']:.1f} ms/job, arrivals at the LLM over "
          f"{row.get('llm_last_arrival_s', 0):.2f} s" + (f", {len(bad)} not completed" if bad else ""),
          file=sys.stderr, flush=True)
    return row


def start_profile(plan: Plan, worker: ManagedProcess, name: str) -> subprocess.Popen | None:
    """py-spy on a worker's process (GIL-holding samples only, 50 Hz), or None."""
    if not plan.profile:
        return None
    Path(plan.profile).mkdir(parents=True, exist_ok=True)
    out = Path(plan.profile) / f"{name}-{os.getpid()}-{time.time_ns()}.txt"
    return subprocess.Popen(["py-spy", "record", "--gil", "-r", "50", "--format", "raw", "-o", str(out),
                             "-p", str(worker.popen.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_run(benchmark: str, plan: Plan, plan_fields: dict[str, Any]) -> tuple[dict[str, Any], Path, str, Path]:
    """A run's result skeleton (machine, plan), log directory, tokenizer and LLM rules file."""
    from prorl_celery.dev.devmodels import ensure_tokenizer

    log_dir = Path(tempfile.mkdtemp(prefix=f"prorl-{benchmark}-"))
    result: dict[str, Any] = {
        "benchmark": benchmark, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "log_dir": str(log_dir),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_before": os.getloadavg()},
        "plan": plan_fields, "rows": []}
    return result, log_dir, str(ensure_tokenizer("qwen3")), rules_file(log_dir, plan)


def trees_of(plan: Plan) -> list[tuple[str, Path]]:
    """This tree, and the baseline's when one is given: (label, root)."""
    return [("this", ROOT)] + ([("baseline", Path(plan.baseline))] if plan.baseline else [])


def run(plan: Plan) -> dict[str, Any]:
    result, log_dir, tokenizer, rules = start_run("burst", plan, plan.__dict__)
    result["clusters"] = []
    trees = trees_of(plan)
    for size in plan.sizes:
        for round_ in range(plan.repeat):
            for label, tree in (trees if round_ % 2 == 0 else trees[::-1]):
                order = plan.styles if round_ % 2 == 0 else plan.styles[::-1]
                run_cluster(plan, result, size, round_, label, tree, order, log_dir, tokenizer, rules)
    result["loadavg_after"] = os.getloadavg()
    return result


def run_cluster(plan: Plan, result: dict[str, Any], size: int, round_: int, label: str, tree: Path,
                styles: list[str], log_dir: Path, tokenizer: str, rules: Path) -> None:
    """One cluster of ``tree``'s service: warm it, measure ``styles`` once each, stop it."""
    print(f"burst of {size}, round {round_}, {label} tree ({tree}): starting a cluster "
          f"(RUN -c {plan.run_concurrency or size}; logs in {log_dir})", file=sys.stderr, flush=True)
    here = os.getcwd()
    os.chdir(tree)  # `python -m` puts the working directory first on sys.path: the tree's own
    try:
        cluster = start_cluster(plan, size, log_dir / f"size-{size}-r{round_}-{label}", tokenizer, rules, tree)
    finally:
        os.chdir(here)
    try:
        run_worker = named(cluster, "run-")
        time.sleep(2.0)  # let the workers settle (tokenizer preload, first heartbeat)
        info = {"size": size, "round": round_, "tree": label, "run_rss_started_mb": group_rss_mb(run_worker),
                "gateway_rss_started_mb": group_rss_mb(named(cluster, "gateway"))}
        prompt_ids = prompt_of_job(cluster, tokenizer)
        if plan.warmup and set(styles) - {"floor"}:
            started = time.perf_counter()
            run_async(batched(cluster, size, "BURSTWARM", []))
            info["warmup_s"] = time.perf_counter() - started
        info["run_rss_warm_mb"] = group_rss_mb(run_worker)
        result["clusters"].append(info)
        for style in styles:
            row = measure(cluster, plan, size, style, f"BURST r{round_}", prompt_ids)
            row.update(round=round_, tree=label)
            result["rows"].append(row)
    finally:
        cluster.stop()


def versus_baseline(result: dict[str, Any]) -> list[str]:
    """This tree's makespan over the baseline's, per size, style and round."""
    rows = {(r["size"], r["style"], r.get("round", 0), r.get("tree", "this")): r for r in result["rows"]}
    lines = []
    for (size, style, round_, tree), row in sorted(rows.items()):
        other = rows.get((size, style, round_, "baseline"))
        if tree == "this" and other is not None and style != "floor":
            lines.append(f"  {size:>5} {style:<14} round {round_}: makespan {row['makespan_s']:.2f} s vs "
                         f"{other['makespan_s']:.2f} s = {row['makespan_s'] / other['makespan_s']:.2f}x the "
                         f"baseline's; last arrival at the LLM {row.get('llm_last_arrival_s', 0):.2f} vs "
                         f"{other.get('llm_last_arrival_s', 0):.2f} s; RUN CPU/job "
                         f"{row['cpu_ms_per_job']['run']:.1f} vs {other['cpu_ms_per_job']['run']:.1f} ms")
    return lines


def versus_perjob(result: dict[str, Any]) -> list[str]:
    """batched (one POST /jobs/wait) over batched-perjob (a GET ?wait= per job), same cluster and round."""
    rows = {(r["size"], r["style"], r.get("round", 0), r.get("tree", "this")): r for r in result["rows"]}
    lines = []
    for (size, style, round_, tree), row in sorted(rows.items()):
        other = rows.get((size, "batched-perjob", round_, tree))
        if style == "batched" and other is not None:
            mine, theirs = row["cpu_ms_per_job"], other["cpu_ms_per_job"]
            lines.append(f"  {tree:<8} {size:>5} round {round_}: makespan {row['makespan_s']:.2f} vs "
                         f"{other['makespan_s']:.2f} s = {row['makespan_s'] / other['makespan_s']:.2f}x; gateway "
                         f"CPU/job {mine['gateway']:.2f} vs {theirs['gateway']:.2f} ms = "
                         f"{mine['gateway'] / max(theirs['gateway'], 1e-9):.2f}x; client {mine['client']:.2f} vs "
                         f"{theirs['client']:.2f} ms; last arrival at the LLM {row.get('llm_last_arrival_s', 0):.2f} "
                         f"vs {other.get('llm_last_arrival_s', 0):.2f} s")
    return lines


def report(result: dict[str, Any]) -> str:
    lines = [f"burst of one-turn math jobs, LLM call {result['plan']['delay_s']:g} s (ideal makespan), "
             + machine_note(result), ""]
    lines += markdown_table(
        ["tree", "jobs", "style", "makespan", "/ ideal", "peak in flight", "gateway RSS peak", "RUN CPU/job",
         "RUN RSS idle -> peak", "not completed"],
        [[f"{row.get('tree', 'this')} r{row.get('round', 0)}", str(row["size"]), row["style"],
          f"{row['makespan_s']:.2f} s", f"{row['ratio']:.2f}x", str(row["peak_in_flight"]),
          f"{row['gateway_rss_peak_mb']:.0f} MB", f"{row['cpu_ms_per_job']['run']:.1f} ms",
          f"{row['run_rss_idle_mb']:.0f} -> {row['run_rss_peak_mb']:.0f} MB", str(row["not_completed"])]
         for row in result["rows"]])
    lines.append("")
    lines.append("CPU ms per job by process (gateway, init, run, eval, llm, client):")
    for row in result["rows"]:
        cpu = row["cpu_ms_per_job"]
        per_process = "  ".join(f"{k} {cpu[k]:.1f}" for k in ("gateway", "init", "run", "eval", "llm", "client"))
        lines.append(f"  {row.get('tree', 'this'):<8} {row['size']:>5} {row['style']:<14} {per_process}")
    lines.append("RUN worker per stage (one LLM turn per job): memory per stage in flight = (peak - idle RSS) / "
                 "peak in flight; CPU per turn = RUN CPU per job")
    for row in result["rows"]:
        if row["style"] != "floor" and row["peak_in_flight"]:
            per_slot_kb = (row["run_rss_peak_mb"] - row["run_rss_idle_mb"]) * 1024 / row["peak_in_flight"]
            lines.append(f"  {row.get('tree', 'this'):<8} {row['size']:>5} {row['style']:<14} {per_slot_kb:.0f} KB per "
                         f"stage in flight, {row['cpu_ms_per_job']['run']:.1f} ms CPU per turn")
    perjob = versus_perjob(result)
    if perjob:
        lines.append("batched (one POST /jobs/wait) against batched-perjob (GET /jobs/<id>?wait= each), same cluster:")
        lines += perjob
    if any(r.get("tree") == "baseline" for r in result["rows"]):
        lines.append("this tree against the baseline, same round:")
        lines += versus_baseline(result)
    for info in result["clusters"]:
        lines.append(f"  cluster {info['size']} {info.get('tree', 'this')} r{info.get('round', 0)}: RUN worker RSS "
                     f"at start {info['run_rss_started_mb']:.0f} MB, after warm-up {info['run_rss_warm_mb']:.0f} MB; "
                     f"gateway {info['gateway_rss_started_mb']:.0f} MB")
    return "\n".join(lines)


def passed(result: dict[str, Any]) -> bool:
    rows = [r for r in result["rows"] if r["size"] == TARGET_SIZE and r["style"] != "floor"
            and r.get("tree", "this") == "this"]
    return all(r["ratio"] <= TARGET_RATIO and r["peak_in_flight"] >= TARGET_SIZE and not r["not_completed"]
               for r in rows)


def main(argv: list[str] | None = None) -> int:
    plan = parse_args(argv)
    return run_benchmark(lambda: run(plan), report, RESULTS, passed)


if __name__ == "__main__":
    sys.exit(main())
