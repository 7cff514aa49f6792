"""The ownership ledger: which worker process owns which sandbox on a node.

Every sandbox is recorded when it starts (node, job, worker, owner pid and start time, the
sandbox's root process, pid namespace and tool server) and removed when it stops. A worker
starting on a node calls :func:`reap_dead_owners`: sandboxes whose owner process is gone are
stopped by their recorded processes (pid + start time, pid namespace inode, descendants), never
by a name pattern (``pkill -f`` would hit other users' processes on a shared node).

:class:`SandboxLedger` is the interface; the service's Redis-backed ledger lives in
``prorl_celery``. :class:`FileSandboxLedger` keeps one JSON file per sandbox (written atomically
with a rename, so no lock is needed) for tests and single-node use.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from . import procfs
from .addresses import AddressAllocator
from .procfs import ProcessRef


class SandboxRecord(BaseModel):
    """One running sandbox, as the ledger keeps it."""

    model_config = ConfigDict(extra="forbid")
    sandbox_id: str
    node: str
    job_id: str
    worker: str  # the worker's name (Celery hostname, or host:pid)
    owner: ProcessRef  # the worker process that started it
    runtime: str
    root: ProcessRef  # the process the runtime spawned (bwrap, apptainer, subreaper)
    pidns: int | None = None  # the sandbox's pid namespace inode, when it has one
    refs: list[ProcessRef] = []  # other recorded processes (the tool server)
    address: str | None = None  # the leased loopback address, released when reaped
    socket_path: str = ""
    state_dir: str = ""
    workspace: str = ""  # the host workspace; the caller that made it decides when it goes
    started_at: float = 0.0


@runtime_checkable
class SandboxLedger(Protocol):
    def record(self, record: SandboxRecord) -> None:
        """Add (or replace) the entry of ``record.sandbox_id`` on ``record.node``."""

    def remove(self, node: str, sandbox_id: str) -> None:
        """Drop an entry (no error when it is not there)."""

    def list(self, node: str) -> list[SandboxRecord]:
        """Every entry of ``node``."""


class FileSandboxLedger:
    """``<root>/<node>/<sandbox id>.json``, one file per sandbox."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _path(self, node: str, sandbox_id: str) -> Path:
        return self.root / node / f"{sandbox_id}.json"

    def record(self, record: SandboxRecord) -> None:
        path = self._path(record.node, record.sandbox_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(record.model_dump_json())
        os.replace(tmp, path)

    def remove(self, node: str, sandbox_id: str) -> None:
        self._path(node, sandbox_id).unlink(missing_ok=True)

    def list(self, node: str) -> list[SandboxRecord]:
        records = []
        for path in sorted((self.root / node).glob("*.json")):
            try:
                records.append(SandboxRecord.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue  # removed meanwhile, or a torn file from a crashed writer
        return records


class ReapReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sandbox_id: str
    job_id: str
    worker: str
    killed: list[int]  # pids that were still running and got stopped
    left: list[int]  # pids still running after SIGKILL (should be empty)
    workspace: str = ""  # the record's workspace (not removed here: it is the caller's)


def stop_recorded(ledger: SandboxLedger, record: SandboxRecord, *,
                  allocator: AddressAllocator | None = None, grace_s: float = 2.0) -> ReapReport:
    """Stop a sandbox from its ledger entry, from any process of its node.

    The entry is removed (and its address released) only when /proc shows none of its
    processes left, so a failed stop is retried by the next reap.
    """
    # a recent shared snapshot: its root was started long before, and terminate re-checks
    running = procfs.members(record.root, record.pidns, record.refs,
                             newer_than=time.monotonic() - procfs.poll_age_s())
    left = procfs.terminate(record.root, record.pidns, record.refs, grace_s) if running else []
    report = ReapReport(sandbox_id=record.sandbox_id, job_id=record.job_id, worker=record.worker,
                        killed=[i.pid for i in running], left=[i.pid for i in left],
                        workspace=record.workspace)
    if not left:
        if allocator is not None and record.address:
            allocator.release(record.address, record.sandbox_id)
        if record.state_dir:
            shutil.rmtree(record.state_dir, ignore_errors=True)
        ledger.remove(record.node, record.sandbox_id)
    return report


def reap_dead_owners(ledger: SandboxLedger, node: str, *, allocator: AddressAllocator | None = None,
                     grace_s: float = 2.0,
                     owner_alive: Callable[[ProcessRef], bool] = procfs.is_alive) -> list[ReapReport]:
    """Stop every sandbox of ``node`` whose owner process is dead; return what was done."""
    return [stop_recorded(ledger, record, allocator=allocator, grace_s=grace_s)
            for record in ledger.list(node) if not owner_alive(record.owner)]
