"""The tool server's latency, side by side with the usual alternatives, in one run.

Measurements (one function each, registered in :data:`MEASUREMENTS`; add a function to extend):

* ``bash_vs_tmux``: a bash action through the tool server (Unix socket, persistent pty shell)
  versus a tmux-driven shell, the way several agent frameworks drive one: ``tmux send-keys``
  the command plus ``; echo <sentinel>$?``, then poll ``tmux capture-pane -p`` until the sentinel
  shows. ``echo hi`` and ``ls``, in alternating batches. Targets: tool server >= 20x faster
  than tmux, and p50 <= 1 ms for ``echo``.
* ``unix_vs_tcp``: the same server listening on both; ``ping`` and ``bash echo`` over each.
* ``ipython_inproc_vs_zmq``: a trivial cell (``1 + 1``) through the tool server's in-process
  kernel versus a separate-process kernel driven over ZMQ by ``jupyter_client``
  (``KernelManager`` + ``execute_interactive``), plus each kernel's start-up time.
* ``startup``: tool server process spawn until its READY line, and until the first ``ping``
  answers (a fresh client each time), next to ``python -c pass``. Target: ready p50 <= 100 ms.
  (The sandbox start-to-ready time under bubblewrap belongs to the runtime benchmarks.)

    python -m bench.tools [--quick] [--only NAME ...] [--iterations N]

Prints a table and writes ``bench/results/tools.json``. Exit status 0 when every target holds,
1 otherwise. Absolute numbers move with the machine's load; the ratios move far less.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prorl_celery.core.event_loops import new_event_loop
from singularity.runtime import BubblewrapRuntime, SandboxSpec
from singularity.toolserver.client import ToolClient
from singularity.toolserver.launch import LocalToolServer, command, environment

RESULTS = Path(__file__).resolve().parent / "results" / "tools.json"
TARGET_TMUX_RATIO = 20.0
TARGET_ECHO_P50_MS = 1.0
TARGET_READY_P50_MS = 100.0


@dataclass
class Context:
    tmp: Path
    iterations: int  # per side and command
    batch: int  # alternate sides every this many actions
    startups: int  # server starts for the start-up measurement
    slow_polls: int  # tmux actions with OpenHands' 0.5 s polling

    def workspace(self) -> Path:
        path = self.tmp / "workspace"
        if not path.exists():
            path.mkdir()
            for i in range(20):
                (path / f"file_{i:02d}.txt").write_text("x" * i)
        return path

    def start_server(self, name: str, **options) -> LocalToolServer:
        log = open(self.tmp / f"{name}.log", "ab")
        return LocalToolServer.start(
            self.tmp / f"{name}.sock", self.workspace(), stderr=log, **options
        )


def stats(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": _quantile(ms, 0.50),
        "p95_ms": _quantile(ms, 0.95),
        "mean_ms": statistics.fmean(ms),
        "min_ms": ms[0],
    }


def _quantile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, round(q * (len(sorted_ms) - 1)))]


def ratio(slow: dict, fast: dict, key: str = "p50_ms") -> float:
    return slow[key] / fast[key] if fast[key] else float("inf")


def run_client(coro):
    """Run the client side on the event loop a worker's stages run on (uvloop's when present)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


async def timed(fn: Callable, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - started)
    return samples


# -- (1) bash through the tool server vs a tmux shell -------------------------------------------


