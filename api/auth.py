"""Bearer-token auth of the gateway, on when tokens are configured.

``PRORL_API_TOKEN`` guards the job endpoints, ``PRORL_ADMIN_TOKEN`` the cluster controls
(``/start``, ``/stop``, ``/add_llm_server``, ``/clear_llm_server``); the admin token also opens the
job endpoints. ``/healthz`` and ``/metrics`` stay open for probes and scrapers.
"""
from __future__ import annotations

import hmac

from flask import Flask, request

from prorl_celery.errors import Forbidden, Unauthorized
from prorl_celery.settings import Settings

OPEN = frozenset({"/healthz", "/metrics"})
ADMIN = frozenset({"/start", "/stop", "/add_llm_server", "/clear_llm_server"})


def _presented() -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _matches(token: str, expected: str | None) -> bool:
    return bool(expected) and hmac.compare_digest(token.encode(), expected.encode())


def install(app: Flask, settings: Settings) -> None:
    if not (settings.api_token or settings.admin_token):
        return

    @app.before_request
    def _check_token() -> None:
        if request.path in OPEN:
            return
        token = _presented()
        if not token:
            raise Unauthorized("this gateway needs 'Authorization: Bearer <token>'")
        if _matches(token, settings.admin_token):
            return
        if request.path in ADMIN:
            raise Forbidden(f"{request.path} needs the admin token")
        if not _matches(token, settings.api_token):
            raise Unauthorized("the bearer token is not valid")
