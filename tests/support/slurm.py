"""A real Slurm cluster on one machine: munge, ``slurmctld`` and one ``slurmd`` per node.

Two layouts, and the cluster says which it ran (``layout``):

- ``netns`` (where network namespaces can be made, ``tests/support/netns.py``): each node is a
  network namespace on a bridge with its own address, and its ``slurmd`` runs in its own UTS and
  mount namespaces too, so that the node has its own hostname (``slurm-n<i>``) and an
  ``/etc/hosts`` that names every node, as a real cluster's nodes do. Everything a job starts
  (the batch script, ``srun`` steps, workers, sandboxes) inherits the node's namespaces. The
  controller runs in the root namespace on the bridge's address, where the test (the trainer
  outside the allocation) runs too.
- ``single``: one node, this machine's hostname on loopback, with the same CPU count.

Slurm's configuration is built for a machine without cgroups or accounting: process tracking by
``/proc`` (``proctrack/linuxproc``: every descendant of a step, also one in a new session),
``task/none``, ``select/cons_tres``, nodes that claim more CPUs than the machine has
(``SlurmdParameters=config_overrides``), every state directory under the cluster's own, and
``auth/munge`` through a munged of its own (its own key and socket). Client commands
(``sbatch``, ``squeue``, ``scancel``, ``scontrol``) find the cluster through ``SLURM_CONF`` in
``env()``.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from prorl_celery.dev.local import ManagedProcess, free_port, redis_server_binary, wait_until
from prorl_celery.state import keys
from tests.support.netns import Namespaces, NetnsUnavailable

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "deploy" / "slurm" / "prorl.sbatch"
DAEMONS = ("munged", "slurmctld", "slurmd")
#: CPUs each node claims: the project's sbatch script asks for 16 per task
NODE_CPUS = 16
#: seconds between SIGTERM and SIGKILL when a job ends (the deploy README's grace must be below)
KILL_WAIT_S = 30


class SlurmUnavailable(RuntimeError):
    """Slurm's or munge's daemons are not installed (the message names what is missing)."""


def missing_daemons() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmNode:
    name: str
    address: str
    prefix: list[str] = field(default_factory=list)  # places a process in the node's namespaces


@dataclass
class SlurmCluster:
    """``count`` nodes (namespaces where possible, else one node); a context manager."""

    root: Path
    count: int = 3
    use_netns: bool = True
    layout: str = ""
    nodes: list[SlurmNode] = field(default_factory=list)
    controller_address: str = "127.0.0.1"
    namespaces: Namespaces | None = None
    netns_problem: str = ""
    processes: list[ManagedProcess] = field(default_factory=list)
    #: sockets and spool directories: a short path, since slurmstepd's Unix sockets live in the
    #: spool directory and a socket's path has at most 108 bytes (pytest's tmp paths are longer)
    run_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="prorl-slurm-", dir="/tmp")))

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client command (and, through sbatch's --export=ALL, of the job)."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def __enter__(self) -> SlurmCluster:
        missing = missing_daemons()
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd "
                                   "slurm-client munge)")
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._place_nodes()
            self._start_munge()
            self._write_config()
            self._start_controller()
            for node in self.nodes:
                self._start_slurmd(node)
            self.wait_for_nodes()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- layout ----------------------------------------------------------------------------------

    def _place_nodes(self) -> None:
        if self.use_netns and self.count > 1:
            try:
                self.namespaces = Namespaces(self.count).__enter__()
            except NetnsUnavailable as error:
                self.netns_problem = str(error)
            else:
                self._check_unshare()
        if self.namespaces is not None:
            self.layout = "netns"
            self.controller_address = self.namespaces.root_address
            hosts = self.root / "hosts"
            lines = ["127.0.0.1 localhost", f"{self.controller_address} {socket.gethostname()}"]
            for index, address in enumerate(self.namespaces.addresses):
                name = f"slurm-n{index}"
                lines.append(f"{address} {name}")
                # own hostname and /etc/hosts per node: a private UTS and mount namespace
                script = f"hostname {name} && mount --bind {hosts} /etc/hosts && exec \"$@\""
                # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup tree slurmd
                # reads at start-up
                prefix = ["nsenter", f"--net=/run/netns/{self.namespaces.names[index]}", "unshare", "--uts",
                          "--mount", "--propagation", "private", "sh", "-c", script, "node"]
                self.nodes.append(SlurmNode(name, address, prefix))
            hosts.write_text("\n".join(lines) + "\n")
        else:
            self.layout = "single"
            self.nodes.append(SlurmNode(socket.gethostname().split(".")[0], "127.0.0.1"))

    def _check_unshare(self) -> None:
        assert self.namespaces is not None
        probe = subprocess.run(["nsenter", f"--net=/run/netns/{self.namespaces.names[0]}", "unshare", "--uts",
                                "--mount", "true"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            self.netns_problem = f"unshare --uts --mount failed: {probe.stderr.strip()}"
            self.namespaces.close()
            self.namespaces = None

    # -- daemons ---------------------------------------------------------------------------------

    def _start_munge(self) -> None:
        munge = self.run_dir / "munge"
        munge.mkdir(mode=0o700, exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", [_binary("munged"), "--foreground", "--force", f"--key-file={key}",
                                f"--socket={self.munge_socket}", f"--pid-file={munge / 'munged.pid'}",
                                f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
        wait_until(self.munge_socket.exists, 20, "munged's socket")

    @property
    def munge_socket(self) -> Path:
        return self.run_dir / "munge" / "munge.socket"

    def _write_config(self) -> None:
        state = self.run_dir / "state"
        (state / "ctld").mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (state / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        ctld_port = free_port(self.controller_address)
        # every node has its own address in the netns layout, so they share one slurmd port
        slurmd_port = free_port(self.controller_address if self.layout == "single" else "127.0.0.1")
        host = socket.gethostname().split(".")[0]
        node_lines = [f"NodeName={node.name} NodeHostname={node.name} NodeAddr={node.address} "
                      f"CPUs={NODE_CPUS} RealMemory=4000 State=UNKNOWN" for node in self.nodes]
        self.conf.write_text("\n".join([
            "ClusterName=prorltest",
            f"SlurmctldHost={host}({self.controller_address})",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={state / 'ctld'}",
            f"SlurmdSpoolDir={state / 'spool'}/%n",
            f"SlurmctldPidFile={state / 'slurmctld.pid'}",
            f"SlurmdPidFile={state / 'spool'}/%n/slurmd.pid",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # no cgroups here: track a step's processes through /proc (descendants, also those
            # in a session of their own), and leave CPU binding alone
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            # nodes claim NODE_CPUS whatever this machine has
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            f"KillWait={KILL_WAIT_S}",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            *node_lines,
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        ]) + "\n")

    def _start_controller(self) -> None:
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        wait_until(lambda: self.run("scontrol", "ping", check=False).returncode == 0, 30, "slurmctld",
                   self.processes[-1])

    def _start_slurmd(self, node: SlurmNode) -> None:
        self._spawn(f"slurmd-{node.name}", [*node.prefix, _binary("slurmd"), "-D", "-N", node.name,
                                             "-f", str(self.conf)])

    def wait_for_nodes(self, timeout_s: float = 60) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return all(states.get(node.name, "").startswith("idle") for node in self.nodes)
        wait_until(idle, timeout_s, f"{len(self.nodes)} idle Slurm nodes")

    def _spawn(self, name: str, command: list[str]) -> ManagedProcess:
        log_path = self.root / f"{name}.out"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env(), start_new_session=True)
        process = ManagedProcess(name, popen, log_path)
        self.processes.append(process)
        return process

    # -- clients ---------------------------------------------------------------------------------

    def run(self, *command: str, check: bool = True, env: dict[str, str] | None = None,
            cwd: Path | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(command), capture_output=True, text=True, env=env or self.env(), cwd=cwd,
                              timeout=timeout_s)
        if check and done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def job_state(self, job_id: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETING, CANCELLED, TIMEOUT, ...)."""
        out = self.run("scontrol", "show", "job", job_id, "-o", check=False).stdout
        for item in out.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
        return "GONE"

    def close(self) -> None:
        """Cancel every job, stop the daemons (slurmd first), remove the namespaces."""
        if any(p.name == "slurmctld" and p.popen.poll() is None for p in self.processes):
            self.run("scancel", "--full", "--user", "root", check=False, timeout_s=30)
            deadline = time.monotonic() + KILL_WAIT_S + 15
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.5)
        rank = {"munged": 2, "slurmctld": 1}  # the node daemons first, munge (everyone's auth) last
        for process in sorted(self.processes, key=lambda p: rank.get(p.name, 0)):
            if process.popen.poll() is None:
                try:
                    os.killpg(process.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    process.popen.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.popen.pid, signal.SIGKILL)
                    process.popen.wait(5)
        self.processes.clear()
        if self.namespaces is not None:
            self.namespaces.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


