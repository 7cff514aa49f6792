"""The project's one error tree; each error has a stable ``code`` and an HTTP status.

    ProrlError
    ├── BadRequest                      400 bad_request      (request fails validation)
    │   └── UnknownTask                 400 unknown_task     (names the registered tasks)
    ├── Unauthorized                    401 unauthorized     (no or a wrong bearer token)
    ├── Forbidden                       403 forbidden        (an admin endpoint, or a backend
    │                                                          address outside the allow-list)
    ├── JobNotFound(KeyError)           404 job_not_found
    ├── PayloadTooLarge                 413 payload_too_large
    ├── ServiceStopped                  503 service_stopped  (after /stop, until /start)
    ├── NoBackend                       503 no_backend       (no LLM server registered)
    ├── BackendError                    502 backend_error    (an LLM server answered badly)
    ├── StageTimeout(TimeoutError)      504 timeout          (a job's budget ran out)
    └── JobCancelled                    409 cancelled

The gateway maps any ProrlError to ``{"code", "message"}`` with its status.
"""
from __future__ import annotations


class ProrlError(Exception):
    code = "error"
    http_status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class BadRequest(ProrlError):
    code = "bad_request"
    http_status = 400


class UnknownTask(BadRequest):
    code = "unknown_task"


class Unauthorized(ProrlError):
    code = "unauthorized"
    http_status = 401


class Forbidden(ProrlError):
    code = "forbidden"
    http_status = 403


class JobNotFound(ProrlError, KeyError):
    code = "job_not_found"
    http_status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class PayloadTooLarge(ProrlError):
    code = "payload_too_large"
    http_status = 413


class ServiceStopped(ProrlError):
    code = "service_stopped"
    http_status = 503


class NoBackend(ProrlError):
    code = "no_backend"
    http_status = 503


class BackendError(ProrlError):
    code = "backend_error"
    http_status = 502

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        #: the LLM server's HTTP status, when it answered at all
        self.status_code = status_code


class StageTimeout(ProrlError, TimeoutError):
    code = "timeout"
    http_status = 504


class JobCancelled(ProrlError):
    code = "cancelled"
    http_status = 409