class TmuxShell:
    """A bash in a private tmux server, driven with send-keys and polled with capture-pane.

    ``poll_interval_s=0`` polls as fast as tmux answers: the best any tmux driver can do.
    OpenHands' terminal tool sleeps 0.5 s between polls (``POLL_INTERVAL``).
    """

    def __init__(self, workspace: Path, poll_interval_s: float = 0.0) -> None:
        self.tmux = shutil.which("tmux")
        if self.tmux is None:
            raise RuntimeError("tmux is not installed (apt-get install tmux)")
        self.poll_interval_s = poll_interval_s
        self.socket = f"bench-{uuid.uuid4().hex[:8]}"
        shell = "env PS1='$ ' bash --noprofile --norc"
        self._run(
            *"-f /dev/null new-session -d -s bench -x 200 -y 50 -c".split(), str(workspace), shell
        )
        self._count = 0

    def _run(self, *args: str) -> str:
        argv = [self.tmux, "-L", self.socket, *args]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    def execute(self, cmd: str, timeout_s: float = 30.0) -> str:
        self._count += 1
        token = f"__DONE_{self._count}_"
        sentinel = re.compile(re.escape(token) + r"(\d+)__")  # the typed line has "$?", not digits
        self._run("send-keys", "-t", "bench", f"{cmd}; echo {token}$?__", "Enter")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(self.poll_interval_s)  # a poller gives the command time before looking
            screen = self._run("capture-pane", "-p", "-t", "bench")
            if sentinel.search(screen):
                return screen
        raise TimeoutError(f"tmux: no sentinel for {cmd!r}")

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True)


class BarePty:
    """The command's own cost: a bash on a pty driven directly (no server, no protocol)."""

    def __init__(self, workspace: Path) -> None:
        from ptyprocess import PtyProcess

        env = dict(
            os.environ, PS1="", TERM="dumb", PROMPT_COMMAND='printf "\\n__BARE_%s__\\n" "$?"'
        )
        argv = ["/bin/bash", "--noprofile", "--norc", "--noediting", "-i"]
        self.process = PtyProcess.spawn(argv, cwd=str(workspace), env=env, echo=False)
        self.sentinel = re.compile(rb"\n__BARE_(\d+)__\r?\n")
        self._until_prompt()
        self.execute("set +m")

    def execute(self, cmd: str) -> None:
        os.write(self.process.fd, cmd.encode() + b"\n")
        self._until_prompt()

    def _until_prompt(self) -> None:
        seen = b""
        while not self.sentinel.search(seen):
            seen = seen[-64:] + os.read(self.process.fd, 65536)

    def close(self) -> None:
        self.process.terminate(force=True)


def measure_bash_vs_tmux(ctx: Context) -> dict:
    tmux, bare = TmuxShell(ctx.workspace()), BarePty(ctx.workspace())
    try:
        result = run_client(_bash_vs_tmux_in_sandbox(ctx, tmux, bare))
        tmux.poll_interval_s = 0.5
        slow = [_timed_sync(lambda: tmux.execute("echo hi")) for _ in range(ctx.slow_polls)]
        result["echo hi"]["tmux_poll_0.5s"] = stats(slow)
    finally:
        tmux.close()
        bare.close()
    echo = result["echo hi"]
    echo["ratio_p50_poll_0.5s"] = ratio(echo["tmux_poll_0.5s"], echo["toolserver"])
    result["targets"] = {
        f"bash 'echo' through the tool server >= {TARGET_TMUX_RATIO:g}x faster than tmux (p50)": (
            echo["ratio_p50"] >= TARGET_TMUX_RATIO
        ),
        f"tool server echo p50 <= {TARGET_ECHO_P50_MS:g} ms": (
            echo["toolserver"]["p50_ms"] <= TARGET_ECHO_P50_MS
        ),
    }
    return result


def _timed_sync(fn: Callable) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


async def _bash_vs_tmux_in_sandbox(ctx: Context, tmux: TmuxShell, bare: BarePty) -> dict:
    """The tool server in a bubblewrap sandbox (dev image), as workers run it; a plain child
    process where bubblewrap cannot run (``result["where"]`` says which)."""
    runtime = BubblewrapRuntime(state_dir=ctx.tmp / "sandboxes")
    if not runtime.available():
        server = ctx.start_server("bash")
        try:
            result = await _bash_vs_tmux(ctx, ToolClient(server.socket), tmux, bare)
        finally:
            server.stop()
        return {"where": "plain process (bubblewrap unavailable)", **result}
    spec = SandboxSpec(image="dev", workspace=ctx.tmp / "sandbox-workspace")
    async with await runtime.start(spec) as sandbox:
        result = await _bash_vs_tmux(ctx, sandbox.client(), tmux, bare)
    return {"where": "bubblewrap sandbox", **result}


