"""A warm pool: sandboxes started ahead of the jobs, kept ready by an INIT worker process.

A job's INIT takes a ready sandbox whose request matches its own (``JobSandboxes.start``), and
then has nothing to wait for: the tool server answers, the shell is spawned, and the IPython
kernel or the search index is already started when the request's ``tools`` name them
(``SandboxRequest.tools``). One sandbox serves one job and is never given back: RUN stops it as
any other. A miss starts one as before, and makes the request's kind one the pool keeps.

Ownership (DESIGN decision 17). A pooled sandbox is an ordinary ledger entry whose job id is
the pool's own (``pool-<hex>``, which no job record has) and whose owner is this INIT worker
process. Taking it rewrites the entry's job id (``RedisSandboxLedger.assign``, a
compare-and-set), so from then on it is the job's, like a sandbox started for it. Until then:

- this process stops its pooled sandboxes when it shuts down, and when the service is stopped
  (``/stop``; they are refilled after ``/start``);
- a process that dies (SIGKILL, an out-of-memory kill) leaves entries whose owner is dead and
  that no job holds: every worker of the node stops them on its next reaper tick, as it stops
  the sandbox of an INIT that died half-way.

Refills run on one thread of the process with an event loop of its own, one sandbox at a time,
so a refill never holds an INIT thread. The pool keeps ``size`` ready sandboxes of each kind
while their summed resident memory stays under ``max_mb`` and the node has that much again
available; kinds come from ``presets`` (``PRORL_WARM_POOL_IMAGES``) and from the requests that
missed, at most :data:`MAX_KINDS` of them, the least recently asked-for dropped first.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import statistics
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from handlers import SandboxRequest
from singularity.runtime import ProcessRef, procfs
from singularity.toolserver.client import ToolClient

log = logging.getLogger(__name__)

#: the job id of a pooled sandbox's ledger entry starts with this (no job has such an id)
POOL_PREFIX = "pool-"
#: kinds of sandbox one pool keeps at once (each a distinct request)
MAX_KINDS = 8
#: refill durations kept for the reported percentiles
REFILL_HISTORY = 64
#: how often an idle refill thread looks again (and at most how often it asks whether the
#: service is stopped)
IDLE_S = 1.0
#: pause after a failed refill, doubling to at most a minute (a broken image must not spin)
FAILED_REFILL_S = 1.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Pooled:
    """A ready sandbox: what a job stores (``sandbox``), and its ledger entry as last written
    (``entry``, for a one-round-trip compare-and-set when a job takes it)."""

    sandbox: dict[str, str]
    entry: str | None
    root: ProcessRef | None
    rss_mb: float


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    started: int = 0
    failed: int = 0
    refill_s: deque[float] = field(default_factory=lambda: deque(maxlen=REFILL_HISTORY))


def parse_presets(text: str) -> list[SandboxRequest]:
    """``PRORL_WARM_POOL_IMAGES``: ``image[+tool...]`` entries, comma separated (``dev+python``):
    the request a handler makes for that image and tools with every other field at its default."""
    presets = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        image, *tools = entry.split("+")
        presets.append(SandboxRequest(image=image, tools=tuple(tools)))
    return presets


def kind_label(request: SandboxRequest) -> str:
    """How ``/status`` names a kind: its image and tools, and ``*<digest>`` when other fields differ
    from a plain request's (binds, limits)."""
    plain = SandboxRequest(image=request.image, tools=request.tools)
    digest = "" if request == plain else "*" + hashlib.sha1(repr(request).encode()).hexdigest()[:6]
    return "+".join([request.image, *request.tools]) + digest


