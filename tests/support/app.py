"""The gateway app in the test process (``create_app(settings)`` and Flask's test client), on
the test cluster's Redis, broker and workers: no gunicorn, no socket between test and app.

Tests of gunicorn itself (worker class, timeouts, concurrency, long ``/process`` waits, chunked
bodies, restarts) keep the cluster's real gateway (the ``gateway`` fixture)."""
from __future__ import annotations

from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from api import create_app
from prorl_celery.core.settings import Settings
from prorl_celery.dev.local import LocalCluster, wait_until


def cluster_settings(cluster: LocalCluster, **overrides: Any) -> Settings:
    """The settings the cluster's processes read from their ``PRORL_*`` environment, as one
    object, with ``overrides`` (``api_token=...``) on top."""
    env = cluster.service_env()
    fields = {name: env[f"PRORL_{name.upper()}"] for name in Settings.model_fields if f"PRORL_{name.upper()}" in env}
    return Settings(**{**fields, **overrides})


def make_app(cluster: LocalCluster, **overrides: Any) -> Flask:
    app = create_app(cluster_settings(cluster, **overrides))
    app.test_client_class = AppGateway
    return app


def close_app(app: Flask) -> None:
    app.extensions["prorl"].close()


class AppGateway(FlaskClient):
    """Flask's test client with the few calls most tests make (as ``conftest.Gateway``)."""

    cluster: LocalCluster

    def process(self, instance: dict, **fields: Any) -> dict:
        response = self.post("/process", json={"instance": instance, **fields})
        assert response.status_code == 200, response.text
        return response.json

    def submit(self, instance: dict, **fields: Any) -> str:
        response = self.post("/jobs", json={"instance": instance, **fields})
        assert response.status_code == 202, response.text
        return response.json["job_id"]

    def result(self, job_id: str, wait: float = 60) -> dict:
        response = self.get(f"/jobs/{job_id}", query_string={"wait": wait})
        assert response.status_code == 200, f"job {job_id} not finished: {response.text}"
        return response.json

    def wait_for_stage(self, job_id: str, status: str, timeout_s: float = 30) -> None:
        wait_until(lambda: self.get(f"/jobs/{job_id}").json.get("status") == status, timeout_s,
                   f"job {job_id} in {status}")
