"""``ApptainerRuntime``: sandboxes from ``.sif`` images with Apptainer or SingularityCE.

The production runtime on HPC clusters, where users cannot be root and images live on a shared
file system. Either binary works (``apptainer`` is preferred, then ``singularity``). The tool
server runs as the container's command (``exec`` mode): our child is the ``apptainer`` process,
so stopping it is the same as for every runtime (SIGTERM to the members, SIGKILL after the
grace period, /proc check by pid namespace and descendants).

Command line (:meth:`ApptainerRuntime.exec_command`, checked flag by flag in the tests)::

    apptainer exec --containall --no-mount home,cwd --pid [--fakeroot]
        [--net --network none]              # unless the spec asks for networking
        --pwd /workspace --env-file <state>/env
        --bind <workspace>:/workspace:rw --bind <state>/sock:/run/toolserver:rw
        [--bind <src>:<dst>:ro|rw ...] [--bind <singularity pkg>:/opt/prorl/singularity:ro]
        [--memory N --pids-limit N]         # only with use_cgroups=True
        IMAGE.sif [prlimit --nproc=.. --as=.. --cpu=.. --] python3 -m singularity.toolserver ...

``--containall`` already implies ``--contain --cleanenv --ipc --pid``; ``--pid`` is spelled out
so the intent survives a change of defaults. The environment goes through ``--env-file``
(values may hold commas, and secrets stay off the command line). Limits use ``prlimit`` inside
(per-sandbox process counts need Apptainer's user-namespace mode; with a setuid installation
RLIMIT_NPROC counts all the user's processes) unless ``use_cgroups`` selects Apptainer's cgroup
flags (needs cgroups v2 with delegation for rootless use).

:func:`instance_start_command` / :func:`instance_stop_command` build the ``instance`` variant for
sites that prefer long-lived named instances; the runtime itself uses ``exec``.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import procfs
from .base import (
    SOCKET_DIR,
    SOCKET_NAME,
    WORKSPACE,
    Availability,
    Launch,
    Runtime,
    SandboxSpec,
    Spawned,
    limit_prefix,
    sandbox_env,
)
from .errors import InvalidSpec

BINARIES = ("apptainer", "singularity")
SOURCE_TARGET = "/opt/prorl"
_SOURCE = Path(__file__).resolve().parents[1]


def find_binary(names: Sequence[str] = BINARIES) -> str | None:
    for name in names:
        if path := shutil.which(name):
            return path
    return None


class ApptainerRuntime(Runtime):
    """Sandboxes with ``apptainer exec`` (see the module docstring)."""

    name = "apptainer"

    def __init__(self, *, binary: str | None = None, fakeroot: bool = False,
                 bind_source: bool = False, use_cgroups: bool = False, python: str = "python3",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.binary = binary or find_binary() or BINARIES[0]
        self.fakeroot, self.bind_source, self.use_cgroups = fakeroot, bind_source, use_cgroups
        self.python = python

    def available(self) -> Availability:
        path = shutil.which(self.binary)
        if path is None:
            return Availability(False, f"neither {' nor '.join(BINARIES)} is on PATH")
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Availability(False, f"{path} --version failed: {exc}")
        return Availability(done.returncode == 0, (done.stdout or done.stderr).strip())

    def common_options(self, spec: SandboxSpec, sandbox_dir: Path) -> list[str]:
        """Isolation, network, binds, env and limits: shared by ``exec`` and ``instance start``."""
        args = ["--containall", "--no-mount", "home,cwd", "--pid"]
        if self.fakeroot:
            args.append("--fakeroot")
        if not spec.network:
            args += ["--net", "--network", "none"]
        args += ["--pwd", WORKSPACE, "--env-file", str(sandbox_dir / "env")]
        binds = [f"{spec.workspace}:{WORKSPACE}:rw", f"{sandbox_dir / 'sock'}:{SOCKET_DIR}:rw"]
        binds += [f"{b.source}:{b.target}:{'ro' if b.read_only else 'rw'}" for b in spec.binds]
        if self.bind_source:
            binds.append(f"{_SOURCE}:{SOURCE_TARGET}/singularity:ro")
        for bind in binds:
            args += ["--bind", bind]
        if self.use_cgroups:
            if spec.limits.memory_bytes:
                args += ["--memory", str(spec.limits.memory_bytes)]
            if spec.limits.max_processes:
                args += ["--pids-limit", str(spec.limits.max_processes)]
        return args

    def exec_command(self, spec: SandboxSpec, sandbox_dir: Path) -> list[str]:
        """The whole ``apptainer exec`` command line that starts the tool server."""
        self._check_image(spec)
        return [self.binary, "exec", *self.common_options(spec, sandbox_dir), spec.image,
                *self._inner(spec)]

    def _inner(self, spec: SandboxSpec) -> list[str]:
        limits = spec.limits
        if self.use_cgroups:  # memory and processes go to the cgroup; CPU time stays an rlimit
            limits = limits.model_copy(update={"memory_bytes": None, "max_processes": None})
        server = self.server_command(self.python, f"{SOCKET_DIR}/{SOCKET_NAME}", WORKSPACE)
        return limit_prefix(limits) + server

    def env_file(self, spec: SandboxSpec) -> str:
        """``--env-file`` contents (shell syntax); PATH is left to the image."""
        extra = {"PYTHONPATH": SOURCE_TARGET} if self.bind_source else {}
        env = sandbox_env(spec, extra=extra)
        env.pop("PATH", None)
        return "".join(f"{name}={shlex.quote(value)}\n" for name, value in env.items())

    def _check_image(self, spec: SandboxSpec) -> None:
        if not spec.image.endswith(".sif") and not spec.image.startswith(("docker://", "oras://", "library://")):
            raise InvalidSpec(f"ApptainerRuntime needs a .sif image (or a registry URI), not {spec.image!r}")

    async def _spawn(self, spec: SandboxSpec, sandbox_dir: Path, log: Any, spawned: Spawned) -> Launch:
        argv = self.exec_command(spec, sandbox_dir)
        env_path = sandbox_dir / "env"
        env_path.write_text(self.env_file(spec))
        env_path.chmod(0o600)
        host_env = {key: os.environ[key] for key in ("PATH", "HOME", "USER", "LANG") if key in os.environ}
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=host_env)
        spawned(popen)
        return Launch(popen=popen)

    def _after_ready(self, launch: Launch) -> None:
        """Learn the container's pid namespace (the first descendant in another one)."""
        ours = procfs.pid_namespace(os.getpid())
        root = procfs.ProcessRef.of(launch.popen.pid)
        for info in procfs.members(root):
            pidns = procfs.pid_namespace(info.pid)
            if pidns is not None and pidns != ours:
                launch.pidns = pidns
                return


def instance_start_command(runtime: ApptainerRuntime, spec: SandboxSpec, sandbox_dir: Path,
                           name: str) -> list[str]:
    """``apptainer instance start`` with the same options as ``exec``."""
    runtime._check_image(spec)
    return [runtime.binary, "instance", "start", *runtime.common_options(spec, sandbox_dir),
            spec.image, name]


def instance_exec_command(runtime: ApptainerRuntime, spec: SandboxSpec, name: str) -> list[str]:
    """Start the tool server inside a running instance."""
    return [runtime.binary, "exec", "--pwd", WORKSPACE, f"instance://{name}", *runtime._inner(spec)]


def instance_stop_command(runtime: ApptainerRuntime, name: str, grace_s: float) -> list[str]:
    """SIGTERM, then SIGKILL after ``grace_s`` (Apptainer's own escalation)."""
    return [runtime.binary, "instance", "stop", "--signal", "SIGTERM", "--timeout",
            str(max(1, int(grace_s))), name]
