"""A service on a password-protected Redis and on Redis over TLS, configured by the URL alone;
and no secret of the service visible inside a job's sandbox.

Each test module starts its own redis-server and LocalCluster (gateway + one worker per stage)
whose every process gets the URL with the password (broker and job state both authenticated)
and the gateway tokens in its environment.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess, free_port, wait_until
from prorl_celery.state.connection import broker_ssl_options

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "redis-pa55-word"
SECRETS = {"PRORL_API_TOKEN": "user-secret-7f3a", "PRORL_ADMIN_TOKEN": "admin-secret-91bc"}
JOB_TOKEN = {"Authorization": f"Bearer {SECRETS['PRORL_API_TOKEN']}"}
HANDLERS = "fault=tests.support.handlers:FaultHandler,envprobe=tests.support.env_probe:EnvProbeHandler"


def start_redis(binary: str, args: list[str], log_dir: Path, ping_url: str) -> ManagedProcess:
    log = log_dir / "redis.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *args],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    process = ManagedProcess("redis", popen, log)
    wait_until(lambda: redis.Redis.from_url(ping_url).ping(), 20, "redis-server", process)
    return process


def small_cluster(redis_url: str, log_dir: Path) -> LocalCluster:
    env = {"PRORL_HANDLERS": HANDLERS, **SECRETS,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return LocalCluster(redis_url=redis_url, env=env, gateway_workers=1, log_dir=log_dir,
                        concurrency={Stage.INIT: 2, Stage.RUN: 2, Stage.EVAL: 2})


def process(cluster: LocalCluster, instance: dict) -> dict:
    response = httpx.post(cluster.gateway_url + "/process", json={"instance": instance}, headers=JOB_TOKEN,
                          timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def password_cluster(tmp_path_factory):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is required (apt-get install redis-server)")
    log_dir = tmp_path_factory.mktemp("redis-auth")
    port = free_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}"
    server = start_redis(binary, ["--port", str(port), "--requirepass", PASSWORD], log_dir, url)
    try:
        with small_cluster(url, log_dir) as cluster:
            yield cluster
    finally:
        server.stop()


def test_a_job_runs_with_a_password_protected_redis(password_cluster):
    assert PASSWORD in password_cluster.broker_url and PASSWORD in password_cluster.state_url
    result = process(password_cluster, {"data_source": "fault", "reward": 0.5})
    assert (result["status"], result["reward"]) == ("completed", 0.5), result
    port = int(password_cluster.state_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(redis.AuthenticationError):  # the server really refuses clients without it
        redis.Redis(host="127.0.0.1", port=port).ping()


def test_no_service_secret_is_visible_inside_a_sandbox(password_cluster):
    run_worker = next(p for p in password_cluster.processes if p.name.startswith("run"))
    worker_env = Path(f"/proc/{run_worker.popen.pid}/environ").read_bytes().decode(errors="replace")
    secrets = [*SECRETS.values(), PASSWORD]
    assert all(secret in worker_env for secret in secrets)  # the worker holds them all ...
    result = process(password_cluster, {"data_source": "envprobe"})
    assert result["status"] == "completed", result
    seen = result["artifacts"]["env"]
    assert "PATH=" in seen and "HOME=" in seen, seen  # the probe did read the environment
    assert not [secret for secret in secrets if secret in seen], seen  # ... the sandbox none
    names = {line.split("=", 1)[0] for line in seen.splitlines() if "=" in line}
    assert not {name for name in names if name.startswith(("PRORL_", "CELERY", "REDIS"))} - {"PRORL_SANDBOX_ADDRESS"}


def test_rediss_urls_verify_the_certificate_by_default():
    assert broker_ssl_options("redis://h:1/0") is None
    assert broker_ssl_options("rediss://h:1/0")["ssl_cert_reqs"].name == "CERT_REQUIRED"
    options = broker_ssl_options("rediss://:p@h:1/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem")
    assert options["ssl_ca_certs"] == "/ca.pem" and options["ssl_certfile"] == "/c.pem"
    assert broker_ssl_options("rediss://h:1/0?ssl_cert_reqs=CERT_NONE")["ssl_cert_reqs"].name == "CERT_NONE"
    with pytest.raises(ValueError, match="ssl_cert_reqs"):
        broker_ssl_options("rediss://h:1/0?ssl_cert_reqs=maybe")


# -- TLS ----------------------------------------------------------------------------------------------

def tls_redis_server() -> str | None:
    """A redis-server built with TLS (the PATH one may be a wheel's build without it)."""
    for binary in dict.fromkeys(filter(None, [shutil.which("redis-server"), "/usr/bin/redis-server"])):
        try:
            probe = subprocess.run([binary, "--port", "0", "--tls-port", "0", "--save", ""], capture_output=True,
                                   text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "Bad directive" not in probe.stdout + probe.stderr:
            return binary
    return None


def make_certificates(directory: Path, name: str = "ca") -> dict[str, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 signed by it (openssl CLI)."""
    files = {k: directory / f"{name}-{k}" for k in ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr",
                                                   "ext.cnf")}
    files["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=prorl-test-{name}",
            "-keyout", str(files["ca.key"]), "-out", str(files["ca.pem"]))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(files["server.key"]),
            "-out", str(files["server.csr"]))
    openssl("x509", "-req", "-in", str(files["server.csr"]), "-CA", str(files["ca.pem"]), "-CAkey",
            str(files["ca.key"]), "-CAcreateserial", "-days", "2", "-extfile", str(files["ext.cnf"]),
            "-out", str(files["server.pem"]))
    return files


def broker_connects(url: str) -> subprocess.CompletedProcess:
    """Whether the service's Celery app (kombu) connects to the broker at ``url``, in a fresh process."""
    code = ("from prorl_celery.celery_app import app\n"
            "with app.connection_for_write() as c: c.ensure_connection(max_retries=1)\n"
            "print('connected')")
    env = {**os.environ, "PRORL_REDIS_URL": url, "PRORL_BROKER_URL": url}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    binary = tls_redis_server()
    if binary is None:
        pytest.skip("no redis-server built with TLS here (--tls-port is a bad directive): TLS URL test skipped")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the test certificates")
    directory = tmp_path_factory.mktemp("redis-tls")
    certs = make_certificates(directory)
    port = free_port()
    url = (f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_cert_reqs=required"
           f"&ssl_ca_certs={certs['ca.pem']}")
    server = start_redis(binary, ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs["server.pem"]),
                                  "--tls-key-file", str(certs["server.key"]), "--tls-ca-cert-file",
                                  str(certs["ca.pem"]), "--tls-auth-clients", "no", "--requirepass", PASSWORD],
                         directory, url)
    yield url, directory, port
    server.stop()


def test_a_job_runs_over_tls_with_a_verified_certificate(tls_redis):
    url, directory, port = tls_redis
    with small_cluster(url, directory) as cluster:
        assert cluster.broker_url.startswith("rediss://") and "ssl_ca_certs=" in cluster.broker_url
        result = process(cluster, {"data_source": "fault", "reward": 0.25})
        assert (result["status"], result["reward"]) == ("completed", 0.25), result
        status = httpx.get(cluster.gateway_url + "/status", headers=cluster.auth_headers()).json()
        assert {w["queues"][0] for w in status["workers"]} >= {"init", "run", "eval"}


def test_tls_certificate_of_another_ca_is_refused(tls_redis):
    url, directory, port = tls_redis
    other = make_certificates(directory, "other")
    wrong = url.split("ssl_ca_certs=")[0] + f"ssl_ca_certs={other['ca.pem']}"
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(wrong).ping()
    refused = broker_connects(wrong)
    assert refused.returncode != 0 and "certificate verify failed" in refused.stderr, refused.stderr[-2000:]
    accepted = broker_connects(url)
    assert accepted.returncode == 0 and "connected" in accepted.stdout, accepted.stderr[-2000:]
    plain = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"  # the TLS port does not speak plain Redis
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(plain, socket_timeout=5).ping()
