"""A randomized chaos soak: jobs of every shipped domain flowing for a set number of minutes
while faults are injected at random moments from a printed seed, then the invariants checked.

The service runs as ``prorl up --redis sentinel`` runs it (``LocalCluster``: gunicorn, the three
stock worker pools, a Sentinel group) with two scripted LLM servers, each writing every answered
generation to a log file that survives its SIGKILL. Jobs are the user-install check's, one kind
per domain (math with the python tool, code, swe with the gold patch and without a change, stem,
agent: ``scripts/lib/user_install_jobs.py``), submitted to keep ``--in-flight`` of them running.

Faults, one every ``--every`` seconds on average (exponential gaps), the kind drawn uniformly:

- ``kill_worker``: SIGKILL of an INIT, RUN or EVAL worker, started again at once;
- ``kill_gateway``: SIGKILL of gunicorn, started again on its address;
- ``kill_llm``: SIGKILL of an LLM server, started again on its port 2 s later;
- ``kill_tool_server``: SIGKILL of a sandbox's tool server (its job's attempt fails, it retries);
- ``redis_restart``: SIGKILL of the Redis replica, started again by the supervision;
- ``failover``: SIGKILL of the Redis primary (the sentinels fail over; the supervision restarts it
  as the new replica, or in place when its replica is not yet in sync);
- ``stop_start``: ``POST /stop`` (every job in flight cancelled), ``POST /start`` 1 s later;
- ``cancel_storm``: ``POST /cancel`` of up to 10 jobs in flight.

Invariants, checked at the end (after every job had ``--drain`` seconds to end):

1. every accepted job is terminal;
2. no job ended ``failed`` in a class the service retries while it still had attempts left;
3. every completed job's trajectory is token-exact against the LLM servers' logs (each model
   turn's ids and logprobs are one answered generation's, for exactly the prompt before it);
4. no sandbox process outlives its job, and no ledger entry does;
5. no worker, gateway or Redis process is dead while the soak thinks it runs.

A failure prints the seed and the event log; the same ``--seed`` draws the same faults at the
same moments (the service's own timing varies). The report counts faults per kind, jobs run and
lost, orphans and the worst recovery (the longest time from a fault to the next job ending).

    python -m bench.chaos --minutes 10 --seed 1
    python -m bench.chaos --minutes 2 --every 10      # the shorter run of CI's extended suite

Writes ``bench/results/chaos-<seed>.json``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._cli import machine_note, markdown_table, run_benchmark
from prorl_celery.core.status import Stage
from prorl_celery.dev.devmodels import ensure_tokenizer
from prorl_celery.dev.local import LocalCluster, ManagedProcess, free_port, wait_until
from prorl_celery.state.connection import open_redis
from singularity.runtime import procfs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RULES = ROOT / "tests" / "data" / "user_install_rules.json"
FAULTS = ("kill_worker", "kill_gateway", "kill_llm", "kill_tool_server", "redis_restart", "failover",
          "stop_start", "cancel_storm")
#: the outcome classes the service retries (a job failed in one with attempts left broke invariant 2)
RETRIED = {"env_error", "backend_error", "eval_error"}
CONCURRENCY = {Stage.INIT: 8, Stage.RUN: 32, Stage.EVAL: 4}
TERMINAL = {"completed", "failed", "cancelled", "timeout"}


def user_install_jobs() -> Any:
    """scripts/lib/user_install_jobs.py: the job kinds, one per domain."""
    path = ROOT / "scripts" / "lib" / "user_install_jobs.py"
    spec = importlib.util.spec_from_file_location("user_install_jobs", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules["user_install_jobs"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


@dataclass
class LLM:
    """A scripted LLM server on a fixed port, its answered generations in ``log_path``."""

    name: str
    port: int
    log_path: Path
    tokenizer: str
    log_dir: Path
    process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        log = self.log_dir / f"{self.name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen([sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(RULES),
                                      "--tokenizer", self.tokenizer, "--port", str(self.port),
                                      "--log-file", str(self.log_path)],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.process = ManagedProcess(self.name, popen, log)
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{self.port}/health").status_code == 200, 120,
                   self.name, self.process)

    def entries(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]


@dataclass
class Soak:
    seed: int
    minutes: float
    every_s: float
    in_flight: int
    drain_s: float
    root: Path
    rng: random.Random = field(init=False)
    cluster: LocalCluster = field(init=False)
    llms: list[LLM] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)  # job id -> kind
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: float = 0.0
    load_before: list[float] = field(default_factory=lambda: list(os.getloadavg()))

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        tokenizer = str(ensure_tokenizer("qwen3"))
        env = {"PRORL_NODE": f"chaos-{self.seed}", "PRORL_SANDBOX_DIR": str(self.root / "sbx"),
               "PRORL_REAPER_INTERVAL_S": "1", "PRORL_LEASE_S": "15", "PRORL_HEARTBEAT_S": "2",
               "PRORL_REPUBLISH_AFTER_S": "30"}
        # each Redis server with its append-only file, as prorl up --redis sentinel keeps them
        self.cluster = LocalCluster(redis_sentinel=True, redis_dir=self.root / "redis", tokenizer=tokenizer,
                                    concurrency=dict(CONCURRENCY), log_dir=self.root / "logs", env=env)
        self.llms = [LLM(f"llm-{i}", free_port(), self.root / f"llm-{i}.jsonl", tokenizer, self.root)
                     for i in range(2)]
        kinds = user_install_jobs().phase_one()
        # as prorl up's own loop does: on a thread of its own, never held up by a submit that
        # waits on the very Redis the supervision must bring back
        done = threading.Event()

        def supervise() -> None:
            while not done.wait(0.2):
                try:
                    self.cluster.supervise()
                except Exception as error:  # noqa: BLE001 - logged, the next round tries again
                    self.log("supervise", f"failed: {error!r}")

        supervision = threading.Thread(target=supervise, name="chaos-supervision", daemon=True)
        try:
            self.cluster.start()
            for llm in self.llms:
                llm.start()
                httpx.post(self.cluster.gateway_url + "/add_llm_server",
                           json={"address": llm.address}).raise_for_status()
            self.started = time.monotonic()
            supervision.start()
            deadline = self.started + self.minutes * 60
            next_fault = self.started + self.rng.expovariate(1 / self.every_s)
            while time.monotonic() < deadline:
                self.keep_flowing(kinds)
                if time.monotonic() >= next_fault:
                    self.inject(self.rng.choice(FAULTS))
                    next_fault = time.monotonic() + self.rng.expovariate(1 / self.every_s)
                self.collect()
                time.sleep(0.5)
            self.log("drain", f"no more jobs or faults; {self.drain_s:.0f} s for the rest to end")
            drain_deadline = time.monotonic() + self.drain_s
            while time.monotonic() < drain_deadline and len(self.ended) < len(self.accepted):
                self.collect()
                time.sleep(1)
            return self.verdict()
        finally:
            done.set()
            if supervision.is_alive():
                supervision.join(10)
            for llm in self.llms:
                if llm.process is not None:
                    llm.process.stop()
            self.cluster.stop()

    def log(self, kind: str, detail: str) -> None:
        at = time.monotonic() - self.started if self.started else 0.0
        self.events.append({"at": round(at, 2), "kind": kind, "detail": detail})
        print(f"[chaos {at:7.1f} s] {kind}: {detail}", flush=True)

    def gateway(self, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """One gateway call; None while it is down (a client retries: so does the soak)."""
        try:
            return httpx.request(method, self.cluster.gateway_url + path, timeout=30, **kwargs)
        except httpx.HTTPError:
            return None

    def keep_flowing(self, kinds: list[Any]) -> None:
        missing = self.in_flight - (len(self.accepted) - len(self.ended))
        if missing <= 0:
            return
        picked = [self.rng.choice(kinds) for _ in range(missing)]
        ids = [f"chaos{self.seed}-{len(self.accepted) + i}" for i in range(missing)]
        body = [{**kind.body(600.0), "job_id": job_id} for kind, job_id in zip(picked, ids)]
        reply = self.gateway("POST", "/jobs", json=body)
        if reply is not None and reply.status_code == 202:
            self.accepted.update({job_id: kind.name for job_id, kind in zip(ids, picked)})
        elif reply is not None and reply.status_code not in (503,):
            raise RuntimeError(f"POST /jobs answered {reply.status_code}: {reply.text[:300]}")

    def collect(self) -> None:
        """The results of the jobs that ended since the last look (one POST /jobs/wait stream
        would be the client's way; a short poll of each open job is enough here)."""
        open_ids = [job_id for job_id in self.accepted if job_id not in self.ended]
        for job_id in open_ids[:64]:
            reply = self.gateway("GET", f"/jobs/{job_id}")
            if reply is not None and reply.status_code == 200 and reply.json().get("status") in TERMINAL:
                self.ended[job_id] = {**reply.json(), "seen_at": time.monotonic() - self.started}

    # -- faults -----------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        try:
            detail = getattr(self, kind)()
        except Exception as error:  # noqa: BLE001 - a fault that could not be made is logged, not fatal
            detail = f"not injected: {error!r}"
        self.log(kind, detail)

    def kill_worker(self) -> str:
        workers = [p for p in self.cluster.processes if p.name in self.cluster.workers and p.popen.poll() is None]
        victim = self.rng.choice(workers)
        stage = Stage(victim.name.split("-")[0])
        os.killpg(victim.popen.pid, signal.SIGKILL)
        victim.popen.wait(10)
        self.cluster.processes.remove(victim)
        self.cluster.workers.discard(victim.name)
        self.cluster.start_worker(stage, CONCURRENCY[stage])
        return f"{victim.name} (pid {victim.popen.pid}) killed, a new {stage.value} worker started"

    def kill_gateway(self) -> str:
        self.cluster.restart_gateway(kill=True)
        return "gunicorn killed and started again"

    def kill_llm(self) -> str:
        llm = self.rng.choice(self.llms)
        assert llm.process is not None
        os.killpg(llm.process.popen.pid, signal.SIGKILL)
        llm.process.popen.wait(10)
        time.sleep(2)
        llm.start()
        return f"{llm.name} killed, started again on port {llm.port} 2 s later"

    def kill_tool_server(self) -> str:
        prefix = os.path.realpath(self.root / "sbx") + os.sep
        servers = []
        for info in procfs.scan():
            try:
                argv = Path(f"/proc/{info.pid}/cmdline").read_bytes().split(b"\0")
                log = os.readlink(f"/proc/{info.pid}/fd/2")
            except OSError:
                continue
            if b"singularity.toolserver" in argv and b"bwrap" not in argv[0] and log.startswith(prefix):
                servers.append(info.pid)
        if not servers:
            return "no sandbox running"
        pid = self.rng.choice(servers)
        os.kill(pid, signal.SIGKILL)
        return f"tool server pid {pid} killed ({len(servers)} running)"

    def _kill_redis(self, primary: bool) -> str:
        group = self.cluster._sentinel_group
        current = group.agreed_primary_port()
        if current is None:
            return "the sentinels do not agree on a primary yet: skipped"
        name = next(n for n in ("redis", "redis-replica") if (group.ports[n] == current) == primary)
        process = group.processes[name]
        if process.popen.poll() is not None:
            return f"{name} is down already: skipped"
        os.kill(process.popen.pid, signal.SIGKILL)
        return f"{'primary' if primary else 'replica'} {name} (port {group.ports[name]}) killed"

    def redis_restart(self) -> str:
        return self._kill_redis(primary=False)

    def failover(self) -> str:
        return self._kill_redis(primary=True)

    def stop_start(self) -> str:
        stopped = self.gateway("POST", "/stop")
        time.sleep(1)
        started = self.gateway("POST", "/start")
        return (f"/stop {getattr(stopped, 'status_code', 'unreachable')}, "
                f"/start {getattr(started, 'status_code', 'unreachable')}")

    def cancel_storm(self) -> str:
        open_ids = [job_id for job_id in self.accepted if job_id not in self.ended]
        chosen = self.rng.sample(open_ids, min(10, len(open_ids)))
        reply = self.gateway("POST", "/cancel", json={"job_ids": chosen})
        return f"{len(chosen)} jobs: {getattr(reply, 'status_code', 'unreachable')}"

    # -- the verdict ------------------------------------------------------------------------

    def verdict(self) -> dict[str, Any]:
        lost = sorted(set(self.accepted) - set(self.ended))
        wrongly_failed = {job_id: (r.get("outcome"), r.get("attempt"), r.get("max_attempts"), r.get("detail"))
                          for job_id, r in self.ended.items()
                          if r.get("status") == "failed" and r.get("outcome") in RETRIED
                          and int(r.get("attempt") or 0) < int(r.get("max_attempts") or 3)}
        inexact, turns_checked = self.inexact()
        orphans = self.orphans()
        dead = [f"{p.name} (exit {p.popen.poll()})" for p in self.cluster.processes
                if p.popen.poll() is not None and self.meant_to_run(p)]
        kinds = Counter(e["kind"] for e in self.events if e["kind"] in FAULTS and "not injected" not in e["detail"]
                        and "skipped" not in e["detail"])
        outcomes = Counter(r.get("outcome") for r in self.ended.values())
        return {"seed": self.seed, "minutes": self.minutes, "every_s": self.every_s, "faults": dict(kinds),
                "jobs": len(self.accepted), "ended": len(self.ended), "outcomes": dict(outcomes),
                "lost": lost, "wrongly_failed": wrongly_failed, "inexact": inexact, "turns_checked": turns_checked,
                "orphans": orphans,
                "dead": dead, "worst_recovery_s": self.worst_recovery(), "events": self.events,
                "log_dir": str(self.root), "machine": {"cpus": os.cpu_count(), "loadavg_before": self.load_before}}

    def meant_to_run(self, process: ManagedProcess) -> bool:
        """A process the soak still counts on: the last one of its name (a killed one was replaced)."""
        same = [p for p in self.cluster.processes if p.name == process.name]
        return process is same[-1] and (process.name in self.cluster.workers or process.name == "gateway"
                                        or process.name.startswith("redis"))

    def inexact(self) -> tuple[dict[str, str], int]:
        """The completed jobs whose trajectory is not the logged generations (why), and how many
        model turns were checked."""
        generations: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        for llm in self.llms:
            for entry in llm.entries():
                generations.setdefault(tuple(entry["prompt_ids"]), []).append(entry)
        wrong, turns = {}, 0
        for job_id, result in self.ended.items():
            if result.get("status") != "completed" or not result.get("trajectory"):
                continue
            trajectory = result["trajectory"]
            for index, segment in enumerate(trajectory.get("segments") or [trajectory]):
                problem, checked = segment_problem(segment, generations)
                turns += checked
                if problem:
                    wrong[job_id] = f"segment {index}: {problem}"
                    break
        return wrong, turns

    def orphans(self) -> list[str]:
        deadline = time.monotonic() + 60
        while True:
            left = sandbox_processes(self.root / "sbx")
            store = open_redis(self.cluster.state_url, master_name="prorl")
            from prorl_celery.worker.node_sandboxes import RedisSandboxLedger
            entries = [f"ledger {record.sandbox_id} (job {record.job_id})"
                       for record in RedisSandboxLedger(store).list(self.cluster.node)
                       if record.job_id in self.ended or record.job_id not in self.accepted]
            if not (left or entries) or time.monotonic() > deadline:
                return left + entries
            time.sleep(2)

    def worst_recovery(self) -> float | None:
        ends = sorted(r["seen_at"] for r in self.ended.values())
        worst = None
        for event in self.events:
            if event["kind"] not in FAULTS:
                continue
            after = next((end for end in ends if end > event["at"]), None)
            if after is not None:
                worst = max(worst or 0.0, after - event["at"])
        return worst


def segment_problem(segment: dict[str, Any],
                    generations: dict[tuple[int, ...], list[dict[str, Any]]]) -> tuple[str | None, int]:
    """Why ``segment``'s model turns are not the logged generations (None: they are), and how many
    turns matched: each run of model tokens (mask 1) must start with one generation's output for
    exactly the ids before it, with its logprobs."""
    whole = list(segment["prompt_ids"]) + list(segment["response_ids"])
    mask = [0] * len(segment["prompt_ids"]) + list(segment["response_mask"])
    logprobs = [0.0] * len(segment["prompt_ids"]) + list(segment.get("response_logprobs") or [])
    at = turns = 0
    while at < len(whole):
        if not mask[at]:
            at += 1
            continue
        candidates = generations.get(tuple(whole[:at]), [])
        match = next((g for g in candidates if g["output_ids"]
                      and whole[at:at + len(g["output_ids"])] == g["output_ids"]
                      and all(mask[at:at + len(g["output_ids"])])), None)
        if match is None:
            return f"the model tokens at {at} are no logged generation's for the prompt before them", turns
        if logprobs[at:at + len(match["output_ids"])] != match["logprobs"]:
            return f"the logprobs at {at} are not the logged generation's", turns
        at += len(match["output_ids"])
        turns += 1
    return None, turns


def sandbox_processes(sandbox_dir: Path) -> list[str]:
    """Live processes whose output goes to a sandbox's log under ``sandbox_dir``."""
    prefix = os.path.realpath(sandbox_dir) + os.sep
    found = []
    for info in procfs.scan():
        try:
            links = [os.readlink(f"/proc/{info.pid}/fd/{fd}") for fd in (1, 2)]
        except OSError:
            continue
        if info.state not in "ZX" and any(link.startswith(prefix) for link in links):
            found.append(f"sandbox process {info.pid}")
    return found


def broken(result: dict[str, Any]) -> list[str]:
    """The invariants ``result`` breaks."""
    checks: dict[str, Callable[[dict[str, Any]], Any]] = {
        "every accepted job terminal": lambda r: r["lost"],
        "no retryable failure with attempts left": lambda r: r["wrongly_failed"],
        "every completed trajectory token-exact": lambda r: r["inexact"],
        "some model turn checked": lambda r: r["outcomes"].get("ok") and not r["turns_checked"],
        "no sandbox or ledger entry outlives its job": lambda r: r["orphans"],
        "no process dead that should run": lambda r: r["dead"]}
    return [f"{name}: {check(result)}" for name, check in checks.items() if check(result)]


def report(result: dict[str, Any]) -> str:
    faults = ", ".join(f"{kind} {count}" for kind, count in sorted(result["faults"].items())) or "none"
    rows = [["seed", str(result["seed"])], ["minutes", f"{result['minutes']:g}"], ["faults", faults],
            ["jobs accepted / ended", f"{result['jobs']} / {result['ended']}"],
            ["outcomes", ", ".join(f"{k} {v}" for k, v in sorted(result["outcomes"].items(), key=str))],
            ["model turns checked token-exact", str(result["turns_checked"])],
            ["lost", str(len(result["lost"]))], ["orphans", str(len(result["orphans"]))],
            ["worst recovery", f"{result['worst_recovery_s'] or 0:.1f} s"]]
    problems = broken(result)
    lines = [f"bench.chaos ({machine_note(result)})", "", *markdown_table(["", ""], rows), ""]
    if problems:
        lines += [f"FAILED, seed {result['seed']}: replay with --seed {result['seed']}", *problems, "", "event log:"]
        lines += [f"  {e['at']:7.1f} s {e['kind']}: {e['detail']}" for e in result["events"]]
    else:
        lines.append("every invariant held")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None, help="default: a new one, printed")
    parser.add_argument("--every", type=float, default=20.0, help="mean seconds between faults")
    parser.add_argument("--in-flight", type=int, default=16, help="jobs kept running")
    parser.add_argument("--drain", type=float, default=240.0, help="seconds the last jobs get to end")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    print(f"bench.chaos: seed {seed}, {args.minutes:g} minutes, a fault every {args.every:g} s on average",
          flush=True)
    soak = Soak(seed, args.minutes, args.every, args.in_flight, args.drain,
                Path(tempfile.mkdtemp(prefix=f"prorl-chaos-{seed}-")))
    return run_benchmark(soak.run, report, RESULTS / f"chaos-{seed}.json", lambda result: not broken(result))


if __name__ == "__main__":
    raise SystemExit(main())
