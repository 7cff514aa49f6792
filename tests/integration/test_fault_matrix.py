"""The fault matrix of issue 23: each fault injected in a real process of a real cluster, and the
class each job ends in, checked against ``docs/fault-matrix.md`` (so the table cannot rot).

The module runs a cluster of its own: a redis-server with an append-only file (so it can be
killed and restarted on the same port), its own node name and sandbox directory, a gateway,
INIT, RUN and EVAL workers, a scripted LLM server with this module's rules
(``tests/data/fault_matrix_rules.json``) and, as the only registered backend, a proxy in front
of it that corrupts ``POST /v1/completions`` on demand (``tests/support/faulty_backend.py``).

The faults and where they are injected:

- a requirement missing from a worker's interpreter: that worker is started with a
  ``sitecustomize.py`` first on its ``PYTHONPATH`` whose meta-path finder refuses the module
  (``pytest`` for an EVAL worker, ``ipykernel`` for an INIT worker); a sandbox that cannot
  start: an INIT worker told to use apptainer, which is not installed here. Such a worker
  replaces the stage's regular one for its cases, so it alone takes that stage's jobs.
- processes killed: the job's tool server (SIGKILL, found through the node's sandbox ledger)
  while its python tool call sleeps; the RUN worker and the INIT worker (SIGKILL); redis-server
  (SIGKILL, then restarted on its port).
- the backend: the proxy answers 500, resets the connection, or drops a logprob.
- handlers: the fault handler's evaluator hangs past ``PRORL_EVAL_TIMEOUT_S`` or raises; an
  agent program exits 3.

Every job must end well-formed in its class, with nothing scored silently: a reward only when
``reward_valid``, ``null`` otherwise (v1's ``score`` 0.0 with ``filter: true``), never a valid 0.
Independent cases run their jobs at once; the phases that swap or kill a worker run apart.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from handlers.swe import load_instances
from prorl_celery.core.status import JobStatus, Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess
from prorl_celery.state import keys
from prorl_celery.state.store import JobStore
from prorl_celery.worker.node_sandboxes import RedisSandboxLedger
from singularity.runtime import SandboxRecord, procfs
from tests.support.aof_redis import AofRedis
from tests.support.faulty_backend import FaultyBackend
from tests.support.sandboxes import assert_no_sandbox_process, sandbox_processes
from tests.support.services import ROOT, Gateway, LLMServer, eventually, start_llm_server

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.integration,
    # about a minute: CI runs it after the default run (scripts/test.sh), which stays under 10 minutes
    pytest.mark.extended,
]

DOC = ROOT / "docs" / "fault-matrix.md"
RULES = ROOT / "tests" / "data" / "fault_matrix_rules.json"
CONCURRENCY = {Stage.INIT: 4, Stage.RUN: 8, Stage.EVAL: 4}
LEASE_S = 3.0
EVAL_LIMIT_S = 2.0
JOB_TIMEOUT_S = 120.0
TERMINAL = {s.value for s in JobStatus if s.terminal}
NOT_VALID = {"env_error", "backend_error", "eval_error", "timeout", "cancelled"}
#: fault (the doc table's first column) -> the job's result, filled in by the tests below
OBSERVED: dict[str, dict[str, Any]] = {}


# -- the cluster -----------------------------------------------------------------------------------

@dataclass
class Matrix:
    cluster: LocalCluster
    gateway: Gateway
    llm: LLMServer
    proxy: FaultyBackend
    redis_server: AofRedis
    node: str
    sandbox_dir: Path
    blockers: Path
    workers: dict[Stage, ManagedProcess] = field(default_factory=dict)

    @property
    def state(self) -> redis.Redis:
        return redis.Redis.from_url(self.cluster.state_url, decode_responses=True)

    def ledger(self) -> list[SandboxRecord]:
        return RedisSandboxLedger(self.state).list(self.node)


def service_env(node: str, sandbox_dir: Path) -> dict[str, str]:
    return {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PRORL_NODE": node, "PRORL_SANDBOX_DIR": str(sandbox_dir), "PRORL_RUNTIME": "bubblewrap",
            "PRORL_BACKEND_WAIT_POLL_S": "0.1", "PRORL_LEASE_S": str(LEASE_S), "PRORL_VISIBILITY_TIMEOUT_S": "10",
            "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_SHUTDOWN_GRACE_S": "1",
            # an unreachable backend leaves routing until a probe answers: probe it again soon
            "PRORL_BACKEND_PROBE_INTERVAL_S": "1"}


@pytest.fixture(scope="module")
def matrix(qwen3_tokenizer, tmp_path_factory) -> Iterator[Matrix]:
    root = tmp_path_factory.mktemp("fault-matrix")
    node, sandbox_dir = f"matrix-{os.getpid()}", root / "sbx"
    llm = start_llm_server(qwen3_tokenizer, root, "matrix-llm", rules=RULES, wait=False)
    server = AofRedis(root / "redis")
    server.start()
    cluster = LocalCluster(redis_url=server.url, tokenizer=qwen3_tokenizer, gateway_workers=1,
                           env=service_env(node, sandbox_dir), concurrency=dict(CONCURRENCY),
                           log_dir=root / "cluster")
    try:
        with cluster, FaultyBackend(llm.base) as proxy, Gateway(cluster) as gateway:
            llm.wait_ready()
            found = Matrix(cluster, gateway, llm, proxy, server, node, sandbox_dir, root / "blockers")
            found.workers = {stage: worker_of(cluster, stage) for stage in Stage}
            assert gateway.post("/clear_llm_server").status_code == 200
            reply = gateway.post("/add_llm_server", json={"address": proxy.address()})
            assert reply.status_code == 200, reply.text
            yield found
            no_sandbox_left(found, lambda record: True, 30, "every sandbox of the module closed")
        procfs.wait_until(lambda: not sandbox_processes(sandbox_dir), 30, poll_s=0.2)
        assert_no_sandbox_process(sandbox_dir)
    finally:
        llm.process.stop()
        server.stop()


def worker_of(cluster: LocalCluster, stage: Stage) -> ManagedProcess:
    return next(p for p in cluster.processes if p.name.split("-")[0] == stage.value)


def blocked_env(matrix: Matrix, *modules: str) -> dict[str, str]:
    """``PYTHONPATH`` for a worker whose interpreter cannot import ``modules``: a directory
    holding a ``sitecustomize.py`` whose finder, first on ``sys.meta_path``, refuses them, put
    before the cluster's path."""
    directory = matrix.blockers / "-".join(modules)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        '"""Written by tests/integration/test_fault_matrix.py: this interpreter lacks ' + ", ".join(modules) + '."""\n'
        "import sys\n\n\n"
        "class RemovedModules:\n"
        f"    names = {set(modules)!r}\n\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in self.names:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n\n\n"
        "sys.meta_path.insert(0, RemovedModules())\n")
    path = matrix.cluster.service_env()["PYTHONPATH"]
    return {"PYTHONPATH": os.pathsep.join([str(directory), path])}


