"""Job sandboxes: started by INIT, used by RUN on the same node, stopped right after RUN.

INIT and RUN run in different worker processes of one node, so a sandbox is handed over
through its ledger entry (Redis): RUN adopts it (the entry's owner becomes RUN's process),
connects to the tool server's Unix socket and stops the sandbox from the entry's process
identities (the runtime's one teardown path).

A sandbox belongs to its job, not to the worker that started it: it is started without
``--die-with-parent``, so INIT's worker may exit (a rolling restart, an OOM kill) while the jobs
it handed to RUN keep their sandboxes. Every worker on a node reaps at start-up and on each
reaper tick: every failed stop whose retry is due, until it succeeds, and the sandboxes of dead
owners that no job holds any more (:meth:`JobSandboxes.still_needed`, read from the job's
record), and those a live owner was left with after its job let go of them
(:meth:`JobSandboxes.released`: a RUN worker lost before it adopted the sandbox). An EVAL
sandbox (job id ``<job>-eval``) is its EVAL worker's: no job record names it, so it is reaped
once that worker is gone, or once its job is no longer in EVAL (an EVAL whose stop failed).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handlers import SandboxRequest
from prorl_celery.core.status import JobStatus
from prorl_celery.state import keys
from prorl_celery.state.store import JobRecord, decode_record
from prorl_celery.worker.node_sandboxes import RedisAddressAllocator, RedisSandboxLedger
from singularity.runtime import (
    Bind,
    Limits,
    ProcessRef,
    ReapReport,
    Released,
    Runtime,
    SandboxRecord,
    SandboxSpec,
    StillNeeded,
    kept_by_owner,
    make_runtime,
    procfs,
    reap,
    teardown,
    untracked,
)
from singularity.toolserver.client import ToolClient
from singularity.toolserver.protocol import SEARCH_CORPUS_ENV

if TYPE_CHECKING:
    from prorl_celery.worker.warm_pool import WarmPool

log = logging.getLogger(__name__)

#: SIGTERM to SIGKILL for a job's sandbox: a tool server exits at once, and a /stop with
#: hundreds of jobs in flight must close them all within seconds
STOP_GRACE_S = 2.0
#: a sandbox without a ledger entry is stopped once it is this old: its entry was lost (Redis
#: restarted empty), not about to be written
UNTRACKED_AFTER_S = 30.0
#: the statuses in which a job holds the sandbox its record names after INIT has handed it over
HOLDING = frozenset({JobStatus.PENDING_RUN, JobStatus.RUN})
#: an EVAL sandbox's job id is its job's with this suffix (no job record names the sandbox)
EVAL_SANDBOX_SUFFIX = "-eval"
#: the statuses in which INIT may be starting a sandbox for the job's current attempt
STARTING = frozenset({JobStatus.PENDING_INIT, JobStatus.INIT})
#: the job record's fields that say whether it holds a sandbox (one HMGET, not the whole record)
_HOLDER_FIELDS = ("status", "sandbox", "run_node", "worker_pid")


class JobSandboxes:
    """One per worker process; the runtime is created on first use."""

    def __init__(self, redis_client: Any, *, node: str, runtime: str, root: str) -> None:
        self.node, self.runtime_name, self.root = node, runtime, Path(root)
        self.workspaces = self.root / "workspaces"
        self.redis = redis_client
        self.allocator = RedisAddressAllocator(redis_client, node)
        self.ledger = RedisSandboxLedger(redis_client)
        self._runtime: Runtime | None = None
        #: this process's warm pool (INIT workers with ``PRORL_WARM_POOL_SIZE`` > 0), else None
        self.pool: WarmPool | None = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            options = dict(state_dir=self.root / "state", allocator=self.allocator, ledger=self.ledger,
                           node=self.node, worker=f"{self.node}:{os.getpid()}", stop_grace_s=STOP_GRACE_S)
            name = self.runtime_name
            if name == "auto":
                name = "bubblewrap" if shutil.which("bwrap") else "process"
            if name == "bubblewrap":  # the job owns it, not the thread that forks bwrap
                options["die_with_parent"] = False
            self._runtime = make_runtime(name, **options)
        return self._runtime

    async def start(self, job_id: str, request: SandboxRequest) -> dict[str, str]:
        """The job's sandbox: a ready one from this process's warm pool when one matches
        (``"pooled"`` set in what it returns), else one started now; returns what RUN needs to
        find and stop it.

        A pooled sandbox's ledger entry names the job as it is taken; the job's record names the
        sandbox only from INIT's hand-over (``_init``): a worker dying in between leaves an entry
        whose owner is dead and whose job is still in INIT, which the reaper stops either way."""
        if self.pool is not None:
            taken = self.pool.take(request)
            if taken is not None:
                sandbox = taken.sandbox
                if self.ledger.assign(sandbox["node"], sandbox["id"], job_id, expected=taken.entry):
                    return {**sandbox, "pooled": "1"}
                log.warning("pooled sandbox %s left the ledger before job %s took it", sandbox["id"], job_id)
        return await self.start_new(job_id, request)

    async def start_new(self, job_id: str, request: SandboxRequest) -> dict[str, str]:
        """Start a sandbox for ``job_id`` (a warm pool's own id for a pooled one)."""
        # one directory per sandbox, not per job: a retried job's new sandbox must not share
        # (or lose) its workspace to the reaping of the old one
        workspace = self.workspaces / f"{job_id}.{uuid.uuid4().hex[:8]}"
        workspace.mkdir(parents=True)
        limits = Limits(memory_bytes=request.memory_bytes, max_processes=request.max_processes,
                        cpu_seconds=request.cpu_seconds)
        env = {SEARCH_CORPUS_ENV: request.search_corpus} if request.search_corpus else {}
        spec = SandboxSpec(image=request.image, workspace=workspace, network=request.network,
                           limits=limits, job_id=job_id, env=env,
                           binds=tuple(Bind(source=Path(host), target=inside) for host, inside in request.binds))
        sandbox = await self.runtime.start(spec)
        return {"id": sandbox.id, "node": self.node, "socket_path": str(sandbox.socket_path),
                "workspace": str(workspace)}

    def adopt(self, sandbox: dict[str, str]) -> None:
        """This process (RUN) now owns the sandbox: if it dies, the sandbox is reaped (its job's
        RUN is then over: the job's lease retries it from INIT with a new one)."""
        me = ProcessRef.of(os.getpid())
        assert me is not None  # this process is running
        self.ledger.transfer(sandbox["node"], sandbox["id"], me, f"{self.node}:{os.getpid()}")

    async def stop(self, sandbox: dict[str, str] | None) -> None:
        """Stop a job's sandbox from any worker process of its node (no error if gone).

        A stop that leaves processes running keeps its ledger entry, marked for a retry, and
        :meth:`reap` (every worker's reaper tick) retries it, and removes the workspace once
        it succeeds."""
        if not sandbox:
            return
        record = self.ledger.get(sandbox["node"], sandbox["id"])
        workspace = sandbox.get("workspace") or (record.workspace if record else "")
        if record is not None:
            report = await asyncio.to_thread(self._teardown, record)
            if report.left:
                return  # the workspace may still be in use; the reaper's retry removes it
        self._remove_workspace(workspace)

    def stop_blocking(self, sandbox: dict[str, str]) -> None:
        """:meth:`stop`, on the calling thread (no event loop needed)."""
        record = self.ledger.get(sandbox["node"], sandbox["id"])
        if record is not None and self._teardown(record).left:
            return
        self._remove_workspace(sandbox.get("workspace") or (record.workspace if record else ""))

    def _teardown(self, record: SandboxRecord) -> ReapReport:
        """The one teardown path: through this process's runtime when it has one (its stop
        hook), else with the defaults; a process that never started a sandbox (RUN) needs no
        runtime of its own to stop one, so a runtime it cannot make never strands a sandbox."""
        if self._runtime is not None:
            return self._runtime.teardown(record)
        return teardown(record, ledger=self.ledger, allocator=self.allocator, grace_s=STOP_GRACE_S)

    def reap(self) -> int:
        """Stop the sandboxes on this node whose owner process died and that no job holds
        (:meth:`still_needed`), those whose live owner was left with one its job let go of
        (:meth:`released`), and retry the failed stops that are due; returns how many were tried.

        The entries are listed before their jobs are read (one round trip for all): a sandbox
        listed was started before its job's record is read, so a record that names another
        sandbox has moved past this one."""
        records = self.ledger.list(self.node)
        holders = self._holders({job_of(record.job_id) for record in records})
        return self._reap(lambda record: self._still_needed(record, holders.get(job_of(record.job_id))),
                          released=lambda record: self._released(record, holders.get(job_of(record.job_id))),
                          records=records)

    def reap_untracked(self, min_age_s: float = UNTRACKED_AFTER_S) -> int:
        """Stop the sandboxes of this node's sandbox directory that its ledger no longer lists
        (the ledger was lost: Redis restarted without its data), started over ``min_age_s`` ago.
        Their jobs went with the ledger, so nothing else would ever stop them."""
        lost = [record for record in untracked(self.root / "state",
                                               lambda: {r.sandbox_id for r in self.ledger.list(self.node)},
                                               older_than=time.time() - min_age_s)
                if record.node == self.node]  # nodes on one machine may share a sandbox directory
        for record in lost:
            report = teardown(record, grace_s=STOP_GRACE_S)
            if report.stop_failures == 0:
                log.warning("stopped sandbox %s of job %s: no ledger entry (lost with Redis's state)",
                            record.sandbox_id, record.job_id)
                self._remove_workspace(report.workspace)
        return len(lost)

    def close_abandoned(self, owners: Collection[int]) -> int:
        """Stop every sandbox on this node whose owner, one of the process ids ``owners``, is
        gone, whatever its job: these were every worker of a service that stopped (``prorl
        up``'s Ctrl-C), so no RUN will ever adopt one a job still waits with. Returns how many
        were tried."""
        return self._reap(lambda record: record.owner.pid not in owners)

    def close_left_behind(self) -> int:
        """Stop every sandbox on this node whose owner is gone, whatever its job: the node's
        workers have all stopped for good (the end of a Slurm allocation: its jobs were cancelled
        or handed back, retried from INIT with a new sandbox), so no RUN will adopt one. Slurm's
        own SIGKILL does not reach them: a sandbox whose worker exited is no longer a descendant
        of the job step. Returns how many were tried."""
        return self._reap(lambda record: False)

    def _reap(self, still_needed: StillNeeded, released: Released = kept_by_owner,
              records: list[SandboxRecord] | None = None) -> int:
        reports = reap(self.ledger, self.node, allocator=self.allocator, grace_s=STOP_GRACE_S,
                       still_needed=still_needed, released=released, records=records)
        for report in reports:
            if report.stop_failures == 0:
                log.warning("reaped sandbox %s of job %s (owner %s gone or let go of it, or a failed stop "
                            "retried)", report.sandbox_id, report.job_id, report.worker)
                self._remove_workspace(report.workspace)
        return len(reports)

    def still_needed(self, record: SandboxRecord) -> bool:
        """Does a job still hold this sandbox, whose owner process is gone?

        Only a job that INIT handed to RUN (``pending_run``, ``run``) and whose record names this
        very sandbox, and, once a RUN has claimed it, while that RUN's process lives (it adopts
        the sandbox; a dead one never will, and the job's lease retries it with a new sandbox).
        Every other sandbox is the reaper's: its job ended or is gone, was retried with another
        sandbox, or is still in ``init`` (its INIT died with the owner: the lease retries it
        with a new sandbox); an EVAL sandbox has no job record of its own."""
        return self._still_needed(record, self._holder(job_of(record.job_id)))

    def released(self, record: SandboxRecord) -> bool:
        """Has the job let go of this sandbox, whose owner process lives?

        The owner stops its sandboxes itself in the normal course; this catches the ones it
        never will. A RUN worker that dies between claiming a job and adopting its sandbox
        leaves it with INIT's live worker, and the job moves on without it (retried with another
        sandbox, or ended). So it is let go of once the job ended, or once the job is past INIT
        and no longer holds it (:meth:`still_needed`'s rule): its record names another sandbox
        (unless the job's own RUN is starting that one: a resume that diverged), or its RUN is
        not alive on this node. Kept while the job is in ``pending_init`` or ``init`` (INIT may be
        starting it for the current attempt) and when no job record names the entry (a warm
        pool's own sandbox, an EVAL sandbox: their owners' alone)."""
        return self._released(record, self._holder(job_of(record.job_id)))

    def _still_needed(self, record: SandboxRecord, job: JobRecord | None) -> bool:
        if job is None or job.status not in HOLDING or (job.sandbox or {}).get("id") != record.sandbox_id:
            return False
        if job.status is JobStatus.RUN:
            return job.run_node == record.node and job.worker_pid is not None and _running(job.worker_pid)
        return True

    def _released(self, record: SandboxRecord, job: JobRecord | None) -> bool:
        if record.job_id.endswith(EVAL_SANDBOX_SUFFIX):
            # EVAL stops its own; one whose stop failed (Redis away longer than its retries) is
            # let go of once its job is no longer in EVAL, or gone
            return job is None or job.status is not JobStatus.EVAL
        if job is None or job.status in STARTING:
            return False
        if job.status.terminal:
            return True
        if (job.sandbox or {}).get("id") != record.sandbox_id and job.status is JobStatus.RUN \
                and job.run_node == record.node and job.worker_pid == record.owner.pid:
            return False  # its RUN is starting a fresh one: the record names it next
        return not self._still_needed(record, job)

    def _holder(self, job_id: str) -> JobRecord | None:
        """The fields of ``job_id``'s record that :meth:`still_needed` reads (None: no such job)."""
        return self._holders({job_id}).get(job_id)

    def _holders(self, job_ids: Collection[str]) -> dict[str, JobRecord]:
        """:meth:`_holder` for each of ``job_ids``, in one round trip (those with a record)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), list(_HOLDER_FIELDS))
        found = {}
        for job_id, values in zip(job_ids, pipe.execute()):
            raw = {name: _text(value) for name, value in zip(_HOLDER_FIELDS, values) if value}
            if "status" in raw:
                found[job_id] = decode_record({"id": job_id, **raw})
        return found

    def _remove_workspace(self, workspace: str) -> None:
        """Remove a job workspace this node made (never a path outside ``workspaces/``)."""
        if workspace and Path(workspace).parent == self.workspaces:
            shutil.rmtree(workspace, ignore_errors=True)


def eval_sandbox_job(job_id: str) -> str:
    """The job id an EVAL sandbox of ``job_id`` is recorded under."""
    return job_id + EVAL_SANDBOX_SUFFIX


def job_of(sandbox_job_id: str) -> str:
    """The job a sandbox's recorded job id belongs to (an EVAL sandbox's: without its suffix)."""
    return sandbox_job_id.removesuffix(EVAL_SANDBOX_SUFFIX)


def _running(pid: int) -> bool:
    """A process of this pid runs on this node (a reused pid reads as running: the sandbox is
    then kept until the job's lease moves it on, never stopped under a live RUN)."""
    info = procfs.read_stat(pid)
    return info is not None and info.state not in "ZX"


def _text(value: bytes | str) -> str:
    """A client made without ``decode_responses`` answers bytes."""
    return value.decode() if isinstance(value, bytes) else value


@asynccontextmanager
async def tool_client(sandbox: dict[str, str] | None) -> AsyncIterator[ToolClient | None]:
    """A connected client of the sandbox's tool server, or None for a job without one."""
    if sandbox is None:
        yield None
        return
    async with ToolClient(sandbox["socket_path"]) as client:
        yield client
