"""The project's errors: every class has a stable ``code``; only the HTTP tree has a status.

    ProrlError                          .code, .message
    ├── HTTPError                       .http_status; the gateway answers {"code", "message"}
    │   │                                 with it, and the trainer client raises the class again
    │   │                                 from the answer's code
    │   ├── BadRequest                  400 bad_request      (request fails validation)
    │   │   └── UnknownTask(KeyError)   400 unknown_task     (no handler has that task name; raised
    │   │                                                      by the handler registry, lists those
    │   │                                                      registered and any that failed to load)
    │   ├── Unauthorized                401 unauthorized     (no or a wrong bearer token)
    │   ├── Forbidden                   403 forbidden        (an admin endpoint, or a backend
    │   │                                                      address outside the allow-list)
    │   ├── JobNotFound(KeyError)       404 job_not_found
    │   ├── NodeNotFound                404 node_not_found   (no worker of that node was ever seen)
    │   ├── Conflict                    409 conflict         (a client-given id already names something
    │   │                                                      else: a fork group_id of another request)
    │   ├── PayloadTooLarge             413 payload_too_large
    │   ├── ServiceStopped              503 service_stopped  (after /stop, until /start)
    │   └── ServiceUnavailable          503 service_unavailable (Redis or the broker cannot be
    │                                                          reached: retry later)
    ├── StageInterrupted                a stage stops early; never answered over HTTP: the stage
    │   │                                 ends the job, whose status tells the client
    │   ├── JobCancelled                the job was cancelled (status cancelled)
    │   ├── StageTimeout(TimeoutError)  the job's time budget ran out (status timeout)
    │   └── ReplayDiverged              a turn replayed from the journal (a resume, a fork) met an
    │                                     observation that differs from the journaled one: RUN
    │                                     starts again from turn zero on a fresh sandbox
    ├── BackendError                    an LLM server failed or answered badly (.status_code: its
    │   │                                 HTTP status); a RUN failure, never a gateway answer
    │   └── ContextExhausted            the conversation fills the model's context (the policy's
    │                                     own doing: outcome agent_error)
    ├── a stage's failure, raised by a handler or the pipeline to name its class
    │   (prorl_celery.core.outcomes.classify):
    │   ├── AgentFailure                the policy's own failure: the reward stays valid
    │   ├── EnvironmentFailure          the sandbox, the image or the worker failed
    │   │   ├── RequirementMissing      a module or program the task needs is not installed
    │   │   └── JournalFenced           a later attempt owns the job's journal: this stage's
    │   │                                 worker was presumed lost
    │   └── EvalUnavailable             the evaluator cannot judge (never a reward of 0)
    └── trainer side (the client and the DAPO collector raise these in the trainer's process)
        ├── PromptsExhausted            the prompt stream ended and nothing is left in flight
        ├── RolloutsFailing             too many rollouts in a row did not complete
        │                                 (prorl_celery.trainer.dapo_types)
        └── ClientError                 what the gateway's tree does not name (prorl_celery.trainer.client:
                                          RequestRejected, GatewayError, GatewayUnavailable,
                                          WaitTimeout)

Sandboxes and their tool servers raise their own trees (``singularity.runtime.errors``,
``singularity.toolserver.errors``); a stage turns them into a job's fallback result.

One boundary turns errors into HTTP answers, ``api.errors.answer`` (as httpx's
``map_exceptions`` is its one place for transport errors): an ``HTTPError`` is answered as
itself, a library's error that means the request is wrong is mapped to the ``HTTPError`` it
stands for, and anything else (this module's internal trees included) reaching a view is a bug,
answered ``500 internal_error``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping


class ProrlError(Exception):
    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


# -- answered over HTTP ----------------------------------------------------------------------

class HTTPError(ProrlError):
    """An error the gateway answers: ``to_dict()`` is the body, ``http_status`` the status."""

    http_status = 500


class BadRequest(HTTPError):
    code = "bad_request"
    http_status = 400


class UnknownTask(BadRequest, KeyError):
    """No handler is registered under the task name; the message lists those that are.

    ``task``, ``registered`` and ``broken`` (task -> why its handler failed to load) are set
    where the registry raises it; a client re-raising it from an answer has the message only.
    """

    code = "unknown_task"

    def __init__(self, message: str, *, task: str | None = None, registered: Iterable[str] = (),
                 broken: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.task = task
        self.registered = list(registered)
        self.broken = dict(broken or {})

    @classmethod
    def naming(cls, task: str, registered: Iterable[str],
               broken: Mapping[str, str] | None = None) -> UnknownTask:
        registered = list(registered)
        message = f"unknown task {task!r}; registered tasks: {', '.join(registered) or '(none)'}"
        if broken and task in broken:
            message += f"; the handler registered as {task!r} failed to load: {broken[task]}"
        return cls(message, task=task, registered=registered, broken=broken)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class Unauthorized(HTTPError):
    code = "unauthorized"
    http_status = 401


class Forbidden(HTTPError):
    code = "forbidden"
    http_status = 403


class JobNotFound(HTTPError, KeyError):
    code = "job_not_found"
    http_status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class NodeNotFound(HTTPError):
    code = "node_not_found"
    http_status = 404


class Conflict(HTTPError):
    """The request reuses a client-given id (a fork's ``group_id``) that already names jobs made
    by a different request; the message says what differs. Nothing was started."""

    code = "conflict"
    http_status = 409


class PayloadTooLarge(HTTPError):
    code = "payload_too_large"
    http_status = 413


class ServiceStopped(HTTPError):
    code = "service_stopped"
    http_status = 503


class ServiceUnavailable(HTTPError):
    """Redis or the broker cannot be reached: nothing was accepted, a retry may succeed."""

    code = "service_unavailable"
    http_status = 503


# -- control flow inside a stage -------------------------------------------------------------

class StageInterrupted(ProrlError):
    """The stage stops before its handler finished; the stage itself ends the job."""


class JobCancelled(StageInterrupted):
    code = "cancelled"


class StageTimeout(StageInterrupted, TimeoutError):
    code = "timeout"


class ReplayDiverged(StageInterrupted):
    """A turn replayed from the job's journal met an observation (or a prompt, or an action)
    that differs from the journaled one: the tool is not deterministic, or the handler changed.
    ``turn`` is the model turn it happened after (0: the prompt); ``detail`` says what differed."""

    code = "replay_diverged"

    def __init__(self, message: str, *, turn: int, detail: dict | None = None) -> None:
        super().__init__(message)
        self.turn = turn
        self.detail = detail or {}


# -- LLM backends ----------------------------------------------------------------------------

class BackendError(ProrlError):
    code = "backend_error"

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        #: the LLM server's HTTP status, when it answered at all
        self.status_code = status_code


class ContextExhausted(BackendError):
    """No room is left in the model's context for another turn."""

    code = "context_exhausted"


# -- a stage's failure, by class (prorl_celery.core.outcomes) -----------------------------------------

class AgentFailure(ProrlError):
    """The policy's own failure that ends its rollout (an action the handler cannot carry out):
    the evaluator still judges what the agent did, and the reward is valid."""

    code = "agent_error"


class EnvironmentFailure(ProrlError):
    """The sandbox, the image, a tool or the worker failed: not the policy's doing."""

    code = "env_error"


class RequirementMissing(EnvironmentFailure):
    """A module or program a task needs is not installed where it runs (``missing`` names it)."""

    code = "requirement_missing"

    def __init__(self, message: str, *, missing: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


class JournalFenced(EnvironmentFailure):
    """A later attempt of the job owns its journal: this stage's worker was presumed lost and
    the job retried, so nothing it does may reach the journal (nor, by the attempt guard, the
    job)."""

    code = "journal_fenced"


class EvalUnavailable(ProrlError):
    """The evaluator cannot judge this rollout (a test runner missing, a report unreadable, a
    judge down). Raise it rather than return a reward: a failure is never a score."""

    code = "eval_error"


# -- trainer side ----------------------------------------------------------------------------

class PromptsExhausted(ProrlError):
    """The DAPO collector's prompt stream ended and nothing is left in flight."""

    code = "prompts_exhausted"