def replace_worker(matrix: Matrix, stage: Stage, env: dict[str, str] | None = None, kill: bool = False,
                   wait: bool = True) -> ManagedProcess:
    """The stage's current worker stopped (SIGTERM; SIGKILL when ``kill``) and a new one, with
    ``env`` over the cluster's, in its place."""
    cluster, old = matrix.cluster, matrix.workers[stage]
    if kill:
        os.kill(old.popen.pid, signal.SIGKILL)
        old.popen.wait(30)
    else:
        old.terminate()  # a warm shutdown stops consuming at once; the new one takes seconds to boot
    new = matrix.workers[stage] = cluster.start_worker(stage, CONCURRENCY[stage], env=env)
    old.wait_or_kill(15)
    cluster.processes.remove(old)
    if wait:
        cluster.wait_for_workers()
    return new


# -- jobs ------------------------------------------------------------------------------------------

def submit(matrix: Matrix, instance: dict[str, Any], max_attempts: int = 2) -> str:
    return matrix.gateway.submit(instance, max_attempts=max_attempts, timeout_s=JOB_TIMEOUT_S)


def status(matrix: Matrix, job_id: str) -> str | None:
    return matrix.state.hget(keys.job(job_id), "status")


def finish(matrix: Matrix, fault: str, job_id: str, wait_s: float = 90) -> dict[str, Any]:
    """The job's result once it ended, recorded under ``fault`` and checked to be well-formed."""
    result = matrix.gateway.result(job_id, wait=wait_s)
    OBSERVED[fault] = result
    check_well_formed(result)
    return result


