"""Job and backend endpoints. Views stay short: parse, act through the job store, return."""
from __future__ import annotations

import ipaddress
import uuid
from typing import Any

from flask import Blueprint, jsonify, request
from pydantic import BaseModel

from handlers import UnknownTaskError, get_handler
from prorl_celery.celery_app import enqueue
from prorl_celery.errors import BadRequest, Forbidden, ServiceStopped, UnknownTask
from prorl_celery.results import build_result, pending_result
from prorl_celery.sampling import UnresolvedTokenizer, resolve_tokenizer, split as split_sampling
from prorl_celery.services import get_services
from prorl_celery.status import JobStatus, Stage

from .schemas import AddServerRequest, CancelRequest, ProcessRequest, SetVersionRequest

bp = Blueprint("jobs", __name__)


def parse(model: type[BaseModel]) -> Any:
    body = request.get_json(silent=True)
    refuse_truncated_stream()
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object (Content-Type: application/json)")
    return model.model_validate(body)


def refuse_truncated_stream() -> None:
    """413 for a chunked body over ``MAX_CONTENT_LENGTH``.

    With a Content-Length werkzeug refuses an oversized body up front; a chunked body (no
    length) is read only up to the limit, silently cut there, and would surface as invalid JSON.
    Reading one byte more past the limit makes werkzeug's limited stream raise the 413.
    """
    if request.content_length is None:
        request.stream.read(1)


def submit(body: ProcessRequest) -> tuple[str, bool]:
    """Validate the instance with its handler, create the job once and enqueue INIT."""
    services = get_services()
    settings = services.settings
    try:
        handler = get_handler(body.task_name)
    except UnknownTaskError as error:
        raise UnknownTask(str(error.args[0])) from None
    params = split_sampling(body.sampling_params.to_job())
    instance = body.instance
    if "max_iterations" in params.agent and "max_iterations" not in instance:
        instance = {**instance, "max_iterations": params.agent["max_iterations"]}  # the instance's wins
    try:
        handler.validate_instance(instance)
    except ValueError as error:
        raise BadRequest(f"instance: {error}") from None
    ignored = list(params.ignored)
    try:
        tokenizer = resolve_tokenizer(params.agent, None, settings.tokenizers_dir)
    except UnresolvedTokenizer as error:
        # without a directory of tokenizers a v1 trainer's model name (custom_tokenizer) cannot
        # be resolved: the service's own tokenizer serves, and the result says the key was ignored
        if settings.tokenizers_dir or not settings.tokenizer:
            raise BadRequest(str(error)) from None
        tokenizer, ignored = None, sorted([*ignored, "custom_tokenizer"])
    if handler.uses_llm and not (tokenizer or settings.tokenizer):
        raise BadRequest("sampling_params.tokenizer: required when PRORL_TOKENIZER is not set")
    # a job without its own tokenizer uses the RUN worker's PRORL_TOKENIZER (paths differ per node)
    agent = {**params.agent, "tokenizer": tokenizer} if tokenizer else dict(params.agent)
    budget = body.timeout_s or settings.job_timeout_s
    if budget > settings.max_job_timeout_s:
        raise BadRequest(f"timeout_s: at most {settings.max_job_timeout_s} (PRORL_MAX_JOB_TIMEOUT_S)")
    job_id = body.job_id or uuid.uuid4().hex
    created, _ = services.store.create(job_id, {
        "task": handler.name or body.task_name, "instance": instance,
        "sampling_params": params.sampler, "agent_params": agent, "ignored_params": ignored,
        "budget_s": budget, "attempt": 1,
        "max_attempts": body.max_attempts or settings.max_attempts})
    if created:
        try:
            enqueue(Stage.INIT, job_id)
        except Exception as error:  # broker down: do not leave the job pending forever
            services.store.finish(job_id, JobStatus.FAILED, {"error": f"could not enqueue: {error}"})
            raise ServiceStopped(f"the broker is unreachable: {error}") from error
    return job_id, created


