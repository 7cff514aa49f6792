"""Building a root filesystem directory for bubblewrap from a definition file (no Apptainer).

Steps, in Apptainer's order, all from the parsed definition:

1. ``Bootstrap: debootstrap`` -> ``debootstrap --variant=minbase SUITE ROOT MIRROR``
   (the only bootstrap this builder supports; ``docker``/``localimage`` need Apptainer);
2. ``%files`` copied into the root (directories without ``__pycache__``);
3. ``%environment`` written to ``/.singularity.d/env/90-environment.sh`` (where Apptainer puts
   it), and its effect captured into ``/.prorl-image.json`` for the runtime;
4. ``%post`` run inside the new root with ``bwrap --bind ROOT /`` (own pid/ipc/uts namespaces,
   network shared for apt and pip) or ``chroot`` when bwrap is missing;
5. ``%test`` run the same way, in the image's environment, if present.

Needs root (debootstrap creates device nodes and chowns files); rootless sites build ``.sif``
images with ``apptainer build --fakeroot`` instead. ``ca_bundle`` (e.g. a site's TLS-inspecting
proxy CA) is bound read-only at ``/etc/prorl-build-ca.pem`` during ``%post`` only and named in
``PIP_CERT``/``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``; it does not stay in the image.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .deffile import Definition

Runner = Callable[..., subprocess.CompletedProcess]
ENV_SCRIPT = ".singularity.d/env/90-environment.sh"
METADATA = ".prorl-image.json"  # read by singularity.runtime.layout
BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILD_CA = "/etc/prorl-build-ca.pem"


class RootfsBuildError(RuntimeError):
    pass


def debootstrap_command(definition: Definition, root: Path, *, debootstrap: str = "debootstrap") -> list[str]:
    header = definition.header
    if header.get("bootstrap") != "debootstrap":
        raise RootfsBuildError(f"the rootfs builder supports 'Bootstrap: debootstrap' only, not "
                               f"{header.get('bootstrap')!r}: build a .sif with Apptainer instead")
    suite = header.get("osversion") or "stable"
    mirror = header.get("mirrorurl") or "http://deb.debian.org/debian"
    return [debootstrap, "--variant=minbase", suite, str(root), mirror]


def inside_command(root: Path, argv: list[str], *, bwrap: str | None, ca_bundle: Path | None) -> list[str]:
    """Run ``argv`` inside ``root`` as root, with the build host's network."""
    env = {"PATH": BUILD_PATH, "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    if ca_bundle is not None:
        env.update(PIP_CERT=BUILD_CA, SSL_CERT_FILE=BUILD_CA, REQUESTS_CA_BUNDLE=BUILD_CA)
    if bwrap is None:
        return ["chroot", str(root), "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    args = [bwrap, "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
            "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    if ca_bundle is not None:
        args += ["--ro-bind", str(ca_bundle), BUILD_CA]
    args.append("--clearenv")
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args + ["--", *argv]


def copy_files(definition: Definition, root: Path) -> None:
    for source, target in definition.files():
        destination = root / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, destination)


PYTHON = "/usr/bin/python3"


def build_rootfs(definition: Definition, root: Path, *, run: Runner = subprocess.run,
                 bwrap: str | None = None, ca_bundle: Path | None = None,
                 log: Any = None) -> dict[str, Any]:
    """Build into ``root`` (which must not exist yet); return the image metadata written."""
    out = dict(stdout=log, stderr=subprocess.STDOUT) if log is not None else {}
    _check(run(debootstrap_command(definition, root), **out), "debootstrap")
    copy_files(definition, root)
    env_script = root / ENV_SCRIPT
    env_script.parent.mkdir(parents=True, exist_ok=True)
    env_script.write_text(definition.sections.get("environment", ""))
    (root / "etc").mkdir(exist_ok=True)
    if not (root / "etc" / "resolv.conf").exists():
        (root / "etc" / "resolv.conf").touch()  # a bind target for %post's name resolution
    for section in ("post", "test"):
        if definition.sections.get(section, "").strip():
            script = root / f".prorl-{section}.sh"
            script.write_text(definition.sections[section])
            command = ["/bin/sh", "-e", f"/.prorl-{section}.sh"]
            if section == "test":  # Apptainer runs %test in the container's environment
                command = ["/bin/sh", "-e", "-c", f". /{ENV_SCRIPT} && . /.prorl-test.sh"]
            argv = inside_command(root, command, bwrap=bwrap, ca_bundle=ca_bundle)
            _check(run(argv, **out), f"%{section}")
            script.unlink()
    metadata = {"python": PYTHON, "env": _effective_env(root, run, bwrap),
                "site_dirs": _site_dirs(root, run, bwrap)}
    (root / METADATA).write_text(json.dumps(metadata, indent=2, sort_keys=True))
    return metadata


def _site_dirs(root: Path, run: Runner, bwrap: str | None) -> list[str]:
    """The image interpreter's site-packages directories (the runtime starts the tool server with
    ``python -S`` and these on PYTHONPATH); empty when they cannot be read."""
    script = "import json, os, site; print(json.dumps([d for d in site.getsitepackages() if os.path.isdir(d)]))"
    done = run(inside_command(root, [PYTHON, "-c", script], bwrap=bwrap, ca_bundle=None), capture_output=True)
    if done.returncode != 0:
        return []
    try:
        dirs = json.loads(done.stdout or b"[]")
    except ValueError:
        return []
    return [d for d in dirs if isinstance(d, str)]


def _effective_env(root: Path, run: Runner, bwrap: str | None) -> dict[str, str]:
    """The environment %environment produces, as the runtime should set it."""
    argv = inside_command(root, ["/bin/sh", "-c", f". /{ENV_SCRIPT} && exec env -0"], bwrap=bwrap, ca_bundle=None)
    done = run(argv, capture_output=True)
    _check(done, "%environment")
    pairs = (item.split(b"=", 1) for item in (done.stdout or b"").split(b"\0") if b"=" in item)
    env = {key.decode(): value.decode() for key, value in pairs}
    for noise in ("PWD", "SHLVL", "_", "HOME", "DEBIAN_FRONTEND"):
        env.pop(noise, None)
    return env


def _check(done: subprocess.CompletedProcess, step: str) -> None:
    if done.returncode != 0:
        detail = (done.stderr or b"")[-2000:] if isinstance(done.stderr, bytes) else (done.stderr or "")
        raise RootfsBuildError(f"{step} failed with exit code {done.returncode} {detail!r}")
