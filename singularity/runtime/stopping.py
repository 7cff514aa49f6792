"""The one way a sandbox is torn down, and the reaper that retries it.

Every stop goes through :func:`teardown`: :meth:`Runtime.stop <.base.Runtime.stop>` (from the
:class:`~.base.Sandbox` in hand), a start that failed half-way, a worker stopping a sandbox
another process started (from its ledger entry), and :func:`reap`. It works from a
:class:`~.ledger.SandboxRecord` alone, so any process of the node can do it:

1. SIGTERM every member, SIGKILL after the grace period, check /proc (:func:`.procfs.terminate`);
2. nothing left: release the loopback lease, remove the state directory, drop the ledger entry,
   in that order, so a crash part-way leaves an entry that the next reap finishes;
3. something left: the entry stays in the ledger, marked with the number of failed stops and
   when to try again (exponential backoff, capped at :data:`RETRY_MAX_S`). :func:`reap`, which
   every worker runs on every reaper tick, retries it until it succeeds, whether its owner is
   alive or not: a failed stop no longer waits for its worker to die.

A sandbox belongs to its job, not to the process that started it: :func:`reap` stops a sandbox
whose owner process is gone only once nobody holds it any more, which the caller decides with
``still_needed(record)`` (the service asks the job's record: a job that INIT handed to RUN still
holds the sandbox its INIT worker started, and RUN adopts it). Without a ``still_needed`` the
owner's death ends the sandbox. This module stays free of any job store: the predicate is the
caller's. A live owner's sandbox is in use, unless the caller's ``released(record)`` says its
job let go of it (the service: the job moved on while a RUN that never adopted it was lost).

The job workspace is never removed here: the caller that made it decides (the report carries it).
"""
from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from . import procfs
from .addresses import AddressAllocator
from .ledger import SandboxLedger, SandboxRecord
from .procfs import ProcessRef, ProcInfo

log = logging.getLogger(__name__)

#: a failed stop is retried after 1, 2, 4, ... s, never more than a minute apart (a stuck
#: process, e.g. in uninterruptible I/O, may need a while; a minute keeps the reaper cheap)
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0

#: stops the members of a sandbox and returns what still runs (:func:`.procfs.terminate`'s shape)
Terminate = Callable[[ProcessRef | None, int | None, Iterable[ProcessRef], float,
                      subprocess.Popen | None], list[ProcInfo]]


class ReapReport(BaseModel):
    """What one teardown did."""

    model_config = ConfigDict(extra="forbid")
    sandbox_id: str
    job_id: str
    worker: str
    killed: list[int]  # pids that were still running and got stopped
    left: list[int]  # pids still running after SIGKILL (empty: the sandbox is gone)
    workspace: str = ""  # the record's workspace (not removed here: it is the caller's)
    stop_failures: int = 0  # failed stops so far (0 when this one succeeded)
    retry_at: float | None = None  # wall-clock time of the next try, when this one failed


