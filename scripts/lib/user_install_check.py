"""Driver of scripts/user_install_check.sh, run with the python of the user-install venv.

Phase 1: the service as the README starts it (``prorl up``, the scripted LLM server registered
with ``/add_llm_server``), one job per domain through the gateway's HTTP API, each with the
reward it must get (scripts/lib/user_install_jobs.py). Phase 2: pytest uninstalled from the
venv, the service restarted, the swe gold-patch job again: it must not end with a valid reward.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import user_install_procs as procs

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "tests" / "data" / "user_install_rules.json"
JOB_TIMEOUT_S = 600.0  # a job's active-time budget: generous, two shared cores
RESULT_WAIT_S = 900.0  # how long the check waits for the results of a batch of jobs
START_WAIT_S = 300.0


class CheckFailed(Exception):
    """A step could not go on (a start, an install, a job that never ended); the message says
    which and where its log is."""


def say(message: str) -> None:
    print(f"[user_install_check] {message}", flush=True)


def run(command: list[str], timeout_s: float, what: str, cwd: Path) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    if result.returncode != 0:
        raise CheckFailed(f"{what} failed ({' '.join(command)}, exit {result.returncode}):\n"
                          f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result.stdout


# -- the install ------------------------------------------------------------------------------


def check_install(venv: Path, workdir: Path) -> None:
    """Everything the service imports comes from the venv; print what it holds and where
    pytest (if anywhere) comes from."""
    if Path(sys.prefix).resolve() != venv.resolve():
        raise CheckFailed(f"the driver runs in {sys.prefix}, not in the venv {venv}")
    config = (venv / "pyvenv.cfg").read_text()
    if re.search(r"include-system-site-packages\s*=\s*true", config):
        raise CheckFailed(f"{venv} sees the system site-packages")
    outside = [p for p in sys.path if p and (not p.startswith((sys.base_prefix, sys.prefix, str(ROOT)))
                                             or ("site-packages" in p and not p.startswith(sys.prefix)))]
    if outside:
        raise CheckFailed(f"the venv's python path has entries outside the venv and the checkout: {outside}")
    started = time.monotonic()
    listed = run([sys.executable, "-m", "pip", "list", "--format=freeze"], 120, "pip list", workdir).split()
    say(f"pip list: {len(listed)} packages in {time.monotonic() - started:.1f} s")
    import importlib.util
    spec = importlib.util.find_spec("pytest")
    if spec is None:
        say("pytest: not installed (the install does not carry it)")
        return
    origin = str(Path(spec.origin or "").resolve())
    if not origin.startswith(str(venv.resolve())):
        raise CheckFailed(f"pytest is imported from {origin}, outside the venv {venv}")
    shown = run([sys.executable, "-m", "pip", "show", "pytest"], 120, "pip show pytest", workdir)
    required_by = re.search(r"^Required-by:(.*)$", shown, re.M)
    say(f"pytest: {origin}, required by:{required_by.group(1) if required_by else ' ?'}")


def tokenizer_dir(workdir: Path) -> str:
    """The qwen3 tokenizer fixture, built (or found cached) by ``prorl fixtures build``."""
    out = run(["prorl", "fixtures", "build", "--no-model"], 1200, "prorl fixtures build --no-model", workdir)
    found = re.search(r"^tokenizer qwen3: (.+)$", out, re.M)
    if not found:
        raise CheckFailed(f"prorl fixtures build printed no qwen3 tokenizer:\n{out}")
    return found.group(1).strip()


# -- the service ------------------------------------------------------------------------------


class Started:
    """A process of ours in its own session, its output in ``log``, run in the log's directory
    (not the checkout: nothing may work only because the current directory is the repo)."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.log = name, log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=log.parent, env=env, start_new_session=True)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(self, check, what: str, timeout_s: float = START_WAIT_S):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise CheckFailed(f"{self.name} exited with {self.popen.returncode} before {what}; "
                                  f"log {self.log}:\n{self.tail()}")
            try:
                value = check()
            except Exception:  # noqa: BLE001 - not up yet
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise CheckFailed(f"{self.name}: {what} not seen within {timeout_s:.0f} s; log {self.log}:\n{self.tail()}")

    def stop(self, grace_s: float) -> list[str]:
        """SIGTERM to the process, SIGKILL to its group after ``grace_s``; then every process
        it had started (its descendants, sandboxes among them) must be gone: what was not."""
        tree = procs.processes(None, roots=(self.popen.pid,))
        problems = []
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                problems.append(f"{self.name} still ran {grace_s:.0f} s after SIGTERM (SIGKILLed)")
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        if left := procs.stop([p for p in tree if p.alive()], grace_s=5):
            problems.append(f"stopping {self.name} left {procs.describe(left)} running (now killed)")
        return problems