def check_well_formed(result: dict[str, Any]) -> None:
    """Nothing scored silently: a reward is a number exactly when it is valid, and the last
    attempt of ``attempts`` is the job's own ending."""
    outcome, where = result["outcome"], f"job {result['job_id']}: {summary(result)}"
    assert result["status"] in TERMINAL, where
    assert result["reward_valid"] is (outcome not in NOT_VALID), where
    assert (result["reward"] is None) is (not result["reward_valid"]), where
    assert result["filter"] is (not result["reward_valid"]), where
    assert result["attempts"][-1]["outcome"] == outcome and len(result["attempts"]) == result["attempt"], where
    if outcome != "ok":
        assert result["detail"] and result["outcome_stage"], where


def summary(result: dict[str, Any]) -> str:
    attempts = [(a["outcome"], a["stage"]) for a in result.get("attempts", [])]
    return (f"{result.get('status')} {result.get('outcome')} reward={result.get('reward')!r} "
            f"attempts={attempts} detail={result.get('detail')!r}")


def classes(result: dict[str, Any]) -> list[str]:
    return [attempt["outcome"] for attempt in result["attempts"]]


def swe_instance() -> dict[str, Any]:
    row = next(r for r in load_instances() if r["instance_id"] == "prorl-swe__romanum-14")
    return {**row, "data_source": "swe", "problem_statement": f"FM-SWE\n{row['problem_statement']}"}


def math_python(marker: str) -> dict[str, Any]:
    return {"data_source": "math", "problem": f"{marker}: What is 6 * 7? Use the python tool.", "answer": "42",
            "tools": ["python"], "max_iterations": 3}


def fault_job(**fields: Any) -> dict[str, Any]:
    return {"data_source": "fault", **fields}


def no_sandbox_of(matrix: Matrix, job_ids: list[str], timeout_s: float = 20) -> None:
    no_sandbox_left(matrix, lambda record: record.job_id.removesuffix("-eval") in job_ids, timeout_s,
                    f"the sandboxes of {job_ids} closed")


def no_sandbox_left(matrix: Matrix, matching: Callable[[SandboxRecord], bool], timeout_s: float, what: str) -> None:
    """No ledger entry ``matching`` within ``timeout_s``; else a failure naming each one left,
    its owner's state and its job's."""
    def left() -> list[SandboxRecord]:
        return [record for record in matrix.ledger() if matching(record)]

    try:
        eventually(lambda: not left(), timeout_s, what)
    except AssertionError as error:
        found = [(record.model_dump(mode="json"), procfs.read_stat(record.owner.pid),
                  matrix.state.hmget(keys.job(record.job_id.removesuffix("-eval")),
                                     ["status", "attempt", "sandbox", "attempts"]))
                 for record in left()]
        raise AssertionError(f"{error}; left (entry, owner, job): {found}") from None


# -- 1. the evaluator: a missing test runner, a hang, a crash ---------------------------------------

def test_evaluator_faults(matrix):
    """An EVAL worker without pytest, and an evaluation limit of 2 s, the only EVAL worker: a
    swe job is refused by name (never scored 0), a hang and a crash are eval_error; each is
    retried by EVAL alone (RUN's result is the same one)."""
    replace_worker(matrix, Stage.EVAL, env={**blocked_env(matrix, "pytest"), "PRORL_EVAL_TIMEOUT_S": str(EVAL_LIMIT_S)})
    try:
        check_evaluator_faults(matrix)
    finally:
        replace_worker(matrix, Stage.EVAL)  # the regular one, for the phases after


