"""Warm sandboxes: INIT and the first python call with a warm pool hit versus a miss, sandbox
start-to-ready on a miss, and a bash ``echo`` through the tool server versus a bare pty, in one run.

1. **INIT, hit vs miss** (issue 29's first two rows). Two clusters of the service, started the
   same way (``LocalCluster``: a gateway, one INIT thread, RUN, EVAL, a scripted LLM server),
   one with ``PRORL_WARM_POOL_SIZE`` (its INIT worker keeps ``dev+python`` sandboxes ready:
   kernel started) and one without. Math jobs with the python tool go through ``/process``,
   one at a time, alternating between the clusters, so that the machine's drift hits both;
   the pool's cluster waits before each job until its pool holds a ready sandbox (the bench
   measures a hit, and checks every one was). The LLM answers at once: a python tool call
   (``print(6 * 7)``), then the boxed answer. Reported per side from each job's record:
   INIT (``timing.init_s``: claim to hand-over, the sandbox start included), RUN (two LLM
   turns and the first python cell: the kernel's start on a miss), and the whole ``/process``.
2. **Start-to-ready on a miss**: ``runtime.start`` until the tool server answers ``ping``
   (bubblewrap, dev image, as a miss starts it), beside ``bwrap ... true``, ``bwrap ... python
   -S -c pass`` (the interpreter alone: the floor of any Python tool server) and the bare tool
   server with ``-S`` (``bench.sandbox``'s baselines), alternating.
3. **bash echo**: ``echo hi`` through the tool server in a bubblewrap sandbox versus the same
   command on a bare pty shell in this process (``bench.tools.BarePty``), and the server's
   ``ping`` (the socket hop without a shell), alternating batches: ping + bare pty is the floor
   of any server between the client and the shell.

    python -m bench.warm_pool [--jobs N] [--rounds N] [--echoes N]

Prints a table and writes ``bench/results/warm_pool.json``. Targets (issue 29): a hit's INIT
p50 <= 5 ms; start-to-ready p50 <= 50 ms; echo p50 <= 0.15 ms.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._cli import machine_note, markdown_table, run_benchmark
from bench.sandbox import bare_bwrap, logging_off, time_bare_toolserver, time_command, time_runtime
from bench.tools import BarePty
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from singularity.runtime import BubblewrapRuntime, SandboxSpec

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "warm_pool.json"
TARGET_HIT_INIT_P50_MS = 5.0
TARGET_READY_P50_MS = 50.0
TARGET_ECHO_P50_MS = 0.15
POOL_SIZE = 2


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


RULES = [
    {"match": "(?<![0-9])42(?![0-9])", "replies": ["The code printed 42, so the answer is \\boxed{42}."]},
    {"match": "WARMBENCH", "scope": "prompt",
     "replies": ["Let me compute it.\n" + tool_call("python", code="print(6 * 7)")]},
]


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 3),
            "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
            "mean_ms": round(statistics.fmean(ordered), 3), "min_ms": round(ordered[0], 3)}


# -- 1. INIT with and without the pool ------------------------------------------------------------

def start_cluster(name: str, pool: int, log_dir: Path, tokenizer: str, rules: Path) -> LocalCluster:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_RUNTIME": "bubblewrap", "PRORL_HEARTBEAT_S": "0.5", "PRORL_NODE": f"{name}-{os.getpid()}",
           "PRORL_SANDBOX_DIR": str(log_dir / "sandboxes"),
           "PRORL_WARM_POOL_SIZE": str(pool), "PRORL_WARM_POOL_IMAGES": "dev+python" if pool else ""}
    command = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer", tokenizer,
               "--port", "{port}", "--log-level", "warning"]
    cluster = LocalCluster(tokenizer=tokenizer, llm_command=command, env=env, gateway_workers=1,
                           concurrency={Stage.INIT: 1, Stage.RUN: 2, Stage.EVAL: 1}, log_dir=log_dir)
    cluster.start()
    return cluster


def warm_pool(client: httpx.Client) -> dict[str, Any]:
    return client.get("/status").json()["warm_pool"]


def one_job(client: httpx.Client, tag: str) -> dict[str, float]:
    instance = {"data_source": "math", "problem": f"WARMBENCH {tag}: multiply six by seven with python",
                "answer": "42", "tools": ["python"], "max_iterations": 3}
    started = time.perf_counter()
    response = client.post("/process", json={"instance": instance, "sampling_params": {"max_tokens": 64}})
    total = time.perf_counter() - started
    response.raise_for_status()
    result = response.json()
    if result["status"] != "completed" or result["reward"] != 1.0:
        raise RuntimeError(f"job {tag} did not complete with reward 1: {result['status']} {result.get('error')}")
    timing = result["timing"]
    return {"init": timing["init_s"] * 1000, "run": timing["run_s"] * 1000, "process": total * 1000}


def measure_init(jobs: int, log_dir: Path, tokenizer: str) -> dict[str, Any]:
    rules = log_dir / "rules.json"
    rules.write_text(json.dumps(RULES))
    clusters: dict[str, LocalCluster] = {}
    try:
        clusters["miss"] = start_cluster("miss", 0, log_dir / "miss", tokenizer, rules)
        clusters["hit"] = start_cluster("hit", POOL_SIZE, log_dir / "hit", tokenizer, rules)
        clients = {side: httpx.Client(base_url=c.gateway_url, timeout=120) for side, c in clusters.items()}
        samples: dict[str, dict[str, list[float]]] = {s: {"init": [], "run": [], "process": []} for s in clusters}
        for i in range(jobs + 1):  # the first of each side is a warm-up (imports, tokenizer, graders)
            for side, client in clients.items():
                if side == "hit":
                    deadline = time.monotonic() + 60
                    while warm_pool(client)["ready"] < 1:
                        if time.monotonic() > deadline:
                            raise RuntimeError("the warm pool did not refill within 60 s")
                        time.sleep(0.05)
                measured = one_job(client, f"{side}-{i}")
                if i:
                    for key, value in measured.items():
                        samples[side][key].append(value)
        # /status reads the pool's counts from the INIT worker's heartbeat: wait for the beat
        # that counts the last job (up to two heartbeats), or a missed take would go unseen
        deadline = time.monotonic() + 12
        while sum(warm_pool(clients["hit"])[k] for k in ("hits", "misses")) < jobs + 1 \
                and time.monotonic() < deadline:
            time.sleep(0.25)
        pools = {side: warm_pool(client) for side, client in clients.items()}
        workers = clients["hit"].get("/status").json()["workers"]
        pool_worker = next(w["warm_pool"] for w in workers if w.get("warm_pool"))
        for client in clients.values():
            client.close()
    finally:
        for cluster in clusters.values():
            cluster.stop()
    stats = {side: {key: summary(values) for key, values in by.items()} for side, by in samples.items()}
    return {"stats": stats, "pools": pools, "pool_worker": pool_worker,
            "ratio_init_p50": round(stats["miss"]["init"]["p50_ms"] / stats["hit"]["init"]["p50_ms"], 2),
            "ratio_run_p50": round(stats["miss"]["run"]["p50_ms"] / stats["hit"]["run"]["p50_ms"], 2),
            "every_hit_was_one": pools["hit"]["hits"] == jobs + 1 and pools["hit"]["misses"] == 0}


# -- 2. start-to-ready on a miss -------------------------------------------------------------------

def measure_ready(rounds: int, workdir: Path) -> dict[str, Any]:
    logging_off()
    runtime = BubblewrapRuntime(state_dir=workdir / "state")
    spec = SandboxSpec(image="dev", workspace=workdir / "ws")
    true, python = bare_bwrap(["true"]), bare_bwrap([sys.executable, "-S", "-c", "pass"])
    # the two libraries any asyncio tool server with a typed protocol imports, and nothing else
    imports = bare_bwrap([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {site_dirs()!r}; "
                          "import asyncio, msgspec"])
    samples: dict[str, list[float]] = {"bwrap_true": [], "bwrap_python_S": [], "bwrap_asyncio_msgspec_S": [],
                                       "toolserver_bare_S": [], "bubblewrap": []}
    asyncio.run(time_runtime(runtime, spec))  # warm-up: page cache, imports
    for _ in range(rounds):
        samples["bwrap_true"].append(time_command(true))
        samples["bwrap_python_S"].append(time_command(python))
        samples["bwrap_asyncio_msgspec_S"].append(time_command(imports))
        samples["toolserver_bare_S"].append(asyncio.run(time_bare_toolserver(workdir, no_site=True)))
        samples["bubblewrap"].append(asyncio.run(time_runtime(runtime, spec))[0])
    stats = {name: summary(values) for name, values in samples.items()}
    return {"stats": stats, "ratio_bubblewrap_over_bwrap_true": round(
        stats["bubblewrap"]["p50_ms"] / stats["bwrap_true"]["p50_ms"], 2)}


def site_dirs() -> list[str]:
    import site
    return site.getsitepackages()


# -- 3. bash echo ----------------------------------------------------------------------------------

def measure_echo(echoes: int, workdir: Path, batch: int = 50) -> dict[str, Any]:
    workspace = workdir / "echo-ws"
    workspace.mkdir(parents=True, exist_ok=True)
    bare = BarePty(workspace)
    try:
        samples = asyncio.run(_echo(echoes, batch, workdir, bare))
    finally:
        bare.close()
    stats = {name: summary(values) for name, values in samples.items()}
    floor = stats["toolserver_ping"]["p50_ms"] + stats["bare_pty"]["p50_ms"]
    return {"stats": stats, "ratio_toolserver_over_bare_pty": round(
        stats["toolserver"]["p50_ms"] / stats["bare_pty"]["p50_ms"], 2),
        "floor_p50_ms": round(floor, 3), "ratio_toolserver_over_floor": round(stats["toolserver"]["p50_ms"] / floor, 2)}


async def _echo(echoes: int, batch: int, workdir: Path, bare: BarePty) -> dict[str, list[float]]:
    runtime = BubblewrapRuntime(state_dir=workdir / "echo-state")
    samples: dict[str, list[float]] = {"toolserver": [], "bare_pty": [], "toolserver_ping": []}
    async with await runtime.start(SandboxSpec(image="dev", workspace=workdir / "echo-sandbox")) as sandbox:
        async with sandbox.client() as tools:
            for _ in range(20):  # warm-up
                await tools.bash("echo hi")
                bare.execute("echo hi")
            for _ in range(0, echoes, batch):
                for _ in range(batch):
                    started = time.perf_counter()
                    await tools.bash("echo hi")
                    samples["toolserver"].append((time.perf_counter() - started) * 1000)
                for _ in range(batch):
                    started = time.perf_counter()
                    bare.execute("echo hi")
                    samples["bare_pty"].append((time.perf_counter() - started) * 1000)
                for _ in range(batch):  # the socket hop alone: no shell
                    started = time.perf_counter()
                    await tools.ping()
                    samples["toolserver_ping"].append((time.perf_counter() - started) * 1000)
    return samples


# -- the run ---------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> dict[str, Any]:
    from prorl_celery.dev.devmodels import ensure_tokenizer
    log_dir = Path(tempfile.mkdtemp(prefix="bench-warm-pool-"))
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "log_dir": str(log_dir),
                              "plan": {"jobs": args.jobs, "rounds": args.rounds, "echoes": args.echoes,
                                       "pool_size": POOL_SIZE},
                              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                          "loadavg_before": os.getloadavg()}}
    result["init"] = measure_init(args.jobs, log_dir, str(ensure_tokenizer("qwen3")))
    result["ready"] = measure_ready(args.rounds, log_dir / "ready")
    result["echo"] = measure_echo(args.echoes, log_dir / "echo")
    result["targets"] = targets(result)
    return result


def targets(result: dict[str, Any]) -> dict[str, bool]:
    init, ready, echo = result["init"]["stats"], result["ready"]["stats"], result["echo"]["stats"]
    return {f"hit INIT p50 <= {TARGET_HIT_INIT_P50_MS:g} ms": init["hit"]["init"]["p50_ms"] <= TARGET_HIT_INIT_P50_MS,
            "every pooled job was a hit": result["init"]["every_hit_was_one"],
            f"start-to-ready p50 <= {TARGET_READY_P50_MS:g} ms": ready["bubblewrap"]["p50_ms"] <= TARGET_READY_P50_MS,
            f"echo p50 <= {TARGET_ECHO_P50_MS:g} ms": echo["toolserver"]["p50_ms"] <= TARGET_ECHO_P50_MS}


def report(result: dict[str, Any]) -> str:
    init, ready, echo = result["init"], result["ready"]["stats"], result["echo"]["stats"]
    hit, miss = init["stats"]["hit"], init["stats"]["miss"]

    def ms(stats: dict[str, float]) -> str:
        return f"{stats['p50_ms']:.2f} (p90 {stats['p90_ms']:.2f})"
    rows = [
        ["INIT p50, python-tool math job", ms(miss["init"]), ms(hit["init"]), f"{init['ratio_init_p50']:.1f}x"],
        ["RUN p50 (2 instant LLM turns + first python cell)", ms(miss["run"]), ms(hit["run"]),
         f"{init['ratio_run_p50']:.1f}x"],
        ["whole /process p50", ms(miss["process"]), ms(hit["process"]),
         f"{miss['process']['p50_ms'] / hit['process']['p50_ms']:.1f}x"],
    ]
    lines = [f"# bench.warm_pool {result['date']} ({machine_note(result)}; {result['plan']['jobs']} jobs per side)", "",
             *markdown_table(["ms", "miss (no pool)", "warm pool hit", "miss / hit"], rows), "",
             f"pool: {init['pool_worker']['ready']} ready of {POOL_SIZE}, hits {init['pools']['hit']['hits']}, "
             f"misses {init['pools']['hit']['misses']}, refill p50 {init['pool_worker']['refill_s_p50']} s, "
             f"{init['pool_worker']['rss_mb']} MB held", "",
             *markdown_table(["start-to-ready, ms", "p50", "p90"],
                             [[name, f"{s['p50_ms']:.2f}", f"{s['p90_ms']:.2f}"] for name, s in ready.items()]), "",
             *markdown_table(["bash `echo hi`, ms", "p50", "p90"],
                             [[name, f"{s['p50_ms']:.3f}", f"{s['p90_ms']:.3f}"] for name, s in echo.items()]), "",
             f"echo: tool server / bare pty {result['echo']['ratio_toolserver_over_bare_pty']:.2f}x, "
             f"/ (ping + bare pty = {result['echo']['floor_p50_ms']:.3f} ms) "
             f"{result['echo']['ratio_toolserver_over_floor']:.2f}x; "
             f"start: bubblewrap / bwrap true {result['ready']['ratio_bubblewrap_over_bwrap_true']:.1f}x", ""]
    lines += [f"- {'met' if ok else 'MISSED'}: {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="measured jobs per side (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=20, help="sandbox starts per side")
    parser.add_argument("--echoes", type=int, default=1000, help="echo calls per side")
    args = parser.parse_args(argv)
    return run_benchmark(lambda: run(args), report, RESULTS, lambda r: all(r["targets"].values()))


if __name__ == "__main__":
    sys.exit(main())