async def _bash_vs_tmux(ctx: Context, client: ToolClient, tmux: TmuxShell, bare: BarePty) -> dict:
    result = {}
    async with client as tools:
        for cmd in ("echo hi", "ls"):

            async def through_tmux(cmd: str = cmd) -> None:  # bound now: ruff B023
                tmux.execute(cmd)

            async def on_bare_pty(cmd: str = cmd) -> None:
                bare.execute(cmd)

            sides = {"toolserver": [], "tmux": [], "bare_pty": []}
            calls = {
                "toolserver": lambda cmd=cmd: tools.bash(cmd),
                "tmux": through_tmux,
                "bare_pty": on_bare_pty,
            }
            for call in calls.values():
                await timed(call, 10)  # warm-up
            for _ in range(0, ctx.iterations, ctx.batch):
                for side, call in calls.items():
                    sides[side] += await timed(call, ctx.batch)
            row = result[cmd] = {side: stats(samples) for side, samples in sides.items()}
            row["ratio_p50"] = ratio(row["tmux"], row["toolserver"])
            row["ratio_p95"] = ratio(row["tmux"], row["toolserver"], "p95_ms")
            # what each adds on top of the command's own cost (the bare pty)
            ours = max(row["toolserver"]["p50_ms"] - row["bare_pty"]["p50_ms"], 1e-3)
            theirs = row["tmux"]["p50_ms"] - row["bare_pty"]["p50_ms"]
            row["overhead_p50_ms"] = {"toolserver": ours, "tmux": theirs}
            row["overhead_ratio_p50"] = theirs / ours
    return result


# -- (2) Unix socket vs TCP loopback -----------------------------------------------------------


def measure_unix_vs_tcp(ctx: Context) -> dict:
    server = ctx.start_server("transport", tcp="127.0.0.1:0")
    try:
        return run_client(_unix_vs_tcp(ctx, server))
    finally:
        server.stop()


async def _unix_vs_tcp(ctx: Context, server: LocalToolServer) -> dict:
    result = {}
    async with ToolClient(server.socket) as unix, ToolClient(tcp=server.tcp) as tcp:
        for name, action in (
            ("ping", lambda c: c.ping()),
            ("bash echo", lambda c: c.bash("echo hi")),
        ):
            samples = {"unix": [], "tcp": []}
            for client in (unix, tcp):
                await timed(lambda action=action, client=client: action(client), 50)  # warm-up
            for _ in range(0, ctx.iterations, ctx.batch):
                samples["unix"] += await timed(lambda action=action: action(unix), ctx.batch)
                samples["tcp"] += await timed(lambda action=action: action(tcp), ctx.batch)
            result[name] = {side: stats(s) for side, s in samples.items()}
            result[name]["ratio_p50_tcp_over_unix"] = ratio(
                result[name]["tcp"], result[name]["unix"]
            )
    return result


# -- (3) in-process kernel vs a ZMQ kernel -----------------------------------------------------


def measure_ipython_inproc_vs_zmq(ctx: Context) -> dict:
    from jupyter_client.manager import KernelManager

    server = ctx.start_server("ipython", lazy_shell=True)
    # ZMQ over ipc (Unix sockets), like the tool server; TCP would also warn about encryption
    manager = KernelManager(kernel_name="python3", transport="ipc", ip=str(ctx.tmp / "kernel"))
    try:
        started = time.perf_counter()
        manager.start_kernel()
        client = manager.blocking_client()
        client.start_channels()
        client.wait_for_ready(timeout=120)
        zmq_start = time.perf_counter() - started
        result = run_client(_ipython(ctx, server, client))
        result["kernel_start_ms"]["zmq"] = zmq_start * 1000
    finally:
        manager.shutdown_kernel(now=True)
        server.stop()
    result["ratio_p50_zmq_over_inproc"] = ratio(result["cell"]["zmq"], result["cell"]["inproc"])
    return result