def job_response(job_id: str, wait_s: float, *, exists: bool = False):
    store = get_services().store
    store.wait(job_id, wait_s, exists=exists)
    record = store.load(job_id)
    if JobStatus(record["status"]).terminal:
        return jsonify(build_result(store, record)), 200
    return jsonify(pending_result(store, record)), 202


@bp.post("/process")
def process():
    body = parse(ProcessRequest)
    job_id, _ = submit(body)
    settings = get_services().settings
    wait_s = settings.process_wait_s or (body.timeout_s or settings.job_timeout_s) + 60.0
    return job_response(job_id, wait_s, exists=True)


@bp.post("/jobs")
def create_job():
    job_id, created = submit(parse(ProcessRequest))
    status = get_services().store.status(job_id)
    return jsonify({"job_id": job_id, "status": status.value if status else None, "created": created}), 202


@bp.get("/jobs/<job_id>")
def get_job(job_id: str):
    try:
        wait_s = float(request.args.get("wait", 0))
    except ValueError:
        raise BadRequest("wait: must be a number of seconds") from None
    if not 0 <= wait_s <= 3600:
        raise BadRequest("wait: must be between 0 and 3600 seconds")
    return job_response(job_id, wait_s)


@bp.post("/cancel")
def cancel():
    store = get_services().store
    cancelled, not_cancelled = [], {}
    for job_id in parse(CancelRequest).ids:
        outcome = store.cancel(job_id)
        if outcome.ok:
            cancelled.append(job_id)
        else:
            not_cancelled[job_id] = outcome.previous.value if outcome.previous else "not_found"
    return jsonify({"cancelled": cancelled, "not_cancelled": not_cancelled})


@bp.post("/add_llm_server")
def add_llm_server():
    body = parse(AddServerRequest)
    check_allowed_backend(body.address.host or "", get_services().settings.backend_allowlist)
    added, generation = get_services().pool.add(body.normalized_address, body.type, body.version)
    return jsonify({"address": body.normalized_address, "type": body.type, "added": added,
                    "generation": generation, "version": get_services().pool.version(body.normalized_address)})


@bp.post("/llm_servers/version")
def set_llm_server_version():
    """Jobs in flight keep their backend; their next turns record the new version."""
    body = parse(SetVersionRequest)
    try:
        versions = get_services().pool.set_version(body.version, body.normalized_address)
    except KeyError:
        raise BadRequest(f"address: {body.normalized_address!r} is not a registered LLM server") from None
    return jsonify({"versions": versions})


def check_allowed_backend(host: str, allowlist: str) -> None:
    """With ``PRORL_BACKEND_ALLOWLIST`` set, only those hosts or networks may be registered."""
    entries = [e.strip() for e in allowlist.split(",") if e.strip()]
    if not entries or host in entries:
        return
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in entries:
        try:
            if address is not None and address in ipaddress.ip_network(entry, strict=False):
                return
        except ValueError:
            continue
    raise Forbidden(f"address: host {host!r} is not in PRORL_BACKEND_ALLOWLIST")


@bp.post("/clear_llm_server")
def clear_llm_server():
    return jsonify({"generation": get_services().pool.clear()})


@bp.get("/llm_servers")
def llm_servers():
    pool = get_services().pool
    return jsonify({"generation": pool.generation(), "servers": [b.__dict__ for b in pool.list()]})


@bp.post("/start")
def start():
    get_services().store.set_service_state(True)
    return jsonify({"state": "started"})


@bp.post("/stop")
def stop():
    """Stop accepting jobs cluster wide and cancel every job in flight."""
    store = get_services().store
    store.set_service_state(False)
    cancelled = [j for j in store.active_job_ids() if store.cancel(j, "service stopped").ok]
    return jsonify({"state": "stopped", "cancelled": len(cancelled)})
