"""Real processes for the integration tests: redis-server, scripted LLM servers, gunicorn and
Celery workers for init, run and eval, all on loopback ports, started once per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from tests.support.services import ROOT, Gateway, LLMServer, rules_file, settle, start_llm_server, start_redis

pytest_plugins = ["tests.conftest_llm"] if (Path(__file__).parent / "conftest_llm.py").exists() else []


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    url, handle = start_redis(tmp_path_factory.mktemp("redis"), "redis", "--maxclients", "10000")
    yield url
    handle.stop()


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> str:
    from prorl_celery.dev.devmodels import ensure_tokenizer
    return str(ensure_tokenizer("qwen3"))


@pytest.fixture(scope="session")
def qwen3_hf_tokenizer(qwen3_tokenizer):
    """The Qwen3 fixture tokenizer loaded by transformers: tests decode a server's prompts with it."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(qwen3_tokenizer)


@pytest.fixture(scope="session")
def llama3_tokenizer() -> str:
    from prorl_celery.dev.devmodels import ensure_tokenizer
    return str(ensure_tokenizer("llama3"))


@pytest.fixture(scope="session")
def llm_servers(qwen3_tokenizer, tmp_path_factory) -> list[LLMServer]:
    """Two scripted backends with the same rules (routing, balance and clearing tests)."""
    log_dir = tmp_path_factory.mktemp("llm")
    servers = [start_llm_server(qwen3_tokenizer, log_dir, f"llm{i}", token_delay=0.002, wait=False) for i in range(2)]
    try:
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.process.stop()
        raise
    yield servers
    for server in servers:
        server.process.stop()


@pytest.fixture(scope="session")
def random_llm_servers(qwen3_tokenizer, llama3_tokenizer, tmp_path_factory) -> dict[str, LLMServer]:
    """Scripted servers without rules (random ids from the prompt and the request's seed), one per
    tokenizer fixture, by its name; started side by side. A test that reads a log resets it."""
    log_dir = tmp_path_factory.mktemp("random-llm")
    servers = {name: start_llm_server(tokenizer, log_dir, f"random-{name}", rules=rules_file([]), wait=False)
               for name, tokenizer in (("qwen3", qwen3_tokenizer), ("llama3", llama3_tokenizer))}
    try:
        for server in servers.values():
            server.wait_ready()
    except BaseException:
        for server in servers.values():
            server.process.stop()
        raise
    yield servers
    for server in servers.values():
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
           "PRORL_BACKEND_WAIT_POLL_S": "0.1", "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5",
           "PRORL_VISIBILITY_TIMEOUT_S": "10",
           "PRORL_SHUTDOWN_GRACE_S": "1"}
    local = LocalCluster(redis_url=redis_url, tokenizer=qwen3_tokenizer, env=env, gateway_workers=1,
                         concurrency={Stage.INIT: 4, Stage.RUN: 8, Stage.EVAL: 4},
                         log_dir=tmp_path_factory.mktemp("cluster"))
    with local:
        yield local


@pytest.fixture
def gateway(cluster: LocalCluster) -> Gateway:
    """A clean service for each test: state flushed (the broker DB is kept), started, no backends;
    afterwards its jobs cancelled and their sandboxes stopped (``settle``)."""
    redis.Redis.from_url(cluster.state_url).flushdb()
    with Gateway(cluster) as client:
        yield client
        settle(cluster, lambda path: client.post(path).status_code)


@pytest.fixture
def backend(gateway, llm_servers) -> LLMServer:
    """The first scripted server, its log cleared, registered with the clean gateway."""
    server = llm_servers[0]
    server.reset()
    gateway.post("/add_llm_server", json={"address": server.address()}).raise_for_status()
    return server


@pytest.fixture(scope="session")
def gateway_app(cluster: LocalCluster):
    """The gateway app in this process, with the cluster's settings as one explicit object."""
    from tests.support.app import close_app, make_app
    app = make_app(cluster)
    yield app
    close_app(app)


@pytest.fixture
def app_gateway(cluster: LocalCluster, gateway_app):
    """As ``gateway``, through Flask's test client of ``gateway_app`` instead of gunicorn."""
    from handlers import registry
    redis.Redis.from_url(cluster.state_url).flushdb()
    settings = gateway_app.extensions["prorl"].settings
    registry.configure(settings.handlers, **settings.handler_options())  # process-wide: others reset it
    client = gateway_app.test_client()
    client.cluster = cluster
    yield client
    settle(cluster, lambda path: client.post(path).status_code)


# The split is by folder: tests/integration/ starts processes (redis-server, workers, gunicorn,
# LLM servers, sandboxes, a python -c), tests/unit/ never does (tests/unit/conftest.py checks it).
# The marker follows the folder, so `-m "not integration"` and `pytest tests/unit` are one set.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.path)).parts:
            item.add_marker(pytest.mark.integration)
