"""``BubblewrapRuntime``: sandboxes on ``bwrap`` (Debian package ``bubblewrap``), rootless.

What a sandbox gets:

* every namespace of its own (``--unshare-all``: user, pid, ipc, uts, cgroup, mount and network;
  ``--share-net`` only when the spec asks for networking). Inside a new network namespace only
  ``lo`` exists (bubblewrap brings it up), so loopback works and nothing else is reachable;
* ``--new-session`` (no TIOCSTI into our terminal), and ``--die-with-parent`` only when asked
  (``die_with_parent``, on by default for standalone use). It ties the sandbox to the *thread*
  that forked bwrap, not to a job: the service turns it off, so that a sandbox INIT started
  survives INIT's worker and is stopped by RUN, or by the node's reaper once no job holds it;
* a read-only root assembled from an image layout (:mod:`.layout`), its own ``/proc``, ``/dev``
  (with a private ``/dev/shm``) and a size-capped ``/tmp``; the host workspace read-write at
  ``/workspace`` and the socket directory at ``/run/toolserver``; the spec's binds;
* a clean environment: PATH, HOME=/tmp, LANG, PYTHONPATH for the tool server, the spec's env;
  arguments go to bwrap through a memfd (``--args``), so the env is not on any command line;
* limits through ``prlimit`` right before the tool server starts: RLIMIT_AS and RLIMIT_CPU per
  process; RLIMIT_NPROC counts the tasks of one uid *in one user namespace* (kernel >= 5.14
  keeps these counts per namespace), and every sandbox has its own user namespace, so
  ``max_processes`` bounds each sandbox on its own. The limit is set inside, after the
  namespace exists, so it never counts the same uid's processes elsewhere on the host.

Who runs it:

* **unprivileged caller** (the normal HPC case): ``bwrap --unshare-user --disable-userns``; the
  sandbox runs as the caller's uid inside its own user namespace.
* **root caller** (CI, containers): the kernel never enforces RLIMIT_NPROC for host root, and a
  sandbox should not run as root anyway, so it runs as ``sandbox_uid`` (default 65534,
  ``nobody``). bubblewrap is started as root so it can bind paths only root can traverse (a
  Python under ``/root``), with ``--userns-block-fd``: we write the new user namespace's map
  ourselves (``0 -> 0`` for bubblewrap's own set-up, ``sandbox_uid -> sandbox_uid``), then
  ``setpriv`` inside drops to ``sandbox_uid`` with no capabilities (bwrap keeps only SETUID,
  SETGID and SETPCAP for that step and sets no_new_privs, so setuid binaries stay inert). The
  workspace is chowned to ``sandbox_uid`` so the sandbox can write it. ``sandbox_uid=0`` keeps
  root inside the user namespace (no process limit; not recommended).

Stopping (:mod:`.procfs`): SIGTERM to every process in the sandbox's pid namespace (inode from
``--info-fd``), SIGKILL to the namespace init after the grace period (the kernel then kills the
whole namespace), and a final /proc scan that must find nothing.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from functools import cached_property
from pathlib import Path
from typing import Any

from .base import (
    DEFAULT_PATH,
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
from .errors import InvalidSpec, SandboxStartError
from .layout import ImageLayout, Mount, _under, resolve_image
from .procfs import ProcessRef

NOBODY = 65534
SOURCE_TARGET = "/opt/prorl"
DEFAULT_TMP_BYTES = 1 << 30
#: what every sandbox gets of its own, over whatever the image has there
FRESH_MOUNTS = ("/tmp", "/dev", "/proc")
_SOURCE = Path(__file__).resolve().parents[1]  # the ``singularity`` package


class BubblewrapRuntime(Runtime):
    """Sandboxes on bubblewrap (see the module docstring for what each one gets)."""

    name = "bubblewrap"

    def __init__(self, *, bwrap: str = "bwrap", sandbox_uid: int | None = None,
                 die_with_parent: bool = True, bind_source: bool = True,
                 hostname: str = "sandbox", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bwrap = shutil.which(bwrap) or bwrap
        euid = os.geteuid()
        self.sandbox_uid = (NOBODY if euid == 0 else euid) if sandbox_uid is None else sandbox_uid
        if euid != 0 and self.sandbox_uid != euid:
            raise ValueError("an unprivileged caller runs sandboxes as itself only")
        self.privileged = euid == 0 and self.sandbox_uid != 0  # root caller, dropping to a uid
        self.die_with_parent, self.bind_source, self.hostname = die_with_parent, bind_source, hostname

    def available(self) -> Availability:
        return self._probe

    @cached_property
    def _probe(self) -> Availability:
        if not os.path.exists(self.bwrap):
            return Availability(False, "bwrap not found (apt-get install bubblewrap)")
        argv = [self.bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--", "true"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Availability(False, f"bwrap could not run: {exc}")
        if done.returncode != 0:
            return Availability(False, f"bwrap cannot create namespaces here: {done.stderr.strip()}")
        mode = f"as root, sandboxes run as uid {self.sandbox_uid}" if os.geteuid() == 0 else "unprivileged"
        return Availability(True, f"{self.bwrap} works ({mode})")

    # -- the command line -------------------------------------------------------------------

    def argv(self, spec: SandboxSpec, layout: ImageLayout, sandbox_dir: Path, *,
             info_fd: int, block_fd: int | None = None) -> list[str]:
        """bwrap's arguments (after ``bwrap``), a pure function of its inputs."""
        args = ["--unshare-all", "--unshare-user"]
        if spec.network:
            args.append("--share-net")
        if block_fd is not None:
            args += ["--userns-block-fd", str(block_fd), "--cap-drop", "ALL"]
            args += [arg for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP") for arg in ("--cap-add", cap)]
        elif os.geteuid() != 0:
            args.append("--disable-userns")
        args += ["--info-fd", str(info_fd), "--new-session", "--hostname", self.hostname]
        if self.die_with_parent:
            args.append("--die-with-parent")
        args += self._filesystem(spec, layout, sandbox_dir)
        args += ["--chdir", WORKSPACE, "--clearenv"]
        for name, value in self._env(spec, layout).items():
            args += ["--setenv", name, value]
        return args + ["--", *self._command(spec, layout)]

    def _filesystem(self, spec: SandboxSpec, layout: ImageLayout, sandbox_dir: Path) -> list[str]:
        targets = [m.target for m in layout.mounts] + [WORKSPACE, SOCKET_DIR]
        targets += [b.target for b in spec.binds] + ([f"{SOURCE_TARGET}/singularity"] if self.bind_source else [])
        args = _parent_dirs(targets)
        # an image entry under a file system the sandbox mounts afresh (a virtualenv under /tmp)
        # would be hidden by it: bound after it instead, so the interpreter is still there
        hidden = [m for m in layout.mounts if any(_under(m.target, top) for top in FRESH_MOUNTS)]
        for mount in [m for m in layout.mounts if m not in hidden]:
            args += _mount_args(mount)
        if self.bind_source:
            args += ["--ro-bind", str(_SOURCE), f"{SOURCE_TARGET}/singularity"]
        tmp = spec.limits.tmp_bytes or DEFAULT_TMP_BYTES
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp), "--tmpfs", "/dev/shm",
                 "--perms", "1777", "--size", str(tmp), "--tmpfs", "/tmp", "--dir", "/run",
                 "--bind", str(spec.workspace), WORKSPACE,
                 "--bind", str(sandbox_dir / "sock"), SOCKET_DIR]
        # their parents on the fresh tmpfs: 0755 like every other (bwrap would make them 0700)
        args += _parent_dirs([m.target for m in hidden], below=FRESH_MOUNTS)
        for mount in hidden:
            args += _mount_args(mount)
        for bind in spec.binds:
            args += ["--ro-bind" if bind.read_only else "--bind", str(bind.source), bind.target]
        return args + ["--remount-ro", "/"]

    def _env(self, spec: SandboxSpec, layout: ImageLayout) -> dict[str, str]:
        extra = {key: value for key, value in layout.env.items() if key != "PATH"}
        if self.bind_source:
            paths = [SOURCE_TARGET, *layout.site_dirs] if self._no_site(layout) else [SOURCE_TARGET]
            extra["PYTHONPATH"] = ":".join(paths)
        return sandbox_env(spec, path=layout.env.get("PATH", DEFAULT_PATH), extra=extra)

    def _no_site(self, layout: ImageLayout) -> bool:
        """Start the server with ``python -S``: only when the image says where its packages are,
        and the framework comes from the bound source (an installed one may need its .pth)."""
        return self.bind_source and bool(layout.site_dirs)

    def _command(self, spec: SandboxSpec, layout: ImageLayout) -> list[str]:
        prefix: list[str] = []
        if self.privileged:
            prefix = ["setpriv", f"--reuid={self.sandbox_uid}", f"--regid={self.sandbox_uid}",
                      "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]
        server = self.server_command(layout.python, f"{SOCKET_DIR}/{SOCKET_NAME}", WORKSPACE,
                                     no_site=self._no_site(layout))
        return prefix + limit_prefix(spec.limits) + server

    # -- starting ---------------------------------------------------------------------------

    def _check(self, spec: SandboxSpec, layout: ImageLayout) -> None:
        tools = (["setpriv"] if self.privileged else []) + (["prlimit"] if limit_prefix(spec.limits) else [])
        for tool in tools:
            if not any(layout.has(f"{d}/{tool}") for d in ("/usr/bin", "/bin")):
                raise InvalidSpec(f"image {layout.name!r} has no {tool} (util-linux), which this runtime needs")
        if self.privileged:
            _check_reachable(layout, self.sandbox_uid)
        if self.bind_source:
            layout.check_target(f"{SOURCE_TARGET}/singularity")
        for bind in spec.binds:
            if not bind.source.exists():
                raise InvalidSpec(f"bind source {bind.source} does not exist")
            layout.check_target(bind.target)

    def _own(self, *paths: Path) -> None:
        """Make the workspace and socket directory the sandbox uid's (root caller only)."""
        uid = self.sandbox_uid
        for top in paths:
            for dirpath, dirnames, filenames in os.walk(top):
                for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                    if os.lstat(name).st_uid != uid:
                        os.lchown(name, uid, uid)

    async def _spawn(self, spec: SandboxSpec, sandbox_dir: Path, log: Any, spawned: Spawned) -> Launch:
        layout = resolve_image(spec.image, network=spec.network)
        self._check(spec, layout)
        if self.privileged:
            self._own(spec.workspace, sandbox_dir / "sock")
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe() if self.privileged else (None, None)
        args = self.argv(spec, layout, sandbox_dir, info_fd=info_w, block_fd=block_r)
        split = args.index("--")  # bwrap reads options from --args, the command from argv
        args, command = args[:split], args[split:]
        args_fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)
        os.write(args_fd, b"".join(arg.encode() + b"\0" for arg in args))
        os.lseek(args_fd, 0, os.SEEK_SET)
        child_fds = [fd for fd in (args_fd, info_w, block_r) if fd is not None]
        try:
            popen = subprocess.Popen([self.bwrap, "--args", str(args_fd), *command], pass_fds=child_fds,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={"PATH": DEFAULT_PATH})
        finally:
            for fd in child_fds:
                os.close(fd)
        # from here on a failure or a cancel is the start's abort to clean up (the one teardown):
        # bwrap may already have cloned its inner child, which waits on an eventfd until bwrap
        # has written the info below, and outlives a bwrap killed before that
        try:
            spawned(popen)
            info = await _read_info(info_r, popen, self.ready_timeout_s)
            if block_w is not None:
                _map_user_namespace(info["child-pid"], self.sandbox_uid)
                os.write(block_w, b"1")
        finally:
            os.close(info_r)
            if block_w is not None:
                os.close(block_w)
        # the namespace init (its host pid): with it recorded, the sandbox's processes are still
        # found by their namespace if bwrap itself is gone
        init = ProcessRef.of(info["child-pid"]) if "child-pid" in info else None
        return Launch(popen=popen, pidns=info.get("pid-namespace"), refs=[init] if init else [])


