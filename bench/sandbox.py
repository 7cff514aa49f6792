"""Sandbox start-to-ready time: bubblewrap versus baselines measured in the same run.

Start-to-ready is the time from ``runtime.start(spec)`` until the tool server inside answers
``ping`` on its Unix socket (so it includes spawning bwrap, the namespaces, the mounts, the
user-namespace handshake, the Python start-up and the tool server's imports). Baselines, in
alternating rounds so that machine drift hits every side alike:

* ``bwrap_true``: a bare ``bwrap --unshare-all ... true`` (the namespaces and mounts alone);
* ``bwrap_python``: the same with ``python -c pass`` (adds the interpreter's start-up);
* ``toolserver_bare``: the tool server as a plain child process (no runtime at all);
* ``toolserver_bare_S``: the same with ``python -S`` and site-packages on PYTHONPATH, as the
  runtimes start it when the image knows its site-packages;
* ``process``: the plain-process runtime's start-to-ready (adds its subreaper and bookkeeping);
* ``bubblewrap``: the real thing, dev image, default limits;

and ``bubblewrap_stop``: the time :meth:`Runtime.stop` takes (SIGTERM, /proc checks).

    python -m bench.sandbox [--rounds N] [--quick]

Prints a table and writes ``bench/results/sandbox.json``. Target: bubblewrap p50 <= 100 ms.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from singularity.runtime import BubblewrapRuntime, ProcessRuntime, Runtime, SandboxSpec
from singularity.runtime.layout import python_prefixes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "sandbox.json"
TARGET_P50_MS = 100.0


def bare_bwrap(command: list[str]) -> list[str]:
    """bwrap with the runtime's namespaces and a minimal read-only root, running ``command``.

    The interpreter's installations (base prefix and a virtualenv's) are bound as the dev image
    binds them, after the fresh ``/tmp``, so a virtualenv under ``/tmp`` is not hidden by it."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for name in ("bin", "sbin", "lib", "lib64"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
    for prefix in python_prefixes():
        args += ["--ro-bind", prefix, prefix]
    return args + ["--", *command]


def time_command(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {done.returncode}: {done.stderr.strip()}\n{argv}")
    return elapsed


async def time_runtime(runtime: Runtime, spec: SandboxSpec) -> tuple[float, float]:
    """(start-to-ready ms, stop ms) for one sandbox."""
    started = time.perf_counter()
    sandbox = await runtime.start(spec)
    async with sandbox.client() as client:
        await client.ping()
    ready = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    await sandbox.stop()
    return ready, (time.perf_counter() - started) * 1000


async def time_bare_toolserver(workdir: Path, no_site: bool = False) -> float:
    """The tool server alone: plain child process, no runtime, no sandbox (ms to first pong);
    ``no_site``: started with ``python -S`` as the runtimes start it."""
    from singularity.toolserver.client import ToolClient
    from singularity.toolserver.launch import command, environment

    socket_path = workdir / "bare.sock"
    socket_path.unlink(missing_ok=True)
    started = time.perf_counter()
    process = subprocess.Popen(command(socket_path, workdir, no_site=no_site), stdout=subprocess.PIPE,
                               cwd=ROOT, env=environment(no_site=no_site))
    try:
        while not process.stdout.readline().startswith(b"READY"):
            pass
        async with ToolClient(socket_path) as client:
            await client.ping()
        return (time.perf_counter() - started) * 1000
    finally:
        process.terminate()
        process.wait()


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
            "mean_ms": round(statistics.fmean(ordered), 2), "min_ms": round(ordered[0], 2)}


def measure(rounds: int, workdir: Path) -> dict[str, list[float]]:
    bubblewrap, process = BubblewrapRuntime(), ProcessRuntime()
    logging_off()
    spec = SandboxSpec(image="dev", workspace=workdir / "ws")
    samples: dict[str, list[float]] = {k: [] for k in
                                       ("bwrap_true", "bwrap_python", "toolserver_bare", "toolserver_bare_S",
                                        "process", "bubblewrap", "bubblewrap_stop")}
    true, python = bare_bwrap(["true"]), bare_bwrap([sys.executable, "-c", "pass"])
    for runtime in (bubblewrap, process):  # warm-up: page cache, imports
        asyncio.run(time_runtime(runtime, spec))
    for _ in range(rounds):
        samples["bwrap_true"].append(time_command(true))
        samples["bwrap_python"].append(time_command(python))
        samples["toolserver_bare"].append(asyncio.run(time_bare_toolserver(workdir)))
        samples["toolserver_bare_S"].append(asyncio.run(time_bare_toolserver(workdir, no_site=True)))
        samples["process"].append(asyncio.run(time_runtime(process, spec))[0])
        ready, stopped = asyncio.run(time_runtime(bubblewrap, spec))
        samples["bubblewrap"].append(ready)
        samples["bubblewrap_stop"].append(stopped)
    return samples


def logging_off() -> None:
    import logging
    logging.getLogger("singularity.runtime.process").setLevel(logging.ERROR)  # its warning per start


def report(samples: dict[str, list[float]]) -> dict:
    stats = {name: summary(values) for name, values in samples.items()}
    p50 = {name: s["p50_ms"] for name, s in stats.items()}
    return {
        "what": "sandbox start-to-ready (spawn until the tool server answers ping), ms",
        "stats": stats,
        "ratios_p50": {
            "bubblewrap_over_toolserver_bare": round(p50["bubblewrap"] / p50["toolserver_bare"], 3),
            "bubblewrap_minus_toolserver_bare_S_ms": round(p50["bubblewrap"] - p50["toolserver_bare_S"], 2),
            "toolserver_bare_over_bare_S": round(p50["toolserver_bare"] / p50["toolserver_bare_S"], 3),
            "bubblewrap_over_process": round(p50["bubblewrap"] / p50["process"], 3),
            "bwrap_true_share_of_bubblewrap": round(p50["bwrap_true"] / p50["bubblewrap"], 3),
        },
        "target_p50_ms": TARGET_P50_MS,
        "meets_target": p50["bubblewrap"] <= TARGET_P50_MS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release(), "euid": os.geteuid(),
                    "bwrap": subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="10 rounds")
    args = parser.parse_args(argv)
    if shutil.which("bwrap") is None:
        print("bwrap is not installed (apt-get install bubblewrap)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="prorl-bench-") as workdir:
        result = report(measure(10 if args.quick else args.rounds, Path(workdir)))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':18}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}")
    for name, s in result["stats"].items():
        print(f"{name:18}{s['p50_ms']:9.1f}{s['p95_ms']:9.1f}{s['mean_ms']:9.1f}")
    ratios = result["ratios_p50"]
    print(f"bubblewrap / bare tool server p50: {ratios['bubblewrap_over_toolserver_bare']:.2f}x; the sandbox "
          f"costs {ratios['bubblewrap_minus_toolserver_bare_S_ms']:+.1f} ms over the bare server started like it "
          f"(python -S); -S saves {ratios['toolserver_bare_over_bare_S']:.2f}x; target p50 <= "
          f"{TARGET_P50_MS:.0f} ms: {'met' if result['meets_target'] else 'NOT met'}")
    print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