class WarmPool:
    """Ready sandboxes of one INIT worker process (see the module docstring)."""

    def __init__(self, sandboxes: Any, *, size: int, max_mb: float, presets: Iterable[SandboxRequest] = (),
                 count: Callable[[str, int], None] | None = None,
                 paused: Callable[[], bool] | None = None) -> None:
        self.sandboxes, self.size, self.max_mb = sandboxes, size, max_mb
        self._count = count or (lambda name, amount: None)
        self._paused = paused or (lambda: False)
        #: kind -> ready sandboxes, the most recently asked-for kind last
        self._ready: OrderedDict[SandboxRequest, deque[Pooled]] = OrderedDict(
            (request, deque()) for request in presets)
        self._counters = _Counters()
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._rss_estimate_mb = 0.0
        self._stopped_service = False

    # -- the INIT side --------------------------------------------------------------------------

    def take(self, request: SandboxRequest) -> Pooled | None:
        """A ready sandbox for ``request`` (now the caller's), or None: a miss, which makes
        ``request`` a kind the pool keeps."""
        with self._cond:
            ready = self._ready.get(request)
            taken = None
            while ready and taken is None:
                pooled = ready.popleft()
                if pooled.root is None or procfs.is_alive(pooled.root):
                    taken = pooled
                else:  # died while waiting (killed from outside): the reaper has its entry
                    log.warning("pooled sandbox %s died while ready", pooled.sandbox["id"])
            if ready is None and not self._closed.is_set():
                self._ready[request] = ready = deque()
                self._drop_old_kinds()
            if ready is not None:
                self._ready.move_to_end(request)
            if taken is None:
                self._counters.misses += 1
            else:
                self._counters.hits += 1
            self._cond.notify_all()  # a refill to do
        self._count("warm_pool_hits" if taken else "warm_pool_misses", 1)
        return taken

    def _drop_old_kinds(self) -> None:
        while len(self._ready) > MAX_KINDS:
            _, dropped = self._ready.popitem(last=False)
            for pooled in dropped:
                self._stop_later(pooled)

    # -- the refill thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refill, name="prorl-warm-pool", daemon=True)
        self._thread.start()

    def _refill(self) -> None:
        loop = asyncio.new_event_loop()
        backoff = FAILED_REFILL_S
        try:
            while not self._closed.is_set():
                kind = self._next_kind()
                if kind is None:
                    with self._cond:
                        if not self._closed.is_set():
                            self._cond.wait(IDLE_S)
                    continue
                try:
                    loop.run_until_complete(self._fill(kind))
                    backoff = FAILED_REFILL_S
                except Exception:  # noqa: BLE001 - the pool goes on; INIT starts its own meanwhile
                    log.exception("warm pool: cannot start a %s sandbox", kind_label(kind))
                    with self._cond:
                        self._counters.failed += 1
                    self._closed.wait(backoff)
                    backoff = min(60.0, backoff * 2)
        finally:
            loop.close()

    def _next_kind(self) -> SandboxRequest | None:
        """The kind to start a sandbox of now: the emptiest below ``size`` (the most recently
        asked-for first among equals), when memory allows; None: nothing to do."""
        if self._service_stopped():
            return None
        with self._cond:
            wanting = [(len(ready), i, kind) for i, (kind, ready) in enumerate(reversed(self._ready.items()))
                       if len(ready) < self.size]
            held_mb = sum(p.rss_mb for ready in self._ready.values() for p in ready)
        if not wanting:
            return None
        if held_mb + self._rss_estimate_mb > self.max_mb or _available_mb() < 2 * self._rss_estimate_mb:
            return None
        return min(wanting, key=lambda item: item[:2])[2]

    def _service_stopped(self) -> bool:
        """``/stop``: stop refilling and close what is ready (refilled after ``/start``)."""
        try:
            stopped = self._paused()
        except Exception:  # noqa: BLE001 - Redis away: keep the pool as it is
            return self._stopped_service
        if stopped and not self._stopped_service:
            log.info("service stopped: closing the warm pool's sandboxes")
            self._drain()
        self._stopped_service = stopped
        return stopped

    async def _fill(self, kind: SandboxRequest) -> None:
        started = time.monotonic()
        sandbox = await self.sandboxes.start_new(f"{POOL_PREFIX}{uuid.uuid4().hex[:12]}", kind)
        try:
            async with ToolClient(sandbox["socket_path"]) as client:
                await client.warm(ipython="python" in kind.tools,
                                  search="search" in kind.tools and kind.search_corpus is not None)
            record = self.sandboxes.ledger.get(sandbox["node"], sandbox["id"])
            root = record.root if record is not None else None
            members = procfs.members(root, record.pidns, record.refs) if record is not None else []
            rss_mb = sum(_rss_mb(info.pid) for info in members)
        except BaseException:
            await self.sandboxes.stop(sandbox)
            raise
        elapsed = time.monotonic() - started
        with self._cond:
            ready = self._ready.get(kind)
            keep = ready is not None and not self._closed.is_set()
            if ready is not None and keep:
                ready.append(Pooled(sandbox, record.model_dump_json() if record else None, root, rss_mb))
                self._counters.started += 1
                self._counters.refill_s.append(elapsed)
                self._rss_estimate_mb = max(self._rss_estimate_mb, rss_mb)
        if not keep:  # closed, or its kind dropped, meanwhile
            await self.sandboxes.stop(sandbox)

    # -- closing --------------------------------------------------------------------------------

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop refilling and stop every ready sandbox (worker shutdown)."""
        with self._cond:
            self._closed.set()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._drain()

    def stop_refilling(self) -> None:
        """SIGTERM: no new sandbox from now on (the ready ones stay until :meth:`close`)."""
        with self._cond:
            self._closed.set()
            self._cond.notify_all()

    def _drain(self) -> None:
        with self._cond:
            pooled = [p for ready in self._ready.values() for p in ready]
            for ready in self._ready.values():
                ready.clear()
        for entry in pooled:
            self._stop_now(entry)

    def _stop_now(self, pooled: Pooled) -> None:
        try:
            self.sandboxes.stop_blocking(pooled.sandbox)
        except Exception:  # noqa: BLE001 - its ledger entry stays: the reaper retries
            log.exception("warm pool: cannot stop sandbox %s", pooled.sandbox["id"])

    def _stop_later(self, pooled: Pooled) -> None:
        threading.Thread(target=self._stop_now, args=(pooled,), name="prorl-warm-pool-stop", daemon=True).start()

    # -- what /status shows ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._cond:
            kinds = {kind_label(kind): len(ready) for kind, ready in self._ready.items()}
            counters = self._counters
            refills = list(counters.refill_s)
            held_mb = sum(p.rss_mb for ready in self._ready.values() for p in ready)
            return {"size": self.size, "ready": sum(kinds.values()), "kinds": kinds, "hits": counters.hits,
                    "misses": counters.misses, "started": counters.started, "failed": counters.failed,
                    "refill_s_p50": round(statistics.median(refills), 4) if refills else None,
                    "refill_s_last": round(refills[-1], 4) if refills else None,
                    "rss_mb": round(held_mb, 1), "max_mb": self.max_mb}


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def _available_mb() -> float:
    """The node's MemAvailable (a large number where /proc/meminfo cannot be read)."""
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return float("inf")
