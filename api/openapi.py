"""The gateway's OpenAPI document, built from the pydantic request models."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from .auth import OPEN, needs_admin
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

_JSON = "application/json"


def _body(model: str) -> dict[str, Any]:
    return {"required": True, "content": {_JSON: {"schema": {"$ref": f"#/components/schemas/{model}"}}}}


def _reply(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": {"type": "object"}}}}


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
ERRORS = {"400": _reply("bad request: {code, message}"), "413": _reply("body over PRORL_MAX_REQUEST_BYTES"),
          "503": _reply("service_stopped (after /stop), or service_unavailable (Redis or the broker "
                        "cannot be reached: retry later)")}
#: the schemes ``auth`` enforces when tokens are configured (nothing is enforced while neither is set)
SECURITY_SCHEMES = {
    "jobToken": {"type": "http", "scheme": "bearer", "description": "PRORL_API_TOKEN"},
    "adminToken": {"type": "http", "scheme": "bearer", "description": "PRORL_ADMIN_TOKEN"},
}


def _security(path: str, method: str) -> list[dict[str, list[str]]]:
    """Which token opens ``path``, read from the same sets ``auth`` checks (so the two cannot drift)."""
    if path in OPEN:
        return []
    if needs_admin(path, method.upper()):
        return [{"adminToken": []}]
    return [{"jobToken": []}, {"adminToken": []}]


def _node_action(summary: str) -> dict[str, Any]:
    return {"post": {"summary": summary,
                     "parameters": [{"name": "node", "in": "path", "required": True, "schema": {"type": "string"}}],
                     "responses": {"200": _reply("the node: {node, state, last_seen_s, ...}"),
                                   "404": _reply("node_not_found: no worker of that node was ever seen")}}}


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in (ProcessRequest, CancelRequest, AddServerRequest, ClearServerRequest, SetVersionRequest,
                  WaitRequest, ReplayRequest, ForkRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    post = lambda summary, model, ok: {"post": {"summary": summary, "requestBody": _body(model),  # noqa: E731
                                                "responses": {"200": _reply(ok), **ERRORS}}}
    get = lambda summary: {"get": {"summary": summary, "responses": {"200": _reply(summary)}}}  # noqa: E731
    paths = {
        "/process": post("run a job and wait for its result", "ProcessRequest", "final result"),
        "/jobs": {"post": {"summary": "submit a job, a group (num_samples) or an array of them (202)",
                           "requestBody": {"required": True, "content": {_JSON: {"schema": {"oneOf": [
                               {"$ref": "#/components/schemas/ProcessRequest"},
                               {"type": "array", "items": {"$ref": "#/components/schemas/ProcessRequest"}}]}}}},
                           "responses": {"202": _reply("accepted: {job_id, status, created}, or {group_id?, jobs}"),
                                         **ERRORS}}},
        "/jobs/{job_id}": {"get": {"summary": "a job's result, or 202 with its stage",
                                   "parameters": [{"name": "job_id", "in": "path", "required": True,
                                                   "schema": {"type": "string"}},
                                                  {"name": "wait", "in": "query", "schema": {"type": "number"}}],
                                   "responses": {"200": _reply("final result"), "202": _reply("pending"),
                                                 "404": _reply("unknown job")}}},
        "/jobs/wait": {"post": {
            "summary": "wait for many jobs: each result as it ends, as NDJSON (chunked)",
            "description": "One line per job: the body GET /jobs/{job_id} gives for an ended job, in the order "
                           "they end, those ended already first; {job_id, code: job_not_found, message} for an "
                           "unknown id; at timeout_s one pending line (status not terminal) per job still "
                           "running, then the end. Bare newlines are keep-alives.",
            "requestBody": _body("WaitRequest"),
            "responses": {"200": {"description": "results as they end",
                                  "content": {"application/x-ndjson": {"schema": {"type": "string"}}}},
                          **ERRORS}}},
        "/jobs/{job_id}/replay": {"post": {
            "summary": "replay a finished job through a fresh sandbox with its recorded model outputs, then EVAL "
                       "again (202: the replay's job id; its result's `replay` says what differs)",
            "parameters": [_JOB_ID], "responses": {"202": _reply("accepted: {job_id, status, created, replay_of}"),
                                                   **ERRORS}}},
        "/jobs/replay": {"post": {"summary": "replay many finished jobs (202)", "requestBody": _body("ReplayRequest"),
                                  "responses": {"202": _reply("accepted: {jobs: [{job_id, replay_of, ...}]}"),
                                                **ERRORS}}},
        "/jobs/{job_id}/fork": {"post": {
            "summary": "start count jobs sharing turns 1..turn of an ended or running job (202: the group)",
            "parameters": [_JOB_ID], "requestBody": _body("ForkRequest"),
            "responses": {"202": _reply("accepted: {group_id, fork_of, turn, jobs}; a repeated request with "
                                        "the same group_id answers the same jobs (created: false)"),
                          "404": _reply("job_not_found: no such source job"),
                          "409": _reply("conflict: group_id already names forks of another request "
                                        "(another source, turn or count)"), **ERRORS}}},
        "/cancel": post("cancel jobs", "CancelRequest", "which jobs were cancelled"),
        "/add_llm_server": post("register an LLM backend (probed: one that does not answer is added unhealthy, "
                                "out of routing until it does)", "AddServerRequest",
                                "registered: {address, type, added, generation, version, healthy, since, detail}"),
        "/clear_llm_server": {"post": {"summary": "forget one backend (address), or every one (no body)",
                                       "requestBody": {**_body("ClearServerRequest"), "required": False},
                                       "responses": {"200": _reply("{generation, removed?}"), **ERRORS}}},
        "/llm_servers": get("registered backends"),
        "/llm_servers/version": post("set the policy version a backend (default: every one) serves",
                                     "SetVersionRequest", "the backends set"),
        "/start": {"post": {"summary": "accept jobs", "responses": {"200": _reply("state")}}},
        "/stop": {"post": {"summary": "refuse new jobs and cancel in-flight ones",
                           "responses": {"200": _reply("state")}}},
        "/nodes": get("every node seen in the last day: state (up, draining, drained, gone), last seen, "
                      "queues, slots, stages held, jobs waiting in its RUN queue, sandboxes, software versions"),
        "/nodes/{node}/drain": _node_action("drain a node: no new INIT or RUN work; it finishes what it holds "
                                            "and then reports drained"),
        "/nodes/{node}/undrain": _node_action("undrain a node: it takes new work again"),
        "/status": get("service status"),
        "/healthz": get("liveness"),
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
        "/openapi.json": get("this document"),
    }
    for path, operations in paths.items():
        for method, operation in operations.items():
            operation["security"] = _security(path, method)
            if path not in OPEN:
                operation["responses"]["401"] = _reply("missing or wrong bearer token")
            if needs_admin(path, method.upper()):
                operation["responses"]["403"] = _reply("the job token cannot do this: admin token needed")
    return {"openapi": "3.1.0", "info": {"title": "prorl-celery gateway", "version": "0.1.0"},
            "paths": paths, "components": {"schemas": schemas, "securitySchemes": SECURITY_SCHEMES}}