class Service:
    """``prorl up`` (redis, gateway, three worker pools) on this run's sandbox directory."""

    def __init__(self, workdir: Path, tokenizer: str, llm_address: str, attempt: int) -> None:
        self.workdir, self.tokenizer, self.llm_address = workdir, tokenizer, llm_address
        self.log = workdir / f"prorl-up-{attempt}.log"
        self.process: Started | None = None
        self.url = ""

    def start(self) -> None:
        import httpx
        # TMPDIR: prorl up's log directory (a mkdtemp) goes with this run's, not into /tmp
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, "PRORL_SANDBOX_DIR": str(self.workdir / "sb"), "TMPDIR": str(tmp),
               "PYTHONUNBUFFERED": "1"}
        # Redis's AOF in this run's directory, and any free port: never the user's default ones
        # (a second check at once, or a user's own `prorl up`, holds the lock and port 8080)
        self.process = Started("prorl up", ["prorl", "up", "--llm", "none", "--tokenizer", self.tokenizer,
                                            "--redis-dir", str(self.workdir / "redis"), "--port", "0"], self.log, env)
        started = time.monotonic()
        self.url = self.process.wait_for(lambda: _printed(self.log, r"^gateway\s+(http://\S+)"),
                                         "the gateway, redis and all three worker pools up")
        logs = _printed(self.log, r"^logs\s+(\S+)")
        say(f"prorl up: {self.url} in {time.monotonic() - started:.0f} s (its logs: {logs})")
        response = httpx.post(self.url + "/add_llm_server", json={"address": self.llm_address, "type": "vllm"},
                              timeout=60)
        if response.status_code != 200:
            raise CheckFailed(f"/add_llm_server {self.llm_address}: {response.status_code} {response.text}")

    def stop(self) -> list[str]:
        if self.process is None:
            return []
        process, self.process = self.process, None
        return process.stop(grace_s=90)  # prorl up gives each child 10 s, redis after the rest

    def run(self, phase) -> list[str]:
        """Start, run ``phase(gateway_url)`` (its failures), stop: with what stopping found."""
        try:
            self.start()
            failures = phase(self.url)
        finally:
            stopped = self.stop()
        return failures + stopped


def _printed(log: Path, pattern: str) -> str | None:
    found = re.search(pattern, log.read_text(errors="replace"), re.M)
    return found.group(1) if found else None


def start_llm(workdir: Path, tokenizer: str) -> tuple[Started, str]:
    from prorl_celery.dev.local import free_port
    port = free_port()
    server = Started("scripted LLM server", [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted",
                                             str(RULES), "--tokenizer", tokenizer, "--port", str(port)],
                     workdir / "llm.log")
    import httpx
    server.wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200,
                    "GET /health answered 200")
    return server, f"http://127.0.0.1:{port}/v1"


# -- jobs -------------------------------------------------------------------------------------


def run_jobs(url: str, jobs: list) -> list[dict]:
    """Submit every job, then wait for each result (they run side by side)."""
    import httpx
    with httpx.Client(base_url=url, timeout=120) as client:
        ids = []
        for job in jobs:
            response = client.post("/jobs", json=job.body(JOB_TIMEOUT_S))
            if response.status_code != 202:
                raise CheckFailed(f"POST /jobs for {job.name}: {response.status_code} {response.text}")
            ids.append(response.json()["job_id"])
        deadline = time.monotonic() + RESULT_WAIT_S
        results = []
        for job, job_id in zip(jobs, ids):
            while True:
                response = client.get(f"/jobs/{job_id}", params={"wait": 30}, timeout=90)
                if response.status_code == 200:
                    results.append(response.json())
                    break
                if response.status_code != 202 or time.monotonic() > deadline:
                    raise CheckFailed(f"job {job.name} ({job_id}) did not finish within {RESULT_WAIT_S:.0f} s: "
                                      f"{response.status_code} {response.text[:500]}")
    return results


def judge(job, result: dict) -> str | None:
    """Why ``result`` is wrong for ``job``, or None."""
    if result.get("status") != "completed" or result.get("reward") != job.reward:
        why = result.get("error") or (result.get("eval") or {}).get("reason") or result.get("detail")
        return f"ended {result.get('status')} with reward {result.get('reward')!r}, expected {job.reward}: {why}"
    if "outcome" in result and result["outcome"] != "ok":
        return f"outcome {result['outcome']!r} (detail {result.get('detail')!r}), expected 'ok'"
    if "reward_valid" in result and result["reward_valid"] is not True:
        return f"reward_valid {result['reward_valid']!r}, expected true"
    return job.check(result)