async def _ipython(ctx: Context, server: LocalToolServer, zmq_client) -> dict:
    def zmq_cell():
        reply = zmq_client.execute_interactive("1 + 1", timeout=30, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"

    async with ToolClient(server.socket) as tools:
        started = time.perf_counter()
        await tools.ipython("0", timeout_s=120)
        inproc_start = time.perf_counter() - started
        inproc, zmq = [], []
        await timed(lambda: tools.ipython("1 + 1"), 20)
        for _ in range(20):
            zmq_cell()
        for _ in range(0, ctx.iterations, ctx.batch):
            inproc += await timed(lambda: tools.ipython("1 + 1"), ctx.batch)
            zmq += await timed(lambda: asyncio.to_thread(zmq_cell), ctx.batch)
    return {
        "cell": {"inproc": stats(inproc), "zmq": stats(zmq)},
        "kernel_start_ms": {"inproc_first_call": inproc_start * 1000},
    }


# -- (4) start-to-ready --------------------------------------------------------------------------


def measure_startup(ctx: Context) -> dict:
    """Spawn -> READY, -> first ping, -> first ``bash echo`` (the shell is started right after
    READY), plain ``python -m`` and with ``-S`` (no site).

    Also the CPU time the server process (all its threads) had used by the first ping: wall
    time on a loaded machine is mostly waiting for a core, CPU time is what start-up costs.
    """
    names = ("ready_line", "first_ping", "first_bash", "cpu_to_first_ping")
    samples: dict[str, list[float]] = {"python_c_pass": []}
    for name in names:
        samples[name], samples[name + "_no_site"] = [], []
    for i in range(ctx.startups):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples["python_c_pass"].append(time.perf_counter() - started)
        for suffix, no_site in (("", False), ("_no_site", True)):
            for name, value in zip(names, _start_once(ctx, f"{i}{suffix}", no_site)):
                samples[name + suffix].append(value)
    result = {name: stats(s) for name, s in samples.items()}
    result["command"] = command("<socket>", "<workspace>")
    best = min(result["first_ping"]["p50_ms"], result["first_ping_no_site"]["p50_ms"])
    result["targets"] = {
        f"tool server ready p50 <= {TARGET_READY_P50_MS:g} ms (spawn to first ping)": (
            best <= TARGET_READY_P50_MS
        )
    }
    return result


def _start_once(ctx: Context, name: str, no_site: bool) -> tuple[float, ...]:
    socket = ctx.tmp / f"start-{name}.sock"
    started = time.perf_counter()
    process = subprocess.Popen(
        command(socket, ctx.workspace(), no_site=no_site),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=environment(no_site=no_site),
    )
    try:
        line = process.stdout.readline()
        ready = time.perf_counter() - started
        assert line.startswith(b"READY"), line
        pinged, cpu, bashed = run_client(_first_calls(socket, started, process.pid))
        return ready, pinged, bashed, cpu
    finally:
        process.terminate()
        process.wait(30)
        process.stdout.close()


async def _first_calls(socket: Path, started: float, pid: int) -> tuple[float, float, float]:
    async with ToolClient(socket) as tools:
        await tools.ping()
        pinged, cpu = time.perf_counter() - started, cpu_seconds(pid)
        await tools.bash("echo ready")
        return pinged, cpu, time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by every thread of ``pid`` (from /proc/<pid>/task/*/schedstat)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total_ns / 1e9


MEASUREMENTS: dict[str, Callable[[Context], dict]] = {
    "bash_vs_tmux": measure_bash_vs_tmux,
    "unix_vs_tcp": measure_unix_vs_tcp,
    "ipython_inproc_vs_zmq": measure_ipython_inproc_vs_zmq,
    "startup": measure_startup,
}


# -- report ------------------------------------------------------------------------------------


def report(results: dict) -> str:
    lines = [f"{'measurement':42s} {'p50 ms':>9s} {'p95 ms':>9s}   ratio"]

    def row(label: str, s: dict, note: str = "") -> None:
        lines.append(f"{label:42s} {s['p50_ms']:9.3f} {s['p95_ms']:9.3f}   {note}")

    if "where" in results.get("bash_vs_tmux", {}):
        lines.append(f"(bash: the tool server runs in a {results['bash_vs_tmux']['where']})")
    for cmd, r in results.get("bash_vs_tmux", {}).items():
        if cmd not in ("targets", "where"):
            row(f"bash '{cmd}' tool server", r["toolserver"])
            row(
                f"bash '{cmd}' tmux",
                r["tmux"],
                f"tmux/toolserver {r['ratio_p50']:.1f}x (p95 {r['ratio_p95']:.1f}x)",
            )
            row(f"bash '{cmd}' bare pty (no server)", r["bare_pty"])
            over = r["overhead_p50_ms"]
            lines.append(
                f"{'  overhead over the bare pty, p50 ms':42s} {over['toolserver']:9.3f} "
                f"{over['tmux']:9.3f}   tmux/toolserver {r['overhead_ratio_p50']:.1f}x"
            )
            if "tmux_poll_0.5s" in r:
                note = f"tmux/toolserver {r['ratio_p50_poll_0.5s']:.0f}x"
                row(f"bash '{cmd}' tmux, 0.5 s polling", r["tmux_poll_0.5s"], note)
    for name, r in results.get("unix_vs_tcp", {}).items():
        row(f"{name} over unix socket", r["unix"])
        row(f"{name} over tcp loopback", r["tcp"], f"tcp/unix {r['ratio_p50_tcp_over_unix']:.2f}x")
    if "ipython_inproc_vs_zmq" in results:
        r = results["ipython_inproc_vs_zmq"]
        row("ipython cell, in-process (via tool server)", r["cell"]["inproc"])
        row(
            "ipython cell, separate kernel over ZMQ",
            r["cell"]["zmq"],
            f"zmq/inproc {r['ratio_p50_zmq_over_inproc']:.1f}x",
        )
        starts = r["kernel_start_ms"]
        lines.append(
            f"{'kernel start ms: in-process / zmq':42s} {starts['inproc_first_call']:9.1f} "
            f"{starts['zmq']:9.1f}"
        )
    if "startup" in results:
        r = results["startup"]
        row("python -c pass", r["python_c_pass"])
        row("tool server spawn -> READY line", r["ready_line"])
        row("tool server spawn -> first ping", r["first_ping"])
        row("tool server spawn -> first bash echo", r["first_bash"])
        row("tool server CPU used by the first ping", r["cpu_to_first_ping"])
        row("  same with python -S: READY line", r["ready_line_no_site"])
        row("  same with python -S: first ping", r["first_ping_no_site"])
        row("  same with python -S: first bash echo", r["first_bash_no_site"])
        row("  same with python -S: CPU used", r["cpu_to_first_ping_no_site"])
    lines.append("\ntargets:")
    for name, held in all_targets(results).items():
        lines.append(f"  [{'ok' if held else 'MISSED'}] {name}")
    return "\n".join(lines)


def all_targets(results: dict) -> dict[str, bool]:
    return {
        k: v
        for r in results.values()
        if isinstance(r, dict)
        for k, v in r.get("targets", {}).items()
    }


def environment_info() -> dict:
    versions = {}
    for package in (
        "msgspec",
        "ptyprocess",
        "ipykernel",
        "jupyter_client",
        "pyzmq",
        "bm25s",
        "uvloop",
    ):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    tmux = (
        subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.strip()
        if shutil.which("tmux")
        else None
    )
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "client_loop": type(new_event_loop()).__module__,
        "tmux": tmux,
        "versions": versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", nargs="+", choices=sorted(MEASUREMENTS), help="run only these")
    parser.add_argument("--iterations", type=int, help="actions per side and command (default 300)")
    parser.add_argument("--startups", type=int, help="server starts to time (default 20)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    iterations = args.iterations or (60 if args.quick else 300)
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        ctx = Context(
            Path(tmp),
            iterations=iterations,
            batch=min(20, iterations),
            startups=args.startups or (5 if args.quick else 20),
            slow_polls=4 if args.quick else 10,
        )
        results = {"environment": environment_info()}
        for name in args.only or MEASUREMENTS:
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            results[name] = MEASUREMENTS[name](ctx)
        results["environment"]["loadavg_after"] = os.getloadavg()
    results["targets"] = all_targets(results)
    print(report(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nJSON: {RESULTS}")
    return 0 if all(results["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