def _check_reachable(layout: ImageLayout, uid: int) -> None:
    """Root caller: the sandbox runs as ``uid``, which must be able to execute the image's
    interpreter through the directories bound from the host (a virtualenv made with umask 077,
    say); otherwise say so now, not as ``setpriv: failed to execute`` in the sandbox's log."""
    paths = [layout.python]
    host = layout.host_path(layout.python)
    if host is not None and host.is_symlink():  # a virtualenv's python: a link to the base one
        paths.append(os.path.realpath(host))
    for inside in paths:
        mount = max((m for m in layout.mounts if m.kind == "ro-bind" and _under(inside, m.target)),
                    key=lambda m: len(m.target), default=None)
        if mount is None:
            continue
        parts = os.path.relpath(inside, mount.target).split("/")
        host_path = Path(mount.source)
        for depth in range(len(parts) + 1):
            current = host_path.joinpath(*parts[:depth]) if depth else host_path
            try:
                info = current.stat()
            except OSError:
                return  # not there at all: the start reports it
            bit = 0o100 if info.st_uid == uid else 0o001
            if not info.st_mode & bit:
                raise InvalidSpec(
                    f"the sandbox runs as uid {uid}, which cannot execute the interpreter "
                    f"{layout.python}: {current} is mode {info.st_mode & 0o7777:o} (owner uid "
                    f"{info.st_uid}); chmod o+x it, or run the worker from an interpreter the "
                    f"sandbox uid can reach")


