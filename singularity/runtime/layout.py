"""What a bubblewrap sandbox's read-only root is made of: an image layout.

The sandbox's ``/`` is a fresh tmpfs (remounted read-only once everything is in place), and the
image's top-level entries are bound onto it one by one: directories and files read-only,
symlinks recreated. So any bind target outside the image's own directories (``/workspace``,
``/run/toolserver``, ``/data``) is simply created on the tmpfs; a target *inside* a read-only
image directory must already exist there (bubblewrap cannot create it): :meth:`check_target`
says so before starting.

Two kinds of image:

* ``"dev"`` (:func:`dev_layout`): assembled from the host, no build needed. ``/usr`` and the
  ``/bin``, ``/sbin``, ``/lib*`` entries as the host has them (symlinks or directories), a short
  list of ``/etc`` files (users, name service, dynamic linker cache, TLS roots, alternatives:
  never ``shadow``, ``sudoers`` or ssh keys), ``resolv.conf`` only when networking is on, and
  the running Python installation (``sys.base_prefix`` and a virtualenv's ``sys.prefix``) at its
  own path, so the tool server runs with this interpreter and its installed dependencies.
* a directory (:func:`rootfs_layout`): a root filesystem made by the image builder
  (``singularity.images``), e.g. ``debootstrap`` plus the definition's ``%post``. Its Python
  and environment come from ``.prorl-image.json`` at its top, written by the builder.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

from .errors import InvalidSpec

DEV_IMAGE = "dev"
IMAGE_METADATA = ".prorl-image.json"
HOST_TOP = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
DEV_ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "ld.so.cache", "ld.so.conf",
           "ld.so.conf.d", "localtime", "timezone", "alternatives", "ssl", "ca-certificates",
           "mime.types", "protocols", "services", "gai.conf", "inputrc", "bash.bashrc",
           "terminfo", "os-release", "debian_version")
# never bound from a root filesystem image: the runtime mounts its own, or they are host-only
ROOTFS_SKIP = {"proc", "dev", "sys", "tmp", "run", "workspace", "lost+found", IMAGE_METADATA}


@dataclass(frozen=True)
class Mount:
    kind: Literal["ro-bind", "symlink"]
    source: str  # host path (ro-bind) or link target (symlink)
    target: str  # path inside


@dataclass(frozen=True)
class ImageLayout:
    name: str
    mounts: tuple[Mount, ...]
    python: str = "python3"  # the interpreter that runs the tool server, inside
    env: dict[str, str] = field(default_factory=dict)  # PATH and friends from the image
    #: that interpreter's site-packages directories, when known: the tool server then starts
    #: with ``python -S`` and these on PYTHONPATH, skipping ``site`` and every ``.pth`` file,
    #: which was a fifth of a sandbox's start-to-ready time (bench/sandbox.py)
    site_dirs: tuple[str, ...] = ()

    def host_path(self, inside: str) -> Path | None:
        """Where ``inside`` lives on the host, when it is under a bound directory or file."""
        best = None
        for mount in self.mounts:
            if mount.kind == "ro-bind" and _under(inside, mount.target):
                if best is None or len(mount.target) > len(best.target):
                    best = mount
        if best is None:
            return None
        return Path(best.source) / os.path.relpath(inside, best.target)

    def has(self, inside: str) -> bool:
        host = self.host_path(inside)
        return host is not None and (host.exists() or host.is_symlink())

    def check_target(self, target: str) -> None:
        """Raise :class:`InvalidSpec` when bubblewrap could not create ``target``."""
        for mount in self.mounts:
            if mount.kind == "symlink" and _under(target, mount.target):
                raise InvalidSpec(f"bind target {target} is under the image symlink {mount.target}")
        host = self.host_path(target)
        if host is not None and not (host.exists() or host.is_symlink()):
            raise InvalidSpec(f"bind target {target} does not exist in image {self.name!r} and "
                              f"its parent is read-only: create it in the image or bind elsewhere")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _host_entry(path: str) -> Mount | None:
    if os.path.islink(path):
        return Mount("symlink", os.readlink(path), path)
    if os.path.exists(path):
        return Mount("ro-bind", path, path)
    return None


def python_prefixes() -> list[str]:
    """The running interpreter's installation(s), outside ``/usr`` (bound at their own paths)."""
    prefixes = []
    for prefix in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix):
        real = os.path.realpath(prefix)
        if not _under(real, "/usr") and real not in prefixes:
            prefixes.append(real)
    return prefixes


def dev_layout(network: bool = False) -> ImageLayout:
    """The host-assembled development image (see the module docstring)."""
    mounts = [Mount("ro-bind", "/usr", "/usr")]
    mounts += [m for name in HOST_TOP if (m := _host_entry(f"/{name}")) is not None]
    etc = DEV_ETC + (("resolv.conf",) if network else ())
    mounts += [m for name in etc if (m := _host_entry(f"/etc/{name}")) is not None]
    mounts += [Mount("ro-bind", prefix, prefix) for prefix in python_prefixes()]
    python = sys.executable or "python3"
    path = ":".join(dict.fromkeys([os.path.dirname(python), "/usr/local/bin", "/usr/bin", "/bin",
                                   "/usr/local/sbin", "/usr/sbin", "/sbin"]))
    return ImageLayout(DEV_IMAGE, tuple(mounts), python=python, env={"PATH": path},
                       site_dirs=host_site_dirs())


@lru_cache(maxsize=1)
def host_site_dirs() -> tuple[str, ...]:
    """The running interpreter's site-packages directories that exist (a virtualenv's included;
    read once: every sandbox start asks)."""
    import site

    dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return tuple(d for d in dict.fromkeys(dirs) if os.path.isdir(d))


def rootfs_layout(root: Path) -> ImageLayout:
    """A root filesystem directory made by the image builder."""
    if not root.is_dir():
        raise InvalidSpec(f"image {root} is not a directory (bubblewrap needs a root filesystem "
                          f"directory, or {DEV_IMAGE!r})")
    mounts = []
    for entry in sorted(os.listdir(root)):
        if entry in ROOTFS_SKIP:
            continue
        path = root / entry
        if path.is_symlink():
            mounts.append(Mount("symlink", os.readlink(path), f"/{entry}"))
        else:
            mounts.append(Mount("ro-bind", str(path), f"/{entry}"))
    meta = _metadata(root)
    return ImageLayout(str(root), tuple(mounts), python=meta.get("python", "python3"),
                       env=dict(meta.get("env", {})), site_dirs=tuple(meta.get("site_dirs", ())))


def _metadata(root: Path) -> dict:
    try:
        return json.loads((root / IMAGE_METADATA).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise InvalidSpec(f"{root / IMAGE_METADATA} is not valid JSON: {exc}") from exc


def resolve_image(image: str, network: bool = False) -> ImageLayout:
    """``"dev"`` or a root filesystem directory."""
    return dev_layout(network) if image == DEV_IMAGE else rootfs_layout(Path(image))