def check_evaluator_faults(matrix: Matrix) -> None:
    jobs = {"pytest missing": submit(matrix, swe_instance()),
            "evaluator hangs past its limit": submit(matrix, fault_job(eval_sleep_s=60, report_run_times=True)),
            "evaluator raises": submit(matrix, fault_job(fail="eval")),
            "evaluator exits (SystemExit)": submit(matrix, fault_job(crash="eval"))}
    hang = jobs["evaluator hangs past its limit"]
    eventually(lambda: status(matrix, hang) == "eval", 60, "the hanging job in EVAL")
    first_run = run_result(matrix, hang)
    assert first_run.get("run_times"), first_run
    results = {fault: finish(matrix, fault, job_id) for fault, job_id in jobs.items()}

    swe = results["pytest missing"]
    assert (swe["outcome"], classes(swe)) == ("eval_error", ["eval_error"] * 2), summary(swe)
    assert "pytest" in swe["detail"] and swe["outcome_stage"] == "eval", summary(swe)
    hung = results["evaluator hangs past its limit"]
    assert (hung["outcome"], classes(hung)) == ("eval_error", ["eval_error"] * 2), summary(hung)
    assert "PRORL_EVAL_TIMEOUT_S" in hung["detail"], summary(hung)
    assert [a["stage"] for a in hung["attempts"]] == ["eval", "eval"], summary(hung)
    assert run_result(matrix, hang) == first_run, "EVAL's retry ran RUN again"
    for fault in ("evaluator raises", "evaluator exits (SystemExit)"):
        crashed = results[fault]
        assert (crashed["outcome"], classes(crashed)) == ("eval_error", ["eval_error"] * 2), summary(crashed)
        assert "scripted" in crashed["detail"], summary(crashed)
    assert matrix.workers[Stage.EVAL].popen.poll() is None, "the EVAL worker died with its evaluator"
    no_sandbox_of(matrix, list(jobs.values()))


def run_result(matrix: Matrix, job_id: str) -> dict[str, Any]:
    return JobStore(matrix.state, result_ttl_s=60).load(job_id).run_result


# -- defects found here: agent jobs on an EVAL worker without pytest -------------------------------

AGENT_EXITS_ON_SWE = {"data_source": "agent", "command": "python3 /workspace/giveup.py", "task": "FM-AGENT",
                      "swe": "prorl-swe__romanum-14",
                      "files": {"giveup.py": "import sys\nprint('giving up')\nsys.exit(3)\n"}}
