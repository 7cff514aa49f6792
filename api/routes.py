"""Job and backend endpoints. Views stay short: parse, act through the job store, return."""
from __future__ import annotations

import ipaddress
import json
from typing import Any

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, TypeAdapter

from prorl_celery.core.errors import BadRequest, Forbidden, JobNotFound, NodeNotFound
from prorl_celery.llm.pool import probe
from prorl_celery.state.nodes import node_states, set_drain
from prorl_celery.state.store import JobRecord, decode_record
from prorl_celery.state.waiting import RecordWait
from prorl_celery.wire import derived, job_intake
from prorl_celery.wire.job_intake import JobSpec
from prorl_celery.wire.results import build_result, pending_result, results_as_they_end

from .extension import app_services
from .schemas import (
    AddServerRequest,
    CancelRequest,
    ClearServerRequest,
    ForkRequest,
    ProcessRequest,
    ReplayRequest,
    SetVersionRequest,
    WaitRequest,
)

bp = Blueprint("jobs", __name__)
#: most job requests one POST /jobs may carry (each may be a group of num_samples)
MAX_BATCH = 10_000
BATCH = TypeAdapter(list[ProcessRequest])


def parse(model: type[BaseModel]) -> Any:
    body = json_body()
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    return model.model_validate(body)


def json_body() -> Any:
    """The request's JSON, or a 400 saying which is wrong: the content type, or the JSON."""
    if not request.is_json:
        request.get_data(cache=True)  # read up to the limit first, so that an oversized body is a 413
        refuse_truncated_stream()
        raise BadRequest(f"Content-Type must be application/json, got {request.mimetype or 'none'}")
    body = request.get_json(silent=True)
    refuse_truncated_stream()  # after the body was read up to the limit
    if body is None:
        try:
            json.loads(request.get_data(cache=True) or b"")
        except ValueError as error:
            raise BadRequest(f"the request body is not valid JSON: {error}") from None
    return body


def refuse_truncated_stream() -> None:
    """413 for a chunked body over ``MAX_CONTENT_LENGTH``.

    With a Content-Length werkzeug refuses an oversized body up front; a chunked body (no
    length) is read only up to the limit, silently cut there, and would surface as invalid JSON.
    Reading one byte more past the limit makes werkzeug's limited stream raise the 413.
    """
    if request.content_length is None:
        request.stream.read(1)


def prepare(body: ProcessRequest) -> JobSpec:
    return job_intake.prepare(app_services().settings, body.instance, body.sampling_params.to_job(),
                              task=body.task_name, job_id=body.job_id, timeout_s=body.timeout_s,
                              max_attempts=body.max_attempts)


def submit(specs: list[JobSpec]) -> list[job_intake.Submitted]:
    # with the other requests' jobs being submitted at the same time: one create and one publish
    # round trip for them all (prorl_celery.state.group_commit)
    return app_services().intake.submit(specs)


def expand(spec: JobSpec, num_samples: int | None) -> list[JobSpec]:
    """One job, or ``num_samples`` of them (a group)."""
    return job_intake.samples(spec, num_samples) if num_samples else [spec]


def accepted(submitted: job_intake.Submitted) -> dict[str, Any]:
    return {"job_id": submitted.job_id, "status": submitted.status.value, "created": submitted.created}


def job_response(job_id: str, wait_s: float, *, registered: RecordWait[JobRecord] | None = None):
    services = app_services()
    store = services.store
    # the listener reads the record when the job ends, so a woken request answers at once; reads
    # of this request's own go out with those of requests beside it (Services.records)
    record = store.waiter.wait_record(job_id, wait_s, services.records.submit, decode_record, registered=registered)
    if record is None:
        raise JobNotFound(f"no job with id {job_id!r} (unknown, or its result expired)")
    if record.status.terminal:
        return jsonify(build_result(store, record)), 200
    return jsonify(pending_result(store, record)), 202


