"""The one boundary between errors and HTTP answers: every failure is ``{"code", "message"}``.

Like httpx's ``map_exceptions``, the mapping is one table read in one place (``answer``):

- an ``HTTPError`` (``prorl_celery.core.errors``) is answered with its own code and status;
- an error of a library the views use that the client can act on is first turned into the
  ``HTTPError`` it stands for (``MAPPED``): "the request is wrong" (pydantic's validation
  errors, werkzeug's body limit), or "retry later" (redis-py's connection and timeout errors,
  kombu's ``OperationalError``: Redis or the broker cannot be reached, ``503
  service_unavailable``, which the trainer client retries);
- werkzeug's other HTTP exceptions (unknown route, wrong method) keep their status, with their
  name as the code;
- anything else is a bug in the gateway (the internal trees, ``StageInterrupted`` and
  ``BackendError``, included: no view raises them): logged, answered ``500 internal_error``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from flask import Flask, Response, jsonify
from kombu.exceptions import OperationalError
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from prorl_celery.core.errors import BadRequest, HTTPError, PayloadTooLarge, ServiceUnavailable

log = logging.getLogger(__name__)


def validation_message(error: ValidationError) -> str:
    """``instance: Field required; sampling_params.top_p: ...`` - each problem names its field."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "body"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


def unavailable(what: str) -> Callable[[Exception], HTTPError]:
    """``what`` cannot be reached: nothing was done, a retry may succeed (the error's text says
    which server and why; never a password, which redis-py leaves out of it)."""
    return lambda error: ServiceUnavailable(f"{what} cannot be reached, retry later: "
                                            f"{type(error).__name__}: {error}")


#: library errors a client can act on, and the HTTPError each is answered as
MAPPED: dict[type[Exception], Callable[[Any], HTTPError]] = {
    ValidationError: lambda error: BadRequest(validation_message(error)),
    RequestEntityTooLarge: lambda error: PayloadTooLarge(error.description),
    # a restart, a failover or a network cut; redis-py raises these after its own retries
    redis.ConnectionError: unavailable("Redis"),
    redis.TimeoutError: unavailable("Redis"),
    OperationalError: unavailable("the broker"),  # kombu's (Celery's) error for a lost broker
}


def to_http_error(error: Exception) -> HTTPError | None:
    """The HTTPError ``error`` is answered as; None when it is not the client's fault."""
    if isinstance(error, HTTPError):
        return error
    for kind, convert in MAPPED.items():
        if isinstance(error, kind):
            return convert(error)
    return None


def answer(error: Exception) -> tuple[Response, int]:
    http_error = to_http_error(error)
    if http_error is not None:
        if isinstance(http_error, ServiceUnavailable):  # an outage the operator should see
            log.warning("answering 503: %s", http_error.message)
        return jsonify(http_error.to_dict()), http_error.http_status
    if isinstance(error, HTTPException) and error.code is not None:
        code = (error.name or "error").lower().replace(" ", "_")
        return jsonify({"code": code, "message": error.description}), error.code
    log.exception("unhandled error", exc_info=error)
    return jsonify({"code": "internal_error", "message": f"{type(error).__name__}: {error}"}), 500


def register(app: Flask) -> None:
    # Flask picks an error handler by the exception's class hierarchy, so this one sees every
    # error a view or a before_request hook raises, werkzeug's HTTP exceptions included
    app.register_error_handler(Exception, answer)