AGENT_ANSWERS_MATH = {"data_source": "agent", "command": "python3 answer.py", "task": "FM-AGENT",
                      "files": {"answer.py": "open('answer.txt', 'w').write('\\\\boxed{42}')\n"},
                      "evaluator": {"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}}


@pytest.fixture(scope="module")
def agent_jobs_without_pytest(matrix) -> dict[str, dict[str, Any]]:
    """Two agent jobs (one attempt each) whose EVAL runs on a worker without pytest: one whose
    program exits 3 in a swe checkout, one whose math answer needs no test runner at all."""
    replace_worker(matrix, Stage.EVAL, env=blocked_env(matrix, "pytest"))
    try:
        jobs = {"exits": submit(matrix, AGENT_EXITS_ON_SWE, max_attempts=1),
                "math": submit(matrix, AGENT_ANSWERS_MATH, max_attempts=1)}
        results = {name: matrix.gateway.result(job_id, wait=90) for name, job_id in jobs.items()}
        for result in results.values():
            check_well_formed(result)
        no_sandbox_of(matrix, list(jobs.values()))
        return results
    finally:
        replace_worker(matrix, Stage.EVAL)


def test_a_refused_eval_keeps_the_class_of_a_failed_run(agent_jobs_without_pytest):
    result = agent_jobs_without_pytest["exits"]
    assert (result["outcome"], result["outcome_stage"]) == ("env_error", "run"), summary(result)
    assert "exited with code 3" in result["detail"], summary(result)


def test_an_agent_job_graded_as_math_needs_no_pytest(agent_jobs_without_pytest):
    result = agent_jobs_without_pytest["math"]
    assert (result["outcome"], result["reward"]) == ("ok", 1.0), summary(result)


# -- 2. the backend: 500, unreachable, short logprobs; and an agent program that exits 3 -----------

BACKEND_FAULTS = {"backend answers 500": "http_500", "backend unreachable mid-job": "refuse",
                  "backend logprobs shorter than its ids": "short_logprobs"}


def test_backend_faults_and_a_failing_agent_program(matrix):
    """One mode of the proxy at a time, the job's only backend; meanwhile an agent program that
    exits 3 (its turn never reaches the backend)."""
    program = submit(matrix, {"data_source": "agent", "command": "python3 giveup.py", "task": "FM-AGENT",
                              "files": {"giveup.py": "import sys\nprint('giving up')\nsys.exit(3)\n"},
                              "evaluator": {"type": "none"}})
    try:
        for fault, mode in BACKEND_FAULTS.items():
            matrix.proxy.mode = mode
            before = matrix.proxy.calls[mode]
            result = finish(matrix, fault, submit(matrix, {"data_source": "math", "answer": "5",
                                                           "problem": "FM-BACKEND: What is 2 + 3?"}))
            assert (result["outcome"], classes(result)) == ("backend_error", ["backend_error"] * 2), summary(result)
            assert result["outcome_stage"] == "run" and matrix.proxy.calls[mode] - before == 2, summary(result)
    finally:
        matrix.proxy.mode = "pass"
    assert "HTTP 500" in OBSERVED["backend answers 500"]["detail"]
    assert "unreachable" in OBSERVED["backend unreachable mid-job"]["detail"]
    assert "logprobs" in OBSERVED["backend logprobs shorter than its ids"]["detail"]

    exited = finish(matrix, "agent program exits non-zero", program)
    assert (exited["outcome"], classes(exited)) == ("env_error", ["env_error"] * 2), summary(exited)
    assert "exited with code 3" in exited["detail"], summary(exited)
    no_sandbox_of(matrix, [program])


# -- 3. the tool server killed mid-call ------------------------------------------------------------

def tool_server_of(record: SandboxRecord) -> procfs.ProcInfo:
    """The sandbox's tool server: of its processes, the Python one running singularity.toolserver
    (bwrap's own command line names it too)."""
    for info in procfs.members(record.root, record.pidns, record.refs):
        argv = Path(f"/proc/{info.pid}/cmdline").read_bytes().split(b"\0")
        if b"singularity.toolserver" in argv and b"bwrap" not in Path(argv[0].decode()).name.encode():
            return info
    raise AssertionError(f"no tool server among the processes of sandbox {record.sandbox_id}")


def test_tool_server_killed_mid_call(matrix):
    job_id = submit(matrix, math_python("FM-TOOLKILL"))

    def sleeping_call() -> SandboxRecord | None:  # the python call wrote its marker, then sleeps 5 s
        return next((r for r in matrix.ledger() if r.job_id == job_id
                     and (Path(r.workspace) / "fm-toolkill-started").exists()), None)
    eventually(lambda: sleeping_call() is not None, 60, "the python tool call running")
    record = sleeping_call()
    assert record is not None
    os.kill(tool_server_of(record).pid, signal.SIGKILL)

    result = finish(matrix, "tool server killed mid-call", job_id)
    assert (result["outcome"], classes(result), result["reward"]) == ("ok", ["env_error", "ok"], 1.0), summary(result)
    assert result["attempts"][0]["stage"] == "run", summary(result)
    no_sandbox_of(matrix, [job_id])


# -- 4. the RUN worker killed ----------------------------------------------------------------------

def test_run_worker_killed(matrix):
    slow = fault_job(sandbox=True, run_sleep_s=60, sleep_first_attempt_only=True)
    # three attempts: on a loaded machine the replacement RUN worker may still be starting when
    # the retried INIT looks for one on the node (two heartbeats), an env_error retried in turn
    retried, given_up = submit(matrix, slow, max_attempts=3), submit(matrix, slow, max_attempts=1)
    eventually(lambda: status(matrix, retried) == status(matrix, given_up) == "run", 60, "both jobs in RUN")
    replace_worker(matrix, Stage.RUN, kill=True, wait=False)

    again = finish(matrix, "RUN worker killed (attempts left)", retried)
    assert again["outcome"] == "ok" and classes(again)[0] == "env_error", summary(again)
    assert set(classes(again)[:-1]) == {"env_error"} and classes(again)[-1] == "ok", summary(again)
    lost = finish(matrix, "RUN worker killed (no attempt left)", given_up)
    assert (lost["outcome"], classes(lost)) == ("env_error", ["env_error"]), summary(lost)
    for result in (again["attempts"][0], lost["attempts"][0]):
        assert result["stage"] == "run" and "worker lost" in result["detail"], (again, lost)
    no_sandbox_of(matrix, [retried, given_up])


# -- 5. the INIT worker killed while its jobs are in RUN --------------------------------------------

def test_init_worker_killed_while_its_jobs_run(matrix):
    """A math job with the python tool whose first reply comes 5 s late: the INIT worker that
    started its sandbox is killed meanwhile; the job's tool call must still reach its sandbox."""
    job_id = submit(matrix, math_python("FM-SURVIVE"))
    eventually(lambda: status(matrix, job_id) == "run", 60, "the job in RUN")
    time.sleep(0.5)  # its first turn is on its way (5 s)
    replace_worker(matrix, Stage.INIT, kill=True, wait=False)

    result = finish(matrix, "INIT worker killed while its jobs are in RUN", job_id)
    assert (result["outcome"], result["attempt"], result["reward"]) == ("ok", 1, 1.0), summary(result)
    no_sandbox_of(matrix, [job_id])


# -- 6. Redis restarted mid-stage ------------------------------------------------------------------

def test_redis_restarted_mid_stage(matrix):
    """A job busy in each stage when redis-server is killed, and jobs whose stages end while it
    is down (their hand-overs find no Redis); it is restarted on its port 1 s later with its
    append-only file. Every job ends ok, at once or after an env_error retried."""
    jobs = {"init": submit(matrix, fault_job(init_sleep_s=5), max_attempts=3),
            "run": submit(matrix, fault_job(sandbox=True, run_sleep_s=5), max_attempts=3),
            "eval": submit(matrix, fault_job(eval_sleep_s=5), max_attempts=3)}
    eventually(lambda: all(status(matrix, job_id) == stage for stage, job_id in jobs.items()), 30,
               "a job busy in each stage")
    # RUN stages that end 0.7 to 2.2 s after the kill (one second down, then the restart), each
    # telling when it ended; INIT and EVAL stages likewise, untimed
    ending_run = [submit(matrix, fault_job(run_sleep_s=s, report_run_times=True), max_attempts=3)
                  for s in (1.0, 1.5, 2.0, 2.5)]
    ending = ending_run + [submit(matrix, fault_job(init_sleep_s=s), max_attempts=3) for s in (1.0, 1.5)]
    ending += [submit(matrix, fault_job(eval_sleep_s=s), max_attempts=3) for s in (1.0, 1.5, 2.0)]
    eventually(lambda: all(status(matrix, job_id) not in ("pending_init", "init", "pending_run")
                           for job_id in ending_run), 30, "the short RUN stages begun")
    time.sleep(0.3)
    down_at = time.monotonic()
    matrix.redis_server.kill()
    time.sleep(1.0)
    matrix.redis_server.start()
    up_at = time.monotonic()

    for stage, job_id in jobs.items():
        result = finish(matrix, f"Redis restarted mid-stage ({stage})", job_id)
        assert result["outcome"] == "ok" and set(classes(result)[:-1]) <= {"env_error"}, summary(result)
    ended = {job_id: matrix.gateway.result(job_id, wait=90) for job_id in ending}
    for result in ended.values():
        check_well_formed(result)
        assert result["outcome"] == "ok" and set(classes(result)[:-1]) <= {"env_error"}, summary(result)
    # the RUN worker's monotonic clock is this process's (CLOCK_MONOTONIC, one machine)
    while_down = [job_id for job_id in ending_run if down_at <= run_result(matrix, job_id)["run_times"][1] <= up_at]
    assert while_down, f"no RUN stage ended while Redis was down ({up_at - down_at:.1f} s): the case tested nothing"
    OBSERVED["Redis restarted as stages end"] = ended[while_down[0]]
    assert all(p.popen.poll() is None for p in matrix.cluster.processes), "a process died with Redis"
    no_sandbox_of(matrix, list(jobs.values()))


# -- 7. INIT workers that cannot start a job's sandbox ----------------------------------------------

def test_init_worker_faults(matrix):
    """Last (no regular INIT worker comes back): an INIT worker without ipykernel refuses the
    python tool by name; one told to use apptainer, absent here, cannot start a sandbox."""
    replace_worker(matrix, Stage.INIT, env=blocked_env(matrix, "ipykernel"))
    no_kernel = finish(matrix, "ipykernel missing", submit(matrix, math_python("FM-PYTHON")))
    assert (no_kernel["outcome"], classes(no_kernel)) == ("env_error", ["env_error"] * 2), summary(no_kernel)
    assert "ipykernel" in no_kernel["detail"] and no_kernel["outcome_stage"] == "init", summary(no_kernel)

    replace_worker(matrix, Stage.INIT, env={"PRORL_RUNTIME": "apptainer"})
    job_id = submit(matrix, fault_job(sandbox=True))
    no_runtime = finish(matrix, "sandbox fails to start", job_id)
    assert (no_runtime["outcome"], classes(no_runtime)) == ("env_error", ["env_error"] * 2), summary(no_runtime)
    assert "apptainer" in no_runtime["detail"].lower() and no_runtime["outcome_stage"] == "init", summary(no_runtime)
    no_sandbox_of(matrix, [job_id])


# -- the docs ----------------------------------------------------------------------------------------

def doc_rows() -> list[dict[str, str]]:
    """The rows of docs/fault-matrix.md's table, by its header's column names."""
    lines = [line.strip() for line in DOC.read_text().splitlines() if line.strip().startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], [row for row in cells[2:]]
    return [dict(zip(header, row)) for row in rows]


def test_docs_table_is_what_was_observed(matrix):
    """Every row of the docs' table is a fault this module injected, with the class, retries and
    reward the job really ended with (runs last: the tests above fill OBSERVED)."""
    if not OBSERVED:
        pytest.skip("run with the tests above: they fill OBSERVED")
    rows = {row["fault"]: row for row in doc_rows()}
    print("\n" + "\n".join(f"{fault}: {summary(result)}" for fault, result in OBSERVED.items()))
    documented = {name for name in rows}
    observed = set(OBSERVED)
    assert documented == observed, f"only in the docs: {documented - observed}; only observed: {observed - documented}"
    for fault, row in rows.items():
        result = OBSERVED[fault]
        outcome = re.findall(r"`([a-z_]+)`", row["outcome"])[0]
        assert outcome == result["outcome"], f"{fault}: the docs say {outcome}, the job ended {summary(result)}"
        retried = row["retried?"].split()[0].strip(":,").lower()
        if retried in ("yes", "no"):
            assert (retried == "yes") is (result["attempt"] > 1), f"{fault}: {row['retried?']}: {summary(result)}"
            listed = re.findall(r"`([a-z_]+)`", row["retried?"])
            assert not listed or listed == classes(result), f"{fault}: {row['retried?']}: {summary(result)}"
        not_valid = "`reward` null" in row["what the trainer sees"]
        assert not_valid is (result["reward"] is None), f"{fault}: {row['what the trainer sees']}: {summary(result)}"