@bp.post("/process")
def process():
    body = parse(ProcessRequest)
    if body.num_samples:
        raise BadRequest("num_samples: /process waits for one job; submit a group with POST /jobs")
    services = app_services()
    settings = services.settings
    spec = prepare(body)
    # waiting from before the job exists: its ending is then seen by the listener, which reads
    # its record, and nothing need be read after the submit (round trips per job)
    store = services.store
    waiter = store.waiter
    registered: RecordWait[JobRecord] | None = waiter.register_record(spec.job_id, decode_record)
    try:
        (submitted,) = services.intake.submit([spec])
    except BaseException:
        waiter.unregister(spec.job_id, registered)
        raise
    if not submitted.created:  # a repeated job_id: that job may have ended long ago
        waiter.unregister(spec.job_id, registered)
        registered = None
    # the job's own budget (spec.budget_s: the request's timeout_s, checked and capped by prepare)
    wait_s = settings.process_wait_s or spec.budget_s + 60.0
    return job_response(submitted.job_id, wait_s, registered=registered)


@bp.post("/jobs")
def create_jobs():
    """One job, a group (``num_samples``), or a JSON array of either: one round trip to Redis."""
    body = json_body()
    if isinstance(body, list):
        if not 0 < len(body) <= MAX_BATCH:
            raise BadRequest(f"body: a batch holds 1 to {MAX_BATCH} job requests, got {len(body)}")
        specs = []
        for index, item in enumerate(BATCH.validate_python(body)):
            try:
                specs += expand(prepare(item), item.num_samples)
            except BadRequest as error:  # say which request of the batch is wrong
                raise type(error)(f"[{index}] {error.message}") from None
        submitted = submit(specs)
        return jsonify({"jobs": [accepted(s) for s in submitted]}), 202
    single = parse(ProcessRequest)
    spec = prepare(single)
    submitted = submit(expand(spec, single.num_samples))
    if single.num_samples:
        return jsonify({"group_id": spec.job_id, "jobs": [accepted(s) for s in submitted]}), 202
    return jsonify(accepted(submitted[0])), 202


@bp.get("/jobs/<job_id>")
def get_job(job_id: str):
    try:
        wait_s = float(request.args.get("wait", 0))
    except ValueError:
        raise BadRequest("wait: must be a number of seconds") from None
    if not 0 <= wait_s <= 3600:
        raise BadRequest("wait: must be between 0 and 3600 seconds")
    return job_response(job_id, wait_s)


@bp.post("/jobs/<job_id>/replay")
def replay_job(job_id: str):
    """Re-drive a finished job's trajectory through a fresh sandbox with its recorded model
    outputs, then EVAL again: a new job whose result's ``replay`` says what differs."""
    services = app_services()
    (submitted,) = submit([derived.replay_spec(services.store, services.journal, job_id)])
    return jsonify({**accepted(submitted), "replay_of": job_id}), 202


@bp.post("/jobs/replay")
def replay_jobs():
    """``replay_job`` for many finished jobs (re-scoring a data set after an evaluator fix)."""
    services = app_services()
    job_ids = list(dict.fromkeys(parse(ReplayRequest).job_ids))
    specs = [derived.replay_spec(services.store, services.journal, job_id) for job_id in job_ids]
    submitted = submit(specs)
    return jsonify({"jobs": [{**accepted(s), "replay_of": of} for s, of in zip(submitted, job_ids)]}), 202


@bp.post("/jobs/<job_id>/fork")
def fork_job(job_id: str):
    """``count`` jobs sharing turns 1..``turn`` of an ended or running job, as one group;
    idempotent under a client-given ``group_id`` (409 when it names another request's forks)."""
    body = parse(ForkRequest)
    services = app_services()
    group, submitted = derived.submit_forks(services.store, services.journal, submit, job_id, body.turn,
                                            body.count, body.group_id)
    return jsonify({"group_id": group, "fork_of": job_id, "turn": body.turn,
                    "jobs": [accepted(s) for s in submitted]}), 202