# -- the project's service on an allocation ---------------------------------------------------

def wait_for_job(slurm: SlurmCluster, job_id: str, states: set[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := slurm.job_state(job_id)) not in states:
        assert time.monotonic() < deadline, f"Slurm job {job_id} is {state}, not {states}, after {timeout_s} s"
        time.sleep(0.2)
    return state


class Service:
    """One allocation of ``prorl.sbatch`` and the trainer's view of it."""

    def __init__(self, slurm: SlurmCluster, env: dict[str, str], log_dir: Path, *options: str,
                 nodes: int | None = None) -> None:
        self.slurm, self.env = slurm, env
        nodes = nodes or len(slurm.nodes)
        self.url = f"http://{slurm.nodes[0].address}:{env['GATEWAY_PORT']}"
        started = time.monotonic()
        self.job = slurm.run("sbatch", "--parsable", "-N", str(nodes), *options, "-o",
                             str(log_dir / "prorl-%j.out"), str(SBATCH), env=env, cwd=ROOT).stdout.strip()
        self.log = log_dir / f"prorl-{self.job}.out"
        wait_until(self._answers, 180, f"the gateway of Slurm job {self.job} ({self.log})")
        self.up_s = time.monotonic() - started
        self.http = httpx.Client(base_url=self.url, timeout=120)
        workers = 3 * nodes
        wait_until(lambda: self._running() and len(self.http.get("/status").json()["workers"]) >= workers, 180,
                   f"{workers} workers ({self.log})")
        self.ready_s = time.monotonic() - started

    def _running(self) -> bool:
        state = self.slurm.job_state(self.job)
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise RuntimeError(f"Slurm job {self.job} is {state}: {self.log.read_text()[-3000:]}")
        return True

    def _answers(self) -> bool:
        self._running()
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def nodes(self) -> dict[str, dict]:
        return {n["node"]: n for n in self.http.get("/nodes").json()["nodes"]}

    def results(self, job_ids: list[str], timeout_s: float) -> dict[str, dict]:
        deadline = time.monotonic() + timeout_s
        out = {}
        for job_id in job_ids:
            response = self.http.get(f"/jobs/{job_id}", params={"wait": max(0.1, deadline - time.monotonic())})
            assert response.status_code == 200, f"job {job_id} did not end in time: {response.text}"
            out[job_id] = response.json()
        return out


def allocation_processes(slurm: SlurmCluster, job: str) -> list[str]:
    """The processes left of Slurm job ``job``: in the namespaces layout, every process in a node's
    network namespace but its slurmd (sandboxes included, whose environment is built from nothing);
    in the single-node layout, those whose environment names the job."""
    inodes = {os.stat(f"/run/netns/{name}").st_ino for name in slurm.namespaces.names} if slurm.namespaces else set()
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if inodes:
                if os.stat(f"/proc/{pid}/ns/net").st_ino in inodes and comm != "slurmd":
                    left.append(f"{pid} {comm}")
            elif f"SLURM_JOB_ID={job}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                left.append(f"{pid} {comm}")
        except OSError:
            continue
    return left


def statuses_on_disk(redis_dir: Path, job_ids: list[str], log_dir: Path) -> dict[str, str]:
    """Each job's status as the head's Redis left it in its append-only file."""
    port = free_port()
    binary = redis_server_binary()
    assert binary
    with open(log_dir / "redis-reader.log", "wb") as log:
        reader = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(redis_dir),
                                   "--appendonly", "yes", "--save", ""], stdout=log, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port, db=1, decode_responses=True)
        wait_until(lambda: client.ping(), 20, "redis-server on the head's file")
        return {job_id: client.hget(keys.job(job_id), "status") or "missing" for job_id in job_ids}
    finally:
        reader.terminate()
        reader.wait(10)


