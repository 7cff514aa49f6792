"""Several nodes on one machine: Redis and the gateway on the first, INIT/RUN/EVAL workers with
their own ``PRORL_NODE`` on every node, an LLM server reachable from all of them.

A node is a name, the address its processes use, and a command prefix: empty on loopback,
``ip netns exec <ns>`` for a network namespace (``tests/support/netns.py``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from prorl_celery.dev.local import ManagedProcess, free_port, redis_server_binary, wait_until
from tests.support.services import RULES

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Node:
    name: str
    host: str  # the address this node's servers listen on (Redis and gateway: node 0 only)
    prefix: list[str] = field(default_factory=list)  # command prefix placing a process on the node
    workers: list[ManagedProcess] = field(default_factory=list)


@dataclass
class MultiNodeCluster:
    nodes: list[Node]
    log_dir: Path
    env: dict[str, str]
    pools: dict[str, int]  # worker processes per node: queues ("init", "init,run,eval") -> threads
    llm_url: str | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    gateway_url: str = ""
    state_url: str = ""

    def __enter__(self) -> MultiNodeCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        head = self.nodes[0]
        port = free_port()
        binary = redis_server_binary()
        assert binary, "redis-server is required"
        redis_process = self._spawn(head, "redis", [binary, "--port", str(port), "--bind", head.host, "--save", "",
                                                    "--appendonly", "no", "--maxclients", "10000"])
        base = f"redis://{head.host}:{port}"
        self.state_url = base + "/1"
        wait_until(lambda: redis.Redis.from_url(base).ping(), 20, "redis-server", redis_process)
        self.gateway_url = f"http://{head.host}:{free_port()}"
        gateway = self._spawn(head, "gateway", [sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf",
                                                "-w", "1", "-b", self.gateway_url.removeprefix("http://"),
                                                "api:create_app()"])
        for node in self.nodes:
            self.start_workers(node)
        wait_until(lambda: httpx.get(self.gateway_url + "/healthz").status_code == 200, 60, "gateway", gateway)
        self.wait_for_workers()
        if self.llm_url:
            httpx.post(self.gateway_url + "/add_llm_server",
                       json={"address": self.llm_url, "type": "vllm"}).raise_for_status()

    def service_env(self, node: Node) -> dict[str, str]:
        base = self.state_url.removesuffix("/1")
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                "PRORL_REDIS_URL": self.state_url, "PRORL_BROKER_URL": base + "/0", "PRORL_NODE": node.name,
                "PRORL_SANDBOX_DIR": str(self.log_dir / f"sandboxes-{node.name}"), **self.env}

    def start_workers(self, node: Node) -> None:
        """One worker process per pool on ``node``, named ``<queues>-<node>``."""
        for queues, count in self.pools.items():
            name = f"{queues.replace(',', '+')}-{node.name}"
            node.workers.append(self._spawn(node, name, [
                sys.executable, "-m", "celery", "-A", "prorl_celery", "worker", "-Q", queues, "-c", str(count),
                "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "info"]))

    def wait_for_workers(self, timeout_s: float = 120) -> None:
        expected = {w.name for node in self.nodes for w in node.workers}

        def all_seen() -> bool:
            seen = {w["name"].split("@")[0] for w in httpx.get(self.gateway_url + "/status").json()["workers"]}
            return expected <= seen
        wait_until(all_seen, timeout_s, f"workers {sorted(expected)}")

    def kill_node(self, node: Node) -> None:
        """SIGKILL every process of ``node`` (no shutdown hook runs: a crash, not a stop)."""
        for worker in node.workers:
            try:
                os.killpg(worker.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for worker in node.workers:
            worker.popen.wait(10)

    def _spawn(self, node: Node, name: str, command: list[str]) -> ManagedProcess:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen([*node.prefix, *command], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.service_env(node), start_new_session=True,
                                     cwd=ROOT)
        process = ManagedProcess(name, popen, log_path)
        self.processes.append(process)
        return process

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to every process at once, SIGKILL to what is left after ``grace_s``; Redis last."""
        redis_last = sorted(self.processes, key=lambda process: process.name == "redis")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for process in redis_last[:-1]:
                if process.popen.poll() is None:
                    try:
                        os.killpg(process.popen.pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + grace_s
            for process in redis_last[:-1]:
                try:
                    process.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        if redis_last:
            redis_last[-1].stop(grace_s)
        self.processes.clear()


def start_llm(tokenizer: str, host: str, log_dir: Path) -> tuple[ManagedProcess, str]:
    """The scripted LLM server; not waited for (it loads while the cluster starts)."""
    port = free_port()
    log = log_dir / "llm.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(RULES),
                                  "--tokenizer", tokenizer, "--host", host, "--port", str(port)],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return ManagedProcess("llm", popen, log), f"http://{host}:{port}/v1"


def wait_for_llm(process: ManagedProcess, url: str) -> None:
    health = url.removesuffix("/v1") + "/health"
    wait_until(lambda: httpx.get(health).status_code == 200, 120, "LLM server", process)