@bp.post("/jobs/wait")
def wait_jobs():
    """Many jobs' results, streamed as NDJSON as they end (``results_as_they_end``): one request
    and one registration per job in this process's waiter, instead of one long-poll per job."""
    body = parse(WaitRequest)
    lines = results_as_they_end(app_services().store, body.job_ids, body.timeout_s, body.heartbeat_s)
    # no Content-Length: the server sends it chunked, each wake-up's lines as they come
    return Response(lines, mimetype="application/x-ndjson", headers={"Cache-Control": "no-store",
                                                                     "X-Accel-Buffering": "no"})


@bp.post("/cancel")
def cancel():
    store = app_services().store
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
    """Register a backend, probed first: one that does not answer is still added (a v1 trainer
    may register servers that are still starting) but out of routing until it does."""
    body = parse(AddServerRequest)
    services = app_services()
    check_allowed_backend(body.address.host or "", services.settings.backend_allowlist)
    address, pool = body.normalized_address, services.pool
    added, generation = pool.add(address, body.type, body.version,
                                 health=probe(address, body.type, services.settings.backend_probe_timeout_s))
    health = pool.health(address)
    reply = {"address": address, "type": body.type, "added": added, "generation": generation,
             "version": pool.version(address), "healthy": health.healthy, "since": health.since,
             "detail": health.detail}
    if not health.healthy:
        reply["warning"] = (f"{address} did not answer ({health.detail}); it is registered but gets no job "
                            f"until a probe finds it answering")
    return jsonify(reply)


@bp.post("/llm_servers/version")
def set_llm_server_version():
    """Jobs in flight keep their backend; their next turns record the new version."""
    body = parse(SetVersionRequest)
    try:
        versions = app_services().pool.set_version(body.version, body.normalized_address)
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
    """Forget one backend (``{"address": ...}``) or, without an address, every one; jobs in
    flight on a removed backend finish on it. Either way the generation is bumped."""
    pool = app_services().pool
    address = parse(ClearServerRequest).normalized_address if request.get_data(cache=True).strip() else None
    if address is None:
        return jsonify({"generation": pool.clear()})
    try:
        removed, generation = pool.remove(address)
    except KeyError:
        registered = ", ".join(b.address for b in pool.list()) or "(none)"
        raise BadRequest(f"address: {address!r} is not a registered LLM server; registered: {registered}") from None
    return jsonify({"generation": generation, "removed": removed})


@bp.get("/llm_servers")
def llm_servers():
    pool = app_services().pool
    return jsonify({"generation": pool.generation(), "servers": [b.__dict__ for b in pool.list()]})


@bp.post("/start")
def start():
    app_services().store.set_service_state(True)
    return jsonify({"state": "started"})


@bp.post("/stop")
def stop():
    """Stop accepting jobs cluster wide and cancel every job in flight."""
    store = app_services().store
    store.set_service_state(False)
    cancelled = [j for j in store.active_job_ids() if store.cancel(j, "service stopped").ok]
    return jsonify({"state": "stopped", "cancelled": len(cancelled)})


@bp.get("/nodes")
def nodes():
    services = app_services()
    return jsonify({"nodes": node_states(services.redis, services.settings.heartbeat_s)})


@bp.post("/nodes/<node>/drain")
def drain_node(node: str):
    """The node takes no new INIT or RUN work, finishes what it holds, then reports drained."""
    return _drain(node, True)


@bp.post("/nodes/<node>/undrain")
def undrain_node(node: str):
    return _drain(node, False)


def _drain(node: str, drain: bool):
    services = app_services()
    if not set_drain(services.redis, node, drain):
        raise NodeNotFound(f"no worker of node {node!r} was ever seen")
    state = next(n for n in node_states(services.redis, services.settings.heartbeat_s) if n["node"] == node)
    return jsonify(state)