def service_env(slurm: SlurmCluster, work: Path, **overrides: str) -> dict[str, str]:
    """The environment ``prorl.sbatch`` is submitted with: the repository as PRORL_HOME, Redis's
    file and the sandboxes under ``work``, small pools (a 2-core machine runs every node), quick
    heartbeats, and the test handlers (this checkout on PYTHONPATH); in the single-node layout,
    free ports (every process shares this machine's network namespace)."""
    single = slurm.layout == "single"
    return slurm.env(**{
        # the test handlers are imported from this checkout's tests/ by the allocation's workers
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PRORL_HOME": str(ROOT), "PRORL_REDIS_DIR": str(work / "redis"), "PRORL_SANDBOX_DIR": str(work / "sandboxes"),
        "INIT_WORKERS": "2", "RUN_WORKERS": "4", "EVAL_WORKERS": "1", "PRORL_GATEWAY_WORKERS": "1",
        "PRORL_HEARTBEAT_S": "1", "PRORL_LEASE_S": "10", "PRORL_REAPER_INTERVAL_S": "1",
        "PRORL_SHUTDOWN_GRACE_S": "3", "PRORL_HANDLERS": "localfault=tests.support.handlers:LocalFaultHandler",
        "REDIS_PORT": str(free_port()) if single else "6379",
        "GATEWAY_PORT": str(free_port()) if single else "8080",
        "FLOWER_PORT": str(free_port()) if single else "5555", **overrides})
