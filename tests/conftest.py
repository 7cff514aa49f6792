"""Real processes for the integration tests: redis-server, scripted LLM servers, gunicorn and
Celery workers for init, run and eval, all on loopback ports, started once per session."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import redis

from prorl_celery.local import LocalCluster, ManagedProcess, free_port, wait_until
from prorl_celery.status import Stage

ROOT = Path(__file__).resolve().parent.parent
RULES = Path(__file__).parent / "data" / "llm_rules.json"

pytest_plugins = ["tests.conftest_llm"] if (Path(__file__).parent / "conftest_llm.py").exists() else []


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is required for the integration tests (apt-get install redis-server)")
    port = free_port()
    log = tmp_path_factory.mktemp("redis") / "redis.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--maxclients", "10000"],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    handle = ManagedProcess("redis", process, log)
    url = f"redis://127.0.0.1:{port}"
    wait_until(lambda: redis.Redis.from_url(url).ping(), 20, "redis-server", handle)
    yield url
    handle.stop()


class LLMServer:
    """A scripted LLM server process (vLLM/SGLang/llama.cpp protocols) and its request log."""

    def __init__(self, process: ManagedProcess, port: int) -> None:
        self.process, self.port = process, port
        self.base = f"http://127.0.0.1:{port}"

    def address(self, protocol: str = "vllm") -> str:
        return self.base + ("/v1" if protocol == "vllm" else "")

    def log(self) -> list[dict]:
        return httpx.get(self.base + "/_log").json()

    def reset(self) -> None:
        httpx.post(self.base + "/_reset").raise_for_status()


def start_llm_server(tokenizer: str, log_dir: Path, name: str, rules: Path = RULES,
                     token_delay: float = 0.0, max_model_len: int | None = None) -> LLMServer:
    port = free_port()
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "prorl_celery.llm.serve", "--scripted", str(rules),
                                  "--tokenizer", tokenizer, "--port", str(port), "--token-delay", str(token_delay),
                                  *(["--max-model-len", str(max_model_len)] if max_model_len else [])],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    process = ManagedProcess(name, popen, log)
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200, 120, name, process)
    return LLMServer(process, port)


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> str:
    from prorl_celery.devmodels import ensure_tokenizer
    return str(ensure_tokenizer("qwen3"))


@pytest.fixture(scope="session")
def llama3_tokenizer() -> str:
    from prorl_celery.devmodels import ensure_tokenizer
    return str(ensure_tokenizer("llama3"))


@pytest.fixture(scope="session")
def llm_servers(qwen3_tokenizer, tmp_path_factory) -> list[LLMServer]:
    """Two scripted backends with the same rules (routing, balance and clearing tests)."""
    log_dir = tmp_path_factory.mktemp("llm")
    servers = [start_llm_server(qwen3_tokenizer, log_dir, f"llm{i}", token_delay=0.002) for i in range(2)]
    yield servers
    for server in servers:
        server.process.stop()


@pytest.fixture(scope="session")
def tokenizers_dir(qwen3_tokenizer, tmp_path_factory) -> Path:
    """An operator's directory of tokenizers: the name a v1 trainer sends as custom_tokenizer
    ("Qwen/Qwen3-4B") resolves to the Qwen3 tokenizer fixture."""
    root = tmp_path_factory.mktemp("tokenizers")
    (root / "Qwen3-4B").symlink_to(qwen3_tokenizer, target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def cluster(redis_url, qwen3_tokenizer, tokenizers_dir, tmp_path_factory) -> LocalCluster:
    env = {"PRORL_HANDLERS": "fault=tests.support.handlers:FaultHandler", "PRORL_TOKENIZERS_DIR": str(tokenizers_dir),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PRORL_BACKEND_WAIT_POLL_S": "0.1", "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_VISIBILITY_TIMEOUT_S": "10",
           "PRORL_SHUTDOWN_GRACE_S": "1"}
    local = LocalCluster(redis_url=redis_url, tokenizer=qwen3_tokenizer, env=env, gateway_workers=1,
                         concurrency={Stage.INIT: 4, Stage.RUN: 8, Stage.EVAL: 4},
                         log_dir=tmp_path_factory.mktemp("cluster"))
    with local:
        yield local


class Gateway(httpx.Client):
    """An HTTP client on the gateway with the few calls most tests make."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(base_url=cluster.gateway_url, timeout=120)
        self.cluster = cluster

    def process(self, instance: dict, **fields) -> dict:
        response = self.post("/process", json={"instance": instance, **fields})
        assert response.status_code == 200, response.text
        return response.json()

    def submit(self, instance: dict, **fields) -> str:
        response = self.post("/jobs", json={"instance": instance, **fields})
        assert response.status_code == 202, response.text
        return response.json()["job_id"]

    def result(self, job_id: str, wait: float = 60) -> dict:
        response = self.get(f"/jobs/{job_id}", params={"wait": wait})
        assert response.status_code == 200, f"job {job_id} not finished: {response.text}"
        return response.json()

    def wait_for_stage(self, job_id: str, status: str, timeout_s: float = 30) -> None:
        wait_until(lambda: self.get(f"/jobs/{job_id}").json().get("status") == status, timeout_s,
                   f"job {job_id} in {status}")


@pytest.fixture
def gateway(cluster: LocalCluster) -> Gateway:
    """A clean service for each test: state flushed (the broker DB is kept), started, no backends."""
    redis.Redis.from_url(cluster.state_url).flushdb()
    with Gateway(cluster) as client:
        yield client


def rules_file(rules: list[dict]) -> Path:
    path = Path(tempfile.mkstemp(suffix=".json")[1])
    path.write_text(json.dumps(rules))
    return path


def eventually(check, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.05)