def _mount_args(mount: Mount) -> list[str]:
    return ["--symlink" if mount.kind == "symlink" else "--ro-bind", mount.source, mount.target]


def _parent_dirs(targets: list[str], below: tuple[str, ...] = ()) -> list[str]:
    """``--perms 0755 --dir`` for every ancestor of a target (bwrap would make them 0700);
    ``below``: only those strictly below one of these mount points (they exist already)."""
    parents: set[str] = set()
    for target in targets:
        parent = os.path.dirname(target.rstrip("/"))
        while parent not in ("/", ""):
            if not any(_under(top, parent) for top in below):
                parents.add(parent)
            parent = os.path.dirname(parent)
    return [arg for parent in sorted(parents) for arg in ("--perms", "0755", "--dir", parent)]


async def _read_info(fd: int, popen: subprocess.Popen, timeout_s: float) -> dict:
    """bwrap's ``--info-fd`` JSON (child pid and namespace inodes), read without blocking."""
    os.set_blocking(fd, False)
    data, deadline = b"", time.monotonic() + timeout_s
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            chunk = None
        if chunk:
            data += chunk
            try:
                return json.loads(data)
            except ValueError:
                continue
        if chunk == b"" or popen.poll() is not None or time.monotonic() > deadline:
            raise SandboxStartError(f"bwrap gave no namespace info (exit {popen.poll()}); "
                                    "see the sandbox log")
        await asyncio.sleep(0.0005)


def _map_user_namespace(child_pid: int, uid: int) -> None:
    """Root only: map 0 (bwrap's set-up) and the sandbox uid/gid into the new user namespace."""
    mapping = f"0 0 1\n{uid} {uid} 1\n"
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{child_pid}/{name}", "w") as handle:
            handle.write(mapping)
