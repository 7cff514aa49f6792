"""One place that turns every error into ``{"code", "message"}`` with the right status."""
from __future__ import annotations

import logging

from flask import Flask, jsonify
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from prorl_celery.errors import ProrlError

log = logging.getLogger(__name__)


def validation_message(error: ValidationError) -> str:
    """``instance: Field required; sampling_params.top_p: ...`` - each problem names its field."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "body"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


def register(app: Flask) -> None:
    @app.errorhandler(ProrlError)
    def _prorl(error: ProrlError):
        return jsonify(error.to_dict()), error.http_status

    @app.errorhandler(ValidationError)
    def _validation(error: ValidationError):
        return jsonify({"code": "bad_request", "message": validation_message(error)}), 400

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException):
        code = (error.name or "error").lower().replace(" ", "_")
        if error.code == 413:
            code = "payload_too_large"
        return jsonify({"code": code, "message": error.description}), error.code

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        log.exception("unhandled error")
        return jsonify({"code": "internal_error", "message": f"{type(error).__name__}: {error}"}), 500