def table(rows: list[tuple[str, dict, str | None]]) -> None:
    say(f"{'job':<20} {'status':<10} {'reward':>6} {'outcome':<12} {'turns':>5} {'run_s':>6} {'eval_s':>6}  verdict")
    for name, result, problem in rows:
        timing, trajectory = result.get("timing") or {}, result.get("trajectory") or {}
        reward, verdict = result.get("reward"), "ok" if problem is None else f"WRONG: {problem}"
        say(f"{name:<20} {str(result.get('status')):<10} {'-' if reward is None else f'{reward:.1f}':>6} "
            f"{str(result.get('outcome', '(absent)')):<12} {trajectory.get('num_turns', '-'):>5} "
            f"{timing.get('run_s', 0):>6.1f} {timing.get('eval_s', 0):>6.1f}  {verdict}")


# -- phases -----------------------------------------------------------------------------------


def phase_one(url: str) -> list[str]:
    from user_install_jobs import phase_one as jobs_of_phase_one
    jobs = jobs_of_phase_one()
    started = time.monotonic()
    results = run_jobs(url, jobs)
    rows = [(job.name, result, judge(job, result)) for job, result in zip(jobs, results)]
    say(f"phase 1: {len(jobs)} jobs, one per domain, in {time.monotonic() - started:.0f} s")
    table(rows)
    return [f"phase 1 job '{name}': {problem}" for name, _, problem in rows if problem]


def uninstall_pytest(workdir: Path) -> None:
    out = run([sys.executable, "-m", "pip", "uninstall", "-y", "pytest"], 300, "pip uninstall -y pytest", workdir)
    say("phase 2: pip uninstall -y pytest: " + (" ".join(out.split())[:200] or "(nothing printed)"))
    import importlib.util
    importlib.invalidate_caches()
    if importlib.util.find_spec("pytest") is not None:
        raise CheckFailed("pytest is still importable after pip uninstall -y pytest")


def phase_two(url: str) -> list[str]:
    from user_install_jobs import swe_gold, swe_without_pytest_is_not_scored
    job = swe_gold()
    [result] = run_jobs(url, [job])
    problem = swe_without_pytest_is_not_scored(result)
    say("phase 2: the swe gold patch with pytest uninstalled")
    table([("swe gold, no pytest", result, problem)])
    verdict = "FAIL" if problem else f"PASS ({result.get('outcome')}, detail {result.get('detail')!r})"
    say(f"check swe_without_pytest_is_not_scored: {verdict}")
    return [f"phase 2 check swe_without_pytest_is_not_scored: {problem}"] if problem else []


def check(venv: Path, workdir: Path) -> list[str]:
    check_install(venv, workdir)
    tokenizer = tokenizer_dir(workdir)
    os.environ["PRORL_TOKENIZER"] = tokenizer
    say(f"tokenizer {tokenizer}")
    llm, address = start_llm(workdir, tokenizer)
    failures: list[str] = []
    try:
        failures += Service(workdir, tokenizer, address, attempt=1).run(phase_one)
        uninstall_pytest(workdir)
        failures += Service(workdir, tokenizer, address, attempt=2).run(phase_two)
    except CheckFailed as error:  # a step that cannot go on: the failures before it still count
        failures.append(str(error))
    finally:
        failures += llm.stop(grace_s=10)
    return failures


def leftovers(run_id: str, workdir: Path) -> list[str]:
    """Whatever of this run still runs (stopped now), and sandbox state left on disk."""
    failures = []
    left = procs.stop(procs.processes(run_id), grace_s=5)
    if left:
        failures.append(f"processes left running after every stop: {procs.describe(left)} (now killed)")
    sandboxes = workdir / "sb"
    if entries := procs.sandbox_leftovers(str(sandboxes)):
        failures.append(f"sandbox state left in {sandboxes}: {entries[:10]}")
    return failures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally blocks stop what was started
    try:
        failures = check(args.venv, args.workdir)
    except CheckFailed as error:
        failures = [str(error)]
    except SystemExit:
        say("interrupted: stopping what was started")
        raise
    finally:
        failures_left = leftovers(args.run_id, args.workdir)
    failures += failures_left
    took = time.monotonic() - started
    if failures:
        say(f"FAILED after {took:.0f} s:")
        for failure in failures:
            say(f"  {failure}")
        return 1
    say(f"passed in {took:.0f} s: every domain through the user's install, and a missing pytest is not scored")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
