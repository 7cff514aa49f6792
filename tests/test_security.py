"""Gateway auth and the backend allow-list, on a real gunicorn configured through PRORL_* variables."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from prorl_celery.local import ManagedProcess, free_port, wait_until


@pytest.fixture
def secured(cluster, tmp_path):
    port = free_port()
    env = {**cluster.service_env(), "PRORL_API_TOKEN": "user-secret", "PRORL_ADMIN_TOKEN": "admin-secret",
           "PRORL_BACKEND_ALLOWLIST": "127.0.0.0/8,gpu-node-1"}
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "-w", "1",
                                  "-b", f"127.0.0.1:{port}", "api:create_app()"], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    gateway = ManagedProcess("secured-gateway", popen, log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/healthz").status_code == 200, 60, "secured gateway", gateway)
    yield url
    gateway.stop()


def call(url: str, method: str, path: str, token: str | None = None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, url + path, headers=headers, timeout=60, **kwargs)


def test_tokens_guard_jobs_and_cluster_controls(secured):
    job = {"instance": {"data_source": "fault"}}
    assert call(secured, "GET", "/healthz").status_code == 200
    assert call(secured, "GET", "/metrics").status_code == 200
    missing = call(secured, "POST", "/process", json=job)
    assert missing.status_code == 401 and missing.json()["code"] == "unauthorized"
    assert call(secured, "POST", "/process", "wrong", json=job).status_code == 401
    assert call(secured, "POST", "/process", "user-secret", json=job).json()["status"] == "completed"
    forbidden = call(secured, "POST", "/stop", "user-secret")
    assert forbidden.status_code == 403 and "admin token" in forbidden.json()["message"]
    assert call(secured, "GET", "/status", "admin-secret").status_code == 200


def test_backend_allow_list(secured):
    allowed = call(secured, "POST", "/add_llm_server", "admin-secret", json={"address": "http://127.0.0.9:8000/v1"})
    named = call(secured, "POST", "/add_llm_server", "admin-secret", json={"address": "http://gpu-node-1:8000/v1"})
    refused = call(secured, "POST", "/add_llm_server", "admin-secret", json={"address": "http://10.1.2.3:8000/v1"})
    assert (allowed.status_code, named.status_code) == (200, 200)
    assert refused.status_code == 403 and "PRORL_BACKEND_ALLOWLIST" in refused.json()["message"]
    call(secured, "POST", "/clear_llm_server", "admin-secret").raise_for_status()


def test_client_sends_its_token(secured):
    from prorl_celery.client import RolloutClient
    with RolloutClient(secured, token="user-secret") as client:
        assert client.process({"data_source": "fault"})["status"] == "completed"
