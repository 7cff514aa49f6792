"""Start-up footprint of the service's processes: import time and idle memory.

For each source tree given (default: this one; ``--tree DIR`` adds another, e.g. an exported
older commit, put first on ``PYTHONPATH``), interleaved over ``--repeat`` rounds:

- import time of ``prorl_celery.worker.tasks`` (what a worker imports) in a fresh interpreter, and
  whether ``transformers``/``torch`` got imported;
- idle RSS of a RUN worker (``celery -A prorl_celery worker -Q run -c C``) once it is ready and
  has preloaded the tokenizer, and of a one-process gateway (gunicorn master + worker).

    python -m bench.footprint
    git archive HEAD~3 | tar -x -C /tmp/old && python -m bench.footprint --tree /tmp/old

Prints a table and writes ``bench/results/footprint.json``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from bench._cli import run_benchmark
from bench.burst import group_rss_mb
from prorl_celery.dev.local import ManagedProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "footprint.json"
TARGET_RUN_RSS_MB = 150.0
IMPORT_CODE = ("import sys, time; t = time.perf_counter(); import prorl_celery.worker.tasks; "
               "print(time.perf_counter() - t, int('transformers' in sys.modules), int('torch' in sys.modules))")


def tree_env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}


def import_time(tree: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", IMPORT_CODE], capture_output=True, text=True, check=True,
                         env=tree_env(tree, {}), cwd=tree, timeout=300).stdout.split()
    return {"import_s": float(out[0]), "transformers": bool(int(out[1])), "torch": bool(int(out[2]))}


def spawn(name: str, command: list[str], env: dict[str, str], cwd: Path, log_dir: Path) -> ManagedProcess:
    log_path = log_dir / f"{name}-{time.time_ns()}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 cwd=cwd, start_new_session=True)
    return ManagedProcess(name, popen, log_path)


def idle_rss(tree: Path, redis_url: str, tokenizer: str, concurrency: int, log_dir: Path) -> dict[str, float]:
    env = tree_env(tree, {"PRORL_REDIS_URL": f"{redis_url}/1", "PRORL_BROKER_URL": f"{redis_url}/0",
                          "PRORL_TOKENIZER": tokenizer})
    port = free_port()
    worker = spawn("run", [sys.executable, "-m", "celery", "-A", "prorl_celery", "worker", "-Q", "run", "-c",
                           str(concurrency), "-n", f"fp-{port}@%h", "--without-gossip", "--without-mingle", "-l",
                           "info"], env, tree, log_dir)
    gateway = spawn("gateway", [sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "-w", "1", "-b",
                                f"127.0.0.1:{port}", "api:create_app()"], env, tree, log_dir)
    try:
        started = time.perf_counter()
        wait_until(lambda: "ready." in worker.log_path.read_text(errors="replace"), 120, "RUN worker", worker)
        ready_s = time.perf_counter() - started
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200, 120, "gateway", gateway)
        time.sleep(3.0)  # the tokenizer preload runs on the heartbeat thread once ready
        return {"run_rss_mb": group_rss_mb(worker), "gateway_rss_mb": group_rss_mb(gateway), "run_ready_s": ready_s}
    finally:
        worker.stop()
        gateway.stop()


def run(trees: list[Path], repeat: int, concurrency: int) -> dict[str, Any]:
    from prorl_celery.dev.devmodels import ensure_tokenizer

    log_dir = Path(tempfile.mkdtemp(prefix="prorl-footprint-"))
    tokenizer = str(ensure_tokenizer("qwen3"))
    rows: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    port = free_port()
    redis_server = spawn("redis", [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                                   "127.0.0.1", "--save", "", "--appendonly", "no"], dict(os.environ), ROOT, log_dir)
    base = f"redis://127.0.0.1:{port}"
    try:
        wait_until(lambda: redis.Redis.from_url(base).ping(), 20, "redis-server", redis_server)
        for round_ in range(repeat):
            for tree in (trees if round_ % 2 == 0 else trees[::-1]):
                row = {**import_time(tree), **idle_rss(tree, base, tokenizer, concurrency, log_dir)}
                rows[str(tree)].append(row)
                print(f"  {tree}: import {row['import_s']:.2f} s, RUN worker {row['run_rss_mb']:.0f} MB, "
                      f"gateway {row['gateway_rss_mb']:.0f} MB, torch {row['torch']}", file=sys.stderr, flush=True)
    finally:
        redis_server.stop()
    summary = {}
    for tree, measured in rows.items():
        summary[tree] = {key: statistics.median(r[key] for r in measured)
                         for key in ("import_s", "run_rss_mb", "gateway_rss_mb", "run_ready_s")}
        summary[tree]["torch"] = any(r["torch"] for r in measured)
        summary[tree]["transformers"] = any(r["transformers"] for r in measured)
    return {"benchmark": "footprint", "concurrency": concurrency, "repeat": repeat, "rows": rows, "summary": summary,
            "log_dir": str(log_dir), "loadavg": os.getloadavg()}


def report(result: dict[str, Any]) -> str:
    lines = [f"RUN worker -c {result['concurrency']}, medians of {result['repeat']} (load {result['loadavg'][0]:.1f})",
             "", "| tree | import prorl_celery.worker.tasks | torch imported | RUN worker idle RSS | ready after "
             "| gateway idle RSS (1 worker) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for tree, s in result["summary"].items():
        lines.append(f"| {tree} | {s['import_s']:.2f} s | {'yes' if s['torch'] else 'no'} | {s['run_rss_mb']:.0f} MB | "
                     f"{s['run_ready_s']:.1f} s | {s['gateway_rss_mb']:.0f} MB |")
    return "\n".join(lines)


def passed(result: dict[str, Any]) -> bool:
    return result["summary"][str(ROOT)]["run_rss_mb"] <= TARGET_RUN_RSS_MB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="another source tree to measure beside this one")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64, help="RUN worker -c (default %(default)s)")
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.tree] + [ROOT]
    return run_benchmark(lambda: run(trees, args.repeat, args.concurrency), report, RESULTS, passed)


if __name__ == "__main__":
    sys.exit(main())
