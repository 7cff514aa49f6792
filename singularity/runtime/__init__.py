"""Sandbox runtimes: start a sandbox for a job, stop it, prove nothing is left.

    Runtime (base.py)               start(spec) -> Sandbox, stop(sandbox), available()
    ├── BubblewrapRuntime           bwrap, rootless, runs here and in CI
    ├── ApptainerRuntime            apptainer/singularity exec of a .sif (HPC)
    └── ProcessRuntime              NO isolation, development only

    AddressAllocator (addresses.py) unique 127.x.y.z per sandbox on a node
    SandboxLedger (ledger.py)       who owns which sandbox, and which stops failed
    teardown(), reap() (stopping.py)  the one way a sandbox is torn down; the reaper
                                    (dead owners whose sandboxes no job holds, as the
                                    caller's still_needed says; live owners' that their
                                    job let go of, as its released says; failed stops,
                                    retried with backoff)
    procfs.py                       members of a sandbox and how they are stopped, via /proc

In SWE-ReX's terms a Runtime here is a *deployment* (where a sandbox lives: start, teardown)
and the tool server is the *runtime* (what runs actions); see :mod:`.base`.

Execution goes through the tool server on the sandbox's Unix socket (``Sandbox.client()``).
Nothing here imports ``prorl_celery``, ``api`` or ``handlers``; the Redis-backed allocator and
ledger live in ``prorl_celery`` and implement the two protocols.
"""
from __future__ import annotations

from typing import Any

from .addresses import AddressAllocator, FileAddressAllocator, MemoryAddressAllocator
from .apptainer import ApptainerRuntime
from .base import Availability, Bind, Limits, Runtime, Sandbox, SandboxSpec, reap_exited_children
from .bubblewrap import BubblewrapRuntime
from .errors import (
    AddressExhausted,
    InvalidSpec,
    RuntimeUnavailable,
    SandboxError,
    SandboxStartError,
    SandboxStartTimeout,
    SandboxStopError,
)
from .layout import DEV_IMAGE
from .ledger import FileSandboxLedger, SandboxLedger, SandboxRecord
from .process import ProcessRuntime
from .procfs import ProcessRef
from .stopping import ReapReport, Released, StillNeeded, kept_by_owner, reap, retry_delay, teardown, untracked

RUNTIMES: dict[str, type[Runtime]] = {
    "bubblewrap": BubblewrapRuntime,
    "apptainer": ApptainerRuntime,
    "process": ProcessRuntime,
}


def make_runtime(name: str, **options: Any) -> Runtime:
    """A runtime by name; raises :class:`RuntimeUnavailable` when it cannot run here."""
    try:
        runtime = RUNTIMES[name](**options)
    except KeyError:
        raise RuntimeUnavailable(f"unknown runtime {name!r}; known: {sorted(RUNTIMES)}") from None
    availability = runtime.available()
    if not availability:
        raise RuntimeUnavailable(f"{name}: {availability.reason}")
    return runtime


__all__ = [
    "DEV_IMAGE",
    "RUNTIMES",
    "AddressAllocator",
    "AddressExhausted",
    "ApptainerRuntime",
    "Availability",
    "Bind",
    "BubblewrapRuntime",
    "FileAddressAllocator",
    "FileSandboxLedger",
    "InvalidSpec",
    "Limits",
    "MemoryAddressAllocator",
    "ProcessRef",
    "ProcessRuntime",
    "ReapReport",
    "Runtime",
    "RuntimeUnavailable",
    "Sandbox",
    "SandboxError",
    "SandboxLedger",
    "SandboxRecord",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxStartTimeout",
    "SandboxStopError",
    "Released",
    "StillNeeded",
    "kept_by_owner",
    "make_runtime",
    "reap",
    "retry_delay",
    "teardown",
    "reap_exited_children",
    "untracked",
]
