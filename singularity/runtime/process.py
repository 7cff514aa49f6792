"""``ProcessRuntime``: the tool server as a plain host process. NO ISOLATION: development only.

It exists so the pipeline and handlers can be developed on a laptop without bubblewrap or
Apptainer. Nothing is contained: the "sandbox" sees and can write the whole host file system
as the worker's user, uses the host network and sees every process. What it does honestly:

* a clean environment (PATH, HOME, LANG, PYTHONPATH, the spec's env);
* RLIMIT_AS and RLIMIT_CPU per process through ``prlimit`` (``max_processes`` cannot be
  enforced per sandbox without a user namespace and is ignored, with a warning);
* a complete stop: the tool server runs under a subreaper (:mod:`._subreaper`), so every
  process it starts, daemons included, is found through /proc and stopped;
* the ownership ledger and address leases, like every runtime.

Every start logs a warning saying there is no isolation. Binds cannot be honoured without a
mount namespace and are refused (:class:`~.errors.InvalidSpec`).
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import procfs
from .base import Availability, Launch, Runtime, SandboxSpec, Spawned, limit_prefix, sandbox_env
from .errors import InvalidSpec
from .layout import host_site_dirs

log = logging.getLogger(__name__)
_PROJECT = Path(__file__).resolve().parents[2]  # the directory holding ``singularity``
_SUBREAPER = Path(__file__).with_name("_subreaper.py")


class ProcessRuntime(Runtime):
    """Unisolated host processes, for development only (see the module docstring)."""

    name = "process-unisolated"
    isolated = False

    def __init__(self, *, python: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.python = python or sys.executable

    def available(self) -> Availability:
        return Availability(True, "always available; gives NO isolation (development only)")

    async def _spawn(self, spec: SandboxSpec, sandbox_dir: Path, log_file: Any, spawned: Spawned) -> Launch:
        if spec.binds:
            raise InvalidSpec("ProcessRuntime cannot honour binds (no mount namespace)")
        log.warning("ProcessRuntime starts job %r with NO isolation: host file system, network "
                    "and processes are all reachable; use it for development only", spec.job_id)
        limits = spec.limits
        if limits.max_processes is not None:
            log.warning("ProcessRuntime ignores max_processes=%s (no per-sandbox process count "
                        "without a user namespace)", limits.max_processes)
            limits = limits.model_copy(update={"max_processes": None})
        # this interpreter: its site-packages are known, so the server skips site (python -S)
        site_dirs = host_site_dirs() if self.python == sys.executable else ()
        server = self.server_command(self.python, str(self._host_socket(sandbox_dir)), str(spec.workspace),
                                     no_site=bool(site_dirs))
        argv = [self.python, "-I", "-S", str(_SUBREAPER), *limit_prefix(limits), *server]
        pythonpath = ":".join([str(_PROJECT), *site_dirs])
        env = sandbox_env(spec, home=str(sandbox_dir), extra={"PYTHONPATH": pythonpath})
        popen = subprocess.Popen(argv, cwd=spec.workspace, env=env, stdin=subprocess.DEVNULL,
                                 stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        spawned(popen)
        return Launch(popen=popen)

    def _after_ready(self, launch: Launch) -> None:
        """Record the tool server too: found even if the subreaper above it dies."""
        root = procfs.ProcessRef.of(launch.popen.pid)
        launch.refs = [procfs.ProcessRef(pid=i.pid, start_time=i.start_time)
                       for i in procfs.members(root) if root is None or i.pid != root.pid]
