"""Gateway auth, request limits, the backend allow-list and schema fuzzing, on the gateway app
configured through one explicit settings object (in this process, Flask's test client); the
trainer client's token and a chunked body's limit go over HTTP to a real gunicorn configured
through PRORL_* variables."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from api import create_app
from api.openapi import openapi_document
from tests.support.app import close_app, make_app
from tests.support.services import start_gateway

MAX_BYTES = 64 * 1024
SPEC = openapi_document()
#: every operation of the OpenAPI document, with the token scheme it declares
OPERATIONS = [(path, method.upper(), op["security"]) for path, ops in SPEC["paths"].items()
              for method, op in ops.items()]
ADMIN_OPERATIONS = [(path, method) for path, method, security in OPERATIONS if security == [{"adminToken": []}]]
GUARDED_OPERATIONS = [(path, method) for path, method, security in OPERATIONS if security]
SECURED = {"api_token": "user-secret", "admin_token": "admin-secret",
           "backend_allowlist": "127.0.0.0/8,gpu-node-1", "max_request_bytes": MAX_BYTES}


def concrete(path: str) -> str:
    return path.replace("{job_id}", "some-job").replace("{node}", "some-node")


@pytest.fixture(scope="module")
def secured_app(cluster):
    app = make_app(cluster, **SECURED)
    yield app
    close_app(app)


@pytest.fixture
def secured(secured_app):
    from handlers import registry
    settings = secured_app.extensions["prorl"].settings
    registry.configure(settings.handlers, **settings.handler_options())  # process-wide: others reset it
    return secured_app.test_client()


@pytest.fixture(scope="module")
def secured_url(cluster, tmp_path_factory):
    """The same settings as environment variables of a real gunicorn."""
    env = {f"PRORL_{name.upper()}": str(value) for name, value in SECURED.items()}
    url, gateway = start_gateway(cluster, tmp_path_factory.mktemp("secured"), "secured-gateway", env)
    yield url
    gateway.stop()


def call(client, method: str, path: str, token: str | None = None, **kwargs):
    headers = {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    return client.open(path, method=method, headers=headers, **kwargs)


def call_http(url: str, method: str, path: str, token: str | None = None, **kwargs) -> httpx.Response:
    headers = {**kwargs.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx.request(method, url + path, headers=headers, timeout=60, **kwargs)


def test_tokens_guard_jobs_and_cluster_controls(secured):
    job = {"instance": {"data_source": "fault"}}
    assert call(secured, "GET", "/healthz").status_code == 200
    assert call(secured, "GET", "/metrics").status_code == 200
    missing = call(secured, "POST", "/process", json=job)
    assert missing.status_code == 401 and missing.json["code"] == "unauthorized"
    assert call(secured, "POST", "/process", "wrong", json=job).status_code == 401
    assert call(secured, "POST", "/process", "user-secret", json=job).json["status"] == "completed"
    forbidden = call(secured, "POST", "/stop", "user-secret")
    assert forbidden.status_code == 403 and "admin token" in forbidden.json["message"]
    assert call(secured, "GET", "/status", "admin-secret").status_code == 200


def test_backend_allow_list(secured):
    allowed = call(secured, "POST", "/add_llm_server", "admin-secret", json={"address": "http://127.0.0.9:8000/v1"})
    named = call(secured, "POST", "/add_llm_server", "admin-secret", json={"address": "http://gpu-node-1:8000/v1"})
    refused = call(secured, "POST", "/add_llm_server", "admin-secret", json={"address": "http://10.1.2.3:8000/v1"})
    assert (allowed.status_code, named.status_code) == (200, 200)
    assert refused.status_code == 403 and "PRORL_BACKEND_ALLOWLIST" in refused.json["message"]
    assert call(secured, "POST", "/clear_llm_server", "admin-secret").status_code == 200


def test_client_sends_its_token(secured_url):
    from prorl_celery.trainer.client import RolloutClient
    with RolloutClient(secured_url, token="user-secret") as client:
        assert client.process({"data_source": "fault"})["status"] == "completed"


def test_the_openapi_document_lists_every_route_and_the_auth_sets():
    """A route added without a document entry would escape the parametrized checks below.

    The browser dashboard (blueprint ``dashboard``: HTML pages behind its own cookie login) is
    not part of the JSON API the document describes.
    """
    routes = {(rule.rule.replace("<job_id>", "{job_id}").replace("<node>", "{node}"), method)
              for rule in create_app().url_map.iter_rules()
              if rule.endpoint != "static" and not rule.endpoint.startswith("dashboard.")
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    assert routes == {(path, method) for path, method, _ in OPERATIONS}
    assert {path for path, _ in ADMIN_OPERATIONS} == {"/start", "/stop", "/add_llm_server", "/clear_llm_server",
                                                      "/llm_servers/version", "/nodes/{node}/drain",
                                                      "/nodes/{node}/undrain"}
    assert {path for path, _, security in OPERATIONS if not security} == {"/healthz", "/metrics"}


@pytest.mark.parametrize("path,method", ADMIN_OPERATIONS)
@pytest.mark.parametrize("token,status", [(None, 401), ("wrong", 401), ("user-secret", 403)])
def test_every_admin_endpoint_needs_the_admin_token(secured, path, method, token, status):
    response = call(secured, method, concrete(path), token, json={"address": "http://127.0.0.9:8000/v1"})
    assert response.status_code == status, response.text
    assert response.json["code"] == {401: "unauthorized", 403: "forbidden"}[status]
    assert call(secured, "GET", "/status", "admin-secret").json["state"] == "started"  # /stop did not act


@pytest.mark.parametrize("path,method", GUARDED_OPERATIONS)
def test_every_guarded_endpoint_refuses_a_missing_token(secured, path, method):
    response = call(secured, method, concrete(path), json={"job_id": "x"})
    assert response.status_code == 401 and response.json["code"] == "unauthorized", response.text


def test_admin_token_opens_the_admin_endpoints(secured):
    for path, method in sorted(ADMIN_OPERATIONS, key=lambda op: op[0] == "/start"):  # /start last
        body = {"/add_llm_server": {"address": "http://127.0.0.9:8000/v1"},
                "/llm_servers/version": {"version": 1}}.get(path)
        response = call(secured, method, concrete(path), "admin-secret", json=body)
        # a node nobody has seen: the admin token got past auth to the route's own answer
        assert response.status_code == (404 if path.startswith("/nodes/") else 200), (path, response.text)
    assert call(secured, "GET", "/status", "admin-secret").json["state"] == "started"  # /start ran last


BIG = b'{"instance": {"data_source": "fault", "pad": "' + b"x" * MAX_BYTES + b'"}}'
SMALL = {"instance": {"data_source": "fault", "pad": "x" * 1000}}


def test_oversized_body_gets_413_in_the_error_format(secured):
    response = call(secured, "POST", "/jobs", "user-secret", data=BIG, headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json["code"] == "payload_too_large"
    small = call(secured, "POST", "/jobs", "user-secret", json=SMALL)
    assert small.status_code == 202, small.text


def test_oversized_chunked_body_gets_413_in_the_error_format(secured_url):
    """A body without a length: how it reaches the app (wsgi.input_terminated) is gunicorn's."""
    content = iter([BIG[i:i + 8192] for i in range(0, len(BIG), 8192)])
    response = call_http(secured_url, "POST", "/jobs", "user-secret", content=content,
                         headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json()["code"] == "payload_too_large"
    small = call_http(secured_url, "POST", "/jobs", "user-secret", json=SMALL)
    assert small.status_code == 202, small.text


ADMIN = {"Authorization": "Bearer admin-secret"}


@pytest.fixture
def gateway_schema(secured, secured_app):
    return schemathesis.openapi.from_wsgi("/openapi.json", secured_app, headers=ADMIN)


fuzzed = schemathesis.pytest.from_fixture("gateway_schema")


@fuzzed.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_schema_fuzzing_finds_no_server_error(case, secured):
    """Generated requests (valid and invalid per the document) never get a 5xx."""
    response = case.call(headers=ADMIN)
    if case.path == "/stop":  # a stopped service answers 503 by design; start it again
        assert call(secured, "POST", "/start", "admin-secret").status_code == 200
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}"
    content_type = "".join(response.headers.get("content-type", []))
    if response.status_code >= 400 and content_type.startswith("application/json"):
        assert {"code", "message"} <= set(response.json()), response.text[:500]
