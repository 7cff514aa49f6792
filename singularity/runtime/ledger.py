"""The ownership ledger: which worker process owns which sandbox on a node.

Every sandbox is recorded when it starts (node, job, worker, owner pid and start time, the
sandbox's root process, pid namespace and tool server) and removed once a stop has left nothing
running; a failed stop stays recorded, marked for a retry. Every worker of a node runs
:func:`~.stopping.reap` at start-up and on each reaper tick: sandboxes whose owner process is
gone and that no job holds any more (the caller's ``still_needed``), and failed stops whose
retry is due, are stopped by their recorded processes (pid + start time, pid namespace inode,
descendants), never by a name pattern (``pkill -f`` would hit other users' processes on a
shared node).

The owner is who stops the sandbox in the normal course, not what keeps it alive: no runtime
ties a sandbox's life to its owner process (the service starts bubblewrap without
``--die-with-parent``), so a sandbox that INIT started and handed to RUN outlives INIT's worker,
and RUN takes it over (:meth:`SandboxLedger.transfer`).

:class:`SandboxLedger` is the interface; the service's Redis-backed ledger lives in
``prorl_celery``. :class:`FileSandboxLedger` keeps one JSON file per sandbox (written atomically
with a rename, so no lock is needed) for tests and single-node use.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from .procfs import ProcessRef


class SandboxRecord(BaseModel):
    """One running sandbox, as the ledger keeps it."""

    model_config = ConfigDict(extra="forbid")
    sandbox_id: str
    node: str
    job_id: str
    worker: str  # the worker's name (Celery hostname, or host:pid)
    owner: ProcessRef  # the process that holds it: its starter, until another adopts it
    runtime: str
    root: ProcessRef | None  # the process the runtime spawned (bwrap, apptainer, subreaper);
    # None only for a start that failed before spawning anything
    pidns: int | None = None  # the sandbox's pid namespace inode, when it has one
    refs: list[ProcessRef] = []  # other recorded processes (the tool server)
    address: str | None = None  # the leased loopback address, released when reaped
    socket_path: str = ""
    state_dir: str = ""
    workspace: str = ""  # the host workspace; the caller that made it decides when it goes
    started_at: float = 0.0
    stop_failures: int = 0  # stops that left processes running; the reaper retries while > 0
    retry_at: float = 0.0  # wall-clock time (shared by the node's processes) of the next try


@runtime_checkable
class SandboxLedger(Protocol):
    def record(self, record: SandboxRecord) -> None:
        """Add (or replace) the entry of ``record.sandbox_id`` on ``record.node``."""

    def remove(self, node: str, sandbox_id: str) -> None:
        """Drop an entry (no error when it is not there)."""

    def list(self, node: str) -> list[SandboxRecord]:
        """Every entry of ``node``."""

    def get(self, node: str, sandbox_id: str) -> SandboxRecord | None:
        """One entry (None when it is not there)."""

    def transfer(self, node: str, sandbox_id: str, owner: ProcessRef, worker: str) -> bool:
        """Make ``owner`` (named ``worker``) the sandbox's owner; False when the entry is gone.
        RUN adopts what INIT started: from then on RUN's process is the one whose death may
        get the sandbox reaped."""


class TransferByRewrite:
    """``SandboxLedger.transfer`` for a ledger whose ``record`` replaces an entry: read it, write
    it back with the new owner. Not atomic: a stop between the two re-creates the entry, which
    the next stop of that sandbox removes again. Good enough for :class:`FileSandboxLedger`
    (tests, one node); the service's Redis ledger transfers with a compare-and-set instead."""

    def get(self, node: str, sandbox_id: str) -> SandboxRecord | None:
        raise NotImplementedError

    def record(self, record: SandboxRecord) -> None:
        raise NotImplementedError

    def transfer(self, node: str, sandbox_id: str, owner: ProcessRef, worker: str) -> bool:
        record = self.get(node, sandbox_id)
        if record is None:
            return False
        self.record(record.model_copy(update={"owner": owner, "worker": worker}))
        return True


class FileSandboxLedger(TransferByRewrite):
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

    def get(self, node: str, sandbox_id: str) -> SandboxRecord | None:
        try:
            return SandboxRecord.model_validate_json(self._path(node, sandbox_id).read_text())
        except (OSError, ValueError):
            return None

    def list(self, node: str) -> list[SandboxRecord]:
        records = []
        for path in sorted((self.root / node).glob("*.json")):
            try:
                records.append(SandboxRecord.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue  # removed meanwhile, or a torn file from a crashed writer
        return records
