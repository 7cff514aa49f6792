"""Bearer-token auth of the gateway, on when tokens are configured.

``PRORL_API_TOKEN`` guards the job endpoints, ``PRORL_ADMIN_TOKEN`` the cluster controls
(``/start``, ``/stop``, ``/add_llm_server``, ``/clear_llm_server``, ``/llm_servers/version``, and
draining a node: ``POST /nodes/<node>/drain`` and ``/undrain``);
the admin token also opens the job endpoints. ``/healthz`` and ``/metrics`` stay open for probes and scrapers.

Browsers sign in to the dashboard at ``/dashboard/login``, which keeps the token in an HttpOnly
cookie; only ``/dashboard`` paths accept that cookie. They are read-only, so a cookie the
browser sends by itself cannot be used to cancel, stop or submit anything.
"""
from __future__ import annotations

import hmac
from urllib.parse import quote

from flask import Flask, redirect, request

from prorl_celery.core.errors import Forbidden, Unauthorized
from prorl_celery.core.settings import Settings

DASHBOARD_PREFIX = "/dashboard"
DASHBOARD_COOKIE = "prorl_dashboard_token"
OPEN = frozenset({"/healthz", "/metrics", DASHBOARD_PREFIX + "/login"})
ADMIN = frozenset({"/start", "/stop", "/add_llm_server", "/clear_llm_server", "/llm_servers/version"})
#: POSTs under this prefix are admin actions too (a node's drain)
ADMIN_PREFIX = "/nodes/"


def needs_admin(path: str, method: str) -> bool:
    return path in ADMIN or (method == "POST" and path.startswith(ADMIN_PREFIX))


def _is_dashboard(path: str) -> bool:
    return path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")


def _presented() -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    return request.cookies.get(DASHBOARD_COOKIE, "") if _is_dashboard(request.path) else ""


def _matches(token: str, expected: str | None) -> bool:
    if not expected:  # a token that is not configured matches nothing, not the empty string
        return False
    return hmac.compare_digest(token.encode(), expected.encode())


def install(app: Flask, settings: Settings) -> None:
    if not (settings.api_token or settings.admin_token):
        return

    @app.before_request
    def _check_token():
        if request.path in OPEN or request.path.startswith(DASHBOARD_PREFIX + "/static/"):
            return None  # static files of the dashboard hold no data
        try:
            return _authorize()
        except Unauthorized:
            if _is_dashboard(request.path) and not request.path.startswith(DASHBOARD_PREFIX + "/api/"):
                return redirect(f"{DASHBOARD_PREFIX}/login?next={quote(request.full_path.rstrip('?'))}")
            raise

    def _authorize() -> None:
        token = _presented()
        if not token:
            raise Unauthorized("this gateway needs 'Authorization: Bearer <token>'")
        if _matches(token, settings.admin_token):
            return
        # an unknown token is 401 everywhere; 403 only tells a valid job token it lacks the right
        if not _matches(token, settings.api_token):
            raise Unauthorized("the bearer token is not valid")
        if needs_admin(request.path, request.method):
            raise Forbidden(f"{request.path} needs the admin token")