def retry_delay(failures: int) -> float:
    """Seconds between the ``failures``-th failed stop and the next try (bounded backoff)."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** min(max(0, failures - 1), 32))


def _terminate(root: ProcessRef | None, pidns: int | None, refs: Iterable[ProcessRef],
               grace_s: float, popen: subprocess.Popen | None) -> list[ProcInfo]:
    return procfs.terminate(root, pidns, refs, grace_s, popen)


def teardown(record: SandboxRecord, *, ledger: SandboxLedger | None = None,
             allocator: AddressAllocator | None = None, grace_s: float = 2.0,
             popen: subprocess.Popen | None = None,
             terminate: Terminate = _terminate) -> ReapReport:
    """Stop the sandbox of ``record`` and clean up after it (see the module docstring).

    ``popen``: the root process when it is the caller's child (it is reaped on the way);
    ``terminate``: how the members are stopped (a runtime's :meth:`~.base.Runtime._terminate`).
    """
    # a recent shared snapshot: its root was started long before, and terminate re-checks
    running = procfs.members(record.root, record.pidns, record.refs,
                             newer_than=time.monotonic() - procfs.poll_age_s())
    left = terminate(record.root, record.pidns, record.refs, grace_s, popen) \
        if running or popen is not None else []
    report = ReapReport(sandbox_id=record.sandbox_id, job_id=record.job_id, worker=record.worker,
                        killed=[i.pid for i in running], left=[i.pid for i in left],
                        workspace=record.workspace)
    if left:
        failures = record.stop_failures + 1
        retry_at = time.time() + retry_delay(failures)
        if ledger is not None:  # kept (or put back) so that the reaper retries it
            ledger.record(record.model_copy(update={"stop_failures": failures, "retry_at": retry_at}))
        log.error("sandbox %s of job %s: pids %s survived SIGKILL (failed stop %d); retrying in %.0f s",
                  record.sandbox_id, record.job_id, report.left, failures, retry_at - time.time())
        return report.model_copy(update={"stop_failures": failures, "retry_at": retry_at})
    if allocator is not None and record.address:
        allocator.release(record.address, record.sandbox_id)
    if record.state_dir:
        shutil.rmtree(record.state_dir, ignore_errors=True)
    if ledger is not None:
        ledger.remove(record.node, record.sandbox_id)
    return report


#: each sandbox's own copy of its ledger entry, in its state directory: what stops it when the
#: ledger itself is lost (a Redis whose state was reset), see :func:`untracked`
LOCAL_RECORD = "record.json"


def write_local_record(record: SandboxRecord) -> None:
    """Keep ``record`` beside the sandbox, in its state directory."""
    if record.state_dir:
        path = Path(record.state_dir) / LOCAL_RECORD
        temporary = path.with_suffix(".tmp")
        temporary.write_text(record.model_dump_json())
        temporary.replace(path)


def untracked(state_root: Path, tracked: Callable[[], set[str]], older_than: float) -> list[SandboxRecord]:
    """The sandboxes under ``state_root`` that the ledger no longer lists, started before
    ``older_than`` (wall clock): their entries were lost with the ledger (a Redis restarted
    empty), so no job will stop them. The state directories are read before ``tracked()`` lists
    the ledger: a sandbox's entry is written before its local copy and removed after its
    directory, so one being started or stopped meanwhile is never taken for untracked."""
    found = []
    for path in sorted(state_root.glob(f"*/{LOCAL_RECORD}")):
        try:
            found.append(SandboxRecord.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue
    listed = tracked()
    return [_with_root(record) for record in found
            if record.sandbox_id not in listed and record.started_at < older_than]


def _with_root(record: SandboxRecord) -> SandboxRecord:
    """``record``, its root process found by the sandbox's log when the record was written
    before the start (its worker died while the root was being forked: nothing else names it).
    The runtimes start the root in a session of its own, with its output to ``server.log``."""
    if record.root is not None or record.refs or not record.state_dir:
        return record
    writers = procfs.writing_to(Path(record.state_dir) / "server.log")
    root = next((info for info in writers if info.session == info.pid), None)
    return record.model_copy(update={
        "root": ProcessRef(pid=root.pid, start_time=root.start_time) if root else None,
        "refs": [ProcessRef(pid=info.pid, start_time=info.start_time) for info in writers]})


#: is a sandbox whose owner process is gone still held by its job? (the caller's answer)
StillNeeded = Callable[[SandboxRecord], bool]
#: has a sandbox's live owner been left holding a sandbox nobody will use or stop? (the caller's
#: answer: an owner that died half-way through a hand-over, its job moved on without it)
Released = Callable[[SandboxRecord], bool]


def owner_only(record: SandboxRecord) -> bool:
    """The default ``still_needed``: nothing outlives its owner process."""
    return False


def kept_by_owner(record: SandboxRecord) -> bool:
    """The default ``released``: a live owner's sandbox is in use."""
    return False


def due(record: SandboxRecord, now: float,
        owner_alive: Callable[[ProcessRef], bool] = procfs.is_alive,
        still_needed: StillNeeded = owner_only, released: Released = kept_by_owner) -> bool:
    """Is ``record`` the reaper's to stop now? A failed stop, once its retry time has come;
    any other sandbox once its owner process is dead and ``still_needed`` says nobody holds it,
    or while its owner lives, once ``released`` says its job let go of it."""
    if record.stop_failures:
        return record.retry_at <= now
    if owner_alive(record.owner):
        return released(record)
    return not still_needed(record)


def reap(ledger: SandboxLedger, node: str, *, allocator: AddressAllocator | None = None,
         grace_s: float = 2.0, owner_alive: Callable[[ProcessRef], bool] = procfs.is_alive,
         still_needed: StillNeeded = owner_only, released: Released = kept_by_owner,
         records: list[SandboxRecord] | None = None, now: float | None = None,
         terminate: Terminate = _terminate) -> list[ReapReport]:
    """Tear down every sandbox of ``node`` that is :func:`due`; return what was done.

    Sandboxes of live owners that never failed a stop are left alone unless ``released`` lets
    them go; so are those of dead owners that ``still_needed`` keeps (another process will adopt
    and stop them). ``records``: the node's entries as the caller already listed them (before it
    read what its predicates answer from), else listed here.
    """
    moment = time.time() if now is None else now
    return [teardown(record, ledger=ledger, allocator=allocator, grace_s=grace_s, terminate=terminate)
            for record in (ledger.list(node) if records is None else records)
            if due(record, moment, owner_alive, still_needed, released)]
