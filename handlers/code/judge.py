"""The judge that runs a solution against test inputs inside the EVAL sandbox (stdlib only).

The worker writes this file, the solution and a manifest into a fresh sandbox and runs
``python3 judge.py manifest.json results.json``. Expected outputs never enter the sandbox: the
judge only runs the solution and reports what happened, the worker compares (``grading.py``).

Per test, the solution runs in a fresh directory, in its own session, with
RLIMIT_AS (memory), RLIMIT_CPU (CPU seconds), RLIMIT_FSIZE (output size) and RLIMIT_CORE=0,
stdout and stderr to files (no pipe to drain, so a flood cannot block the judge); the judge
polls ``wait4`` (for CPU time and peak RSS) and SIGKILLs the process group at the wall-clock
limit (``wall_factor`` times the CPU limit plus a second: CPU time is what is judged, the wall
clock only stops solutions that sleep or block, with room for a loaded machine). Afterwards the
group is killed and so is every other descendant of the judge: it is a child subreaper, so
children that left the session or daemonized stay below it and are found.

Kinds of test:

``stdio``   ``python3 solution.py < input``; the report carries stdout (up to the cap).
``call``    a harness (this file, ``--harness call``) imports the solution and calls ``fn_name``
            (a top-level function, or a method of ``Solution()``, LeetCode style) with the
            JSON arguments; the report carries the returned value as JSON.
``pytest``  a harness (``--harness pytest``) imports the hidden test module (which imports the
            solution) and runs one ``test_*`` function, or only the module body for
            ``__module__``. It reports success with a nonce read from stdin, so a solution that
            merely exits with status 0 does not pass. (Tests and solution share one process
            here, so a solution that introspects the harness could still fake a pass, as in
            TACO/LiveCodeBench graders; ``stdio`` and ``call`` results are judged outside.)
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

STDERR_TAIL = 2000
FALLBACK_CAP = 8 * 2**20


def _descendants() -> set[int]:
    """Every process below this one (the judge is a child subreaper, so orphans stay below it).

    Only descendants are ever killed: under a runtime without a pid namespace (development)
    /proc shows the whole host, and nothing else may be touched.
    """
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            parents[int(name)] = int(stat[stat.rindex(b")") + 2:].split()[1])  # field 4: ppid
    me, found = os.getpid(), set()
    for pid in parents:
        chain, cursor = [], pid
        while cursor in parents and cursor not in (0, 1, me) and cursor not in found:
            chain.append(cursor)
            cursor = parents[cursor]
        if cursor == me or cursor in found:
            found.update(chain)
    return found


def _kill_descendants() -> int:
    """SIGKILL every process a test left behind (children that left its session included)."""
    killed = 0
    for _ in range(20):  # a forking straggler may spawn more while we kill
        _reap()
        left = _descendants()
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    _reap()
    return killed


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _limits(memory_bytes: int, cpu_s: int, fsize: int):
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _tail(path: str, size: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - size))
        return handle.read().decode("utf-8", "replace")


def run_test(test: dict, index: int, root: str, solution: str, env: dict) -> dict:
    """Run one test; returns the facts the worker grades (never a verdict on the output)."""
    workdir = os.path.join(root, "run", str(index))
    os.makedirs(workdir)
    shutil.copy(solution, os.path.join(workdir, "solution.py"))
    kind = test["kind"]
    cap = int(test.get("output_cap") or FALLBACK_CAP)
    stdin_path = os.path.join(workdir, ".stdin")
    # the pytest nonce goes through a pipe, never a file the solution could read
    nonce = os.urandom(16).hex() if kind == "pytest" else ""
    with open(stdin_path, "w", encoding="utf-8") as handle:
        handle.write(test.get("input", "") if kind == "stdio" else "")
    result_path = os.path.join(workdir, ".result.json")
    if kind == "stdio":
        argv = [sys.executable, "solution.py"]
    elif kind == "call":
        with open(os.path.join(workdir, ".args.json"), "w", encoding="utf-8") as handle:
            json.dump({"fn_name": test["fn_name"], "args": test["args"]}, handle)
        argv = [sys.executable, os.path.abspath(__file__), "--harness", "call", ".args.json", result_path]
    elif kind == "pytest":
        shutil.copy(os.path.join(root, test["test_file"]), os.path.join(workdir, "hidden_tests.py"))
        argv = [sys.executable, os.path.abspath(__file__), "--harness", "pytest", "hidden_tests.py",
                test["test_name"], result_path]
    else:
        raise ValueError(f"unknown test kind {kind!r}")
    time_limit = float(test["time_limit_s"])
    wall_limit = time_limit * float(test.get("wall_factor", 3.0)) + 1.0
    cpu_limit = int(time_limit) + 1
    stdout_path, stderr_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
    import subprocess
    with open(stdin_path, "rb") as stdin, open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        started = time.monotonic()
        process = subprocess.Popen(argv, stdin=subprocess.PIPE if nonce else stdin, stdout=stdout, stderr=stderr,
                                   cwd=workdir, env=env, start_new_session=True, close_fds=True,
                                   preexec_fn=_limits(int(test["memory_bytes"]), cpu_limit, cap))  # noqa: PLW1509 - single-threaded
        if nonce:
            assert process.stdin is not None, "stdin is a pipe whenever there is a nonce"
            try:
                process.stdin.write(nonce.encode() + b"\n")
                process.stdin.close()
            except BrokenPipeError:
                pass
        killed_at_wall = False
        delay = 0.001
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - started > wall_limit:
                killed_at_wall = True
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        wall = time.monotonic() - started
        process.returncode = 0  # reaped by wait4 above; keep Popen from waiting again
    try:  # the whole group at once first: a forking solution cannot outrun one killpg
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    stragglers = _kill_descendants()
    report = {
        "index": index, "kind": kind, "wall_s": round(wall, 4),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 4),
        "max_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "killed_at_wall": killed_at_wall, "wall_limit_s": wall_limit, "stragglers_killed": stragglers,
        "stderr_tail": _tail(stderr_path, STDERR_TAIL),
    }
    size = os.path.getsize(stdout_path)
    report["stdout_bytes"] = size
    report["output_limit"] = size >= cap
    if kind == "stdio":
        with open(stdout_path, "rb") as handle:
            report["stdout"] = handle.read(cap).decode("utf-8", "replace")
    if kind in ("call", "pytest"):
        try:
            with open(result_path, encoding="utf-8") as handle:
                report["result"] = json.load(handle)
        except (OSError, ValueError):
            report["result"] = None
    if kind == "pytest":
        report["nonce_ok"] = isinstance(report["result"], dict) and report["result"].get("nonce") == nonce
    shutil.rmtree(workdir, ignore_errors=True)
    return report


def _env(extra: dict) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def _prctl_setup() -> None:
    """Not dumpable: same-uid solutions stay out of this process's memory (/proc/<pid>/mem needs
    ptrace rights). Child subreaper: a solution's orphans are reparented here, not to init, so
    they can be found and killed."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, 1
    except (OSError, AttributeError):
        pass


