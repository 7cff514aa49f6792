"""The sandbox runtimes' one error tree; every error carries a stable ``code``.

    SandboxError                               sandbox_error
    ├── RuntimeUnavailable(RuntimeError)       runtime_unavailable  (binary missing, ...)
    ├── SandboxStartError(RuntimeError)        start_failed         (message has the log tail)
    │   └── SandboxStartTimeout(TimeoutError)  start_timeout        (no READY line in time)
    ├── SandboxStopError(RuntimeError)         stop_failed          (a process survived SIGKILL)
    ├── AddressExhausted(RuntimeError)         address_exhausted    (no free 127.x.y.z left)
    └── InvalidSpec(ValueError)                invalid_spec         (a spec the runtime cannot honour)
"""
from __future__ import annotations


class SandboxError(Exception):
    """Base of every runtime error; ``code`` is stable and machine-readable."""

    code = "sandbox_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class RuntimeUnavailable(SandboxError, RuntimeError):
    code = "runtime_unavailable"


class SandboxStartError(SandboxError, RuntimeError):
    code = "start_failed"


class SandboxStartTimeout(SandboxStartError, TimeoutError):
    code = "start_timeout"


class SandboxStopError(SandboxError, RuntimeError):
    code = "stop_failed"


class AddressExhausted(SandboxError, RuntimeError):
    code = "address_exhausted"


class InvalidSpec(SandboxError, ValueError):
    code = "invalid_spec"
