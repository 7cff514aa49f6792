"""The dashboard pages: ``/dashboard`` (live pipeline), ``/dashboard/jobs`` and the trajectory
viewer ``/dashboard/jobs/<id>``, plus the JSON they refresh from.

Views stay thin: data comes from :mod:`api.dashboard_data` and :mod:`api.trajectory_view`;
templates autoescape everything and the scripts write data with ``textContent`` only.
"""
from __future__ import annotations

import hmac
import json
from datetime import UTC, datetime

from flask import Blueprint, jsonify, make_response, redirect, render_template, request, url_for

from handlers import registered_tasks
from prorl_celery.core.errors import BadRequest, JobNotFound
from prorl_celery.core.status import JobStatus
from prorl_celery.wire.results import build_result

from . import dashboard_data, trajectory_view
from .auth import DASHBOARD_COOKIE, DASHBOARD_PREFIX
from .extension import app_services

#: seconds between two refreshes of the dashboard page
REFRESH_S = 3

bp = Blueprint("dashboard", __name__, url_prefix=DASHBOARD_PREFIX, template_folder="templates",
               static_folder="static/dashboard", static_url_path="/static")


#: the pages load only their own files; even markup that slipped through could not run a script
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
                           "form-action 'self'")


@bp.after_request
def _headers(response):
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return response


@bp.app_template_filter("ts")
def _timestamp(value: float | None) -> str:
    if not value:
        return ""
    return datetime.fromtimestamp(float(value), tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@bp.app_template_filter("pretty")
def _pretty(value: object) -> str:
    """JSON as plain text (autoescaped by the template), unlike ``tojson`` which is markup
    for script contexts and would show ``<`` as ``\\u003c``."""
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


@bp.app_template_filter("secs")
def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


@bp.get("")
@bp.get("/")
def dashboard():
    services = app_services()
    return render_template("dashboard/dashboard.html", data=dashboard_data.overview(services),
                           refresh_s=REFRESH_S, auth_on=_auth_on())


@bp.get("/api/overview")
def overview_json():
    return jsonify(dashboard_data.overview(app_services()))


def _page_args() -> dict:
    try:
        limit = int(request.args.get("limit", dashboard_data.PAGE_SIZE))
    except ValueError:
        raise BadRequest("limit: must be an integer") from None
    return {"status": request.args.get("status") or None, "task": request.args.get("task") or None,
            "cursor": request.args.get("cursor") or None, "limit": limit}


def _job_page(args: dict) -> dict:
    try:
        return dashboard_data.job_page(app_services(), **args)
    except ValueError as error:
        raise BadRequest(str(error)) from None


@bp.get("/api/jobs")
def jobs_json():
    return jsonify(_job_page(_page_args()))


@bp.get("/jobs")
def jobs():
    args = _page_args()
    try:
        page, error, code = dashboard_data.job_page(app_services(), **args), None, 200
    except ValueError as problem:
        page, error, code = {"jobs": [], "next": None, "scanned": 0, "limit": args["limit"]}, str(problem), 400
    return render_template("dashboard/jobs.html", page=page, args=args, error=error,
                           statuses=[s.value for s in JobStatus], tasks=sorted(registered_tasks()),
                           auth_on=_auth_on()), code


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    services = app_services()
    try:
        record = services.store.load(job_id)
    except JobNotFound as error:
        return render_template("dashboard/missing.html", message=str(error), auth_on=_auth_on()), 404
    result = build_result(services.store, record)
    trajectory = result.get("trajectory")
    tokenizer, tokenizer_note = (trajectory_view.tokenizer_for(trajectory, services.settings.tokenizer)
                                 if trajectory else (None, ""))
    return render_template(
        "dashboard/job.html", result=result, terminal=JobStatus(result["status"]).terminal,
        conversation=trajectory_view.conversation(result),
        no_messages_reason=trajectory_view.no_messages_reason(result),
        tokens=trajectory_view.token_view(trajectory, tokenizer), tokenizer_note=tokenizer_note,
        fidelity=trajectory_view.fidelity(trajectory, tokenizer),
        artifacts=trajectory_view.artifacts(result), instance=record.instance,
        sampling=record.sampling_params, auth_on=_auth_on())


# -- browser sign-in -------------------------------------------------------------------------------

def _auth_on() -> bool:
    settings = app_services().settings
    return bool(settings.api_token or settings.admin_token)


@bp.get("/login")
def login_form():
    return render_template("dashboard/login.html", error=None, auth_on=_auth_on(),
                           next_url=_safe_next(request.args.get("next")))


@bp.post("/login")
def login():
    """Check the token once and keep it in an HttpOnly cookie that only ``/dashboard`` pages
    accept (the job and admin endpoints still need the Authorization header)."""
    settings = app_services().settings
    token = (request.form.get("token") or "").strip()
    next_url = _safe_next(request.form.get("next"))
    valid = [t for t in (settings.api_token, settings.admin_token) if t]
    if not any(hmac.compare_digest(token.encode(), t.encode()) for t in valid):
        message = "this gateway has no token configured" if not valid else "the token is not valid"
        return render_template("dashboard/login.html", error=message, auth_on=bool(valid),
                               next_url=next_url), 401 if valid else 400
    response = make_response(redirect(next_url))
    response.set_cookie(DASHBOARD_COOKIE, token, path=DASHBOARD_PREFIX, httponly=True, samesite="Strict",
                        secure=request.is_secure)
    return response


@bp.post("/logout")
def logout():
    response = make_response(redirect(url_for("dashboard.login_form")))
    response.delete_cookie(DASHBOARD_COOKIE, path=DASHBOARD_PREFIX)
    return response


def _safe_next(target: str | None) -> str:
    """Only a dashboard path: never an absolute URL (no open redirect)."""
    if target and target.startswith(DASHBOARD_PREFIX) and not target.startswith("//") and "\\" not in target:
        return target
    return url_for("dashboard.dashboard")