def main(manifest_path: str, results_path: str) -> int:
    _prctl_setup()
    with open(manifest_path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    root = os.path.dirname(os.path.abspath(manifest_path))
    for name, text in manifest.get("files", {}).items():
        with open(os.path.join(root, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    solution = os.path.join(root, manifest.get("solution", "solution.py"))
    env = _env(manifest.get("env", {}))
    reports = []
    for index, test in enumerate(manifest["tests"]):
        try:
            reports.append(run_test(test, index, root, solution, env))
        except Exception as error:  # noqa: BLE001 - one broken test must not lose the others
            reports.append({"index": index, "kind": test.get("kind"),
                            "judge_error": f"{type(error).__name__}: {error}"})
    with open(results_path + ".part", "w", encoding="ascii") as handle:
        json.dump({"reports": reports}, handle, ensure_ascii=True)
    os.replace(results_path + ".part", results_path)
    return 0


# -- harnesses: run in the solution's process, under its limits ---------------------------------

def _jsonable(value):
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _load_solution():
    import importlib.util
    sys.path.insert(0, os.getcwd())
    spec = importlib.util.spec_from_file_location("solution", os.path.join(os.getcwd(), "solution.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["solution"] = module
    spec.loader.exec_module(module)
    return module


def _error(error: BaseException) -> dict:
    return {"ok": False, "error": type(error).__name__, "message": str(error)[:500]}


def _write(path: str, payload: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)


def harness_call(args_path: str, result_path: str) -> int:
    with open(args_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    try:
        module = _load_solution()
        function = getattr(module, spec["fn_name"], None)
        if function is None and hasattr(module, "Solution"):
            function = getattr(module.Solution(), spec["fn_name"], None)
        if function is None:
            raise AttributeError(f"the solution defines no function {spec['fn_name']!r}")
        value = function(*spec["args"])
    except BaseException as error:  # noqa: BLE001 - reported, including SystemExit
        _write(result_path, _error(error))
        return 1
    _write(result_path, {"ok": True, "value": _jsonable(value)})
    return 0


def harness_pytest(test_file: str, test_name: str, result_path: str) -> int:
    nonce = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the solution must not read the nonce
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    try:
        import importlib.util
        sys.path.insert(0, os.getcwd())
        spec = importlib.util.spec_from_file_location("hidden_tests", os.path.join(os.getcwd(), test_file))
        if spec is None or spec.loader is None:  # a .py path always has a source loader
            raise ImportError(f"cannot load {test_file!r} as a module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if test_name != "__module__":
            getattr(module, test_name)()
    except BaseException as error:  # noqa: BLE001 - an assertion, an exception, or SystemExit
        _write(result_path, _error(error))
        return 1
    _write(result_path, {"ok": True, "nonce": nonce})
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--harness":
        if sys.argv[2] == "call":
            sys.exit(harness_call(*sys.argv[3:5]))
        sys.exit(harness_pytest(*sys.argv[3:6]))
    sys.exit(main(sys.argv[1], sys.argv[2]))
