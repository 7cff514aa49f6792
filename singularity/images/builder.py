"""The image builder: render the definition, decide from the cache, then shell out.

Output, per image name, in ``output_dir``:

* ``<name>.sif`` through ``apptainer build`` where Apptainer (or Singularity) exists;
* otherwise ``<name>.rootfs/``, a root filesystem directory for bubblewrap built from the same
  definition (:mod:`.rootfs`);

plus ``<name>.def`` (the rendered definition), ``<name>.<ext>.cache.json`` (the cache record)
and ``<name>.build.log``. Concurrent builds of one image (several workers starting at once)
serialise on ``<name>.lock``; the second finds the first's result in the cache. A rootfs is
built next to its final place and renamed in, so a reader never sees half an image.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from . import cache
from .deffile import parse_definition
from .render import render_definition
from .rootfs import RootfsBuildError, Runner, build_rootfs
from .spec import CacheMode, ImageSpec

ImageFormat = Literal["sif", "rootfs"]


def framework_version() -> str:
    try:
        return metadata.version("prorl-celery")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class BuildResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: Path
    image_format: ImageFormat
    cached: bool
    key: str | None
    definition: Path
    seconds: float


def apptainer_build_command(apptainer: str, definition: Path, image: Path, *, fakeroot: bool) -> list[str]:
    """``apptainer build [--fakeroot] --force IMAGE.sif DEFINITION``."""
    return [apptainer, "build", *(["--fakeroot"] if fakeroot else []), "--force", str(image), str(definition)]


class ImageBuilder:
    """Builds images into ``output_dir`` (see the module docstring)."""

    def __init__(self, output_dir: Path, *, image_format: ImageFormat | None = None,
                 apptainer: str | None = None, fakeroot: bool = False, version: str | None = None,
                 framework_src: Path | None = None, ca_bundle: Path | None = None,
                 bwrap: str | None = None, run: Runner = subprocess.run) -> None:
        self.output_dir = Path(output_dir)
        self.apptainer = apptainer or shutil.which("apptainer") or shutil.which("singularity")
        self.image_format: ImageFormat = image_format or ("sif" if self.apptainer else "rootfs")
        if self.image_format == "sif" and not self.apptainer:
            raise ValueError("a .sif needs apptainer or singularity on PATH")
        self.fakeroot, self.ca_bundle, self.run = fakeroot, ca_bundle, run
        self.version = version or framework_version()
        self.framework_src = framework_src
        self.bwrap = bwrap if bwrap is not None else shutil.which("bwrap")

    def image_path(self, spec: ImageSpec) -> Path:
        suffix = ".sif" if self.image_format == "sif" else ".rootfs"
        return self.output_dir / f"{spec.name}{suffix}"

    def definition(self, spec: ImageSpec) -> str:
        return render_definition(spec, framework_version=self.version, framework_src=self.framework_src)

    def build(self, spec: ImageSpec, mode: CacheMode = CacheMode.VERSIONED) -> BuildResult:
        """Reuse the cached image when ``mode`` allows, else build it."""
        started = time.monotonic()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        image, text = self.image_path(spec), self.definition(spec)
        inputs = cache.cache_inputs(spec, mode, framework_version=self.version)
        key = cache.cache_key(inputs)
        def_path = self.output_dir / f"{spec.name}.def"
        with _locked(self.output_dir / f"{spec.name}.lock"):
            cached = cache.reusable(image, mode, key)
            if not cached:
                def_path.write_text(text)
                self._build(def_path, image)
                cache.write_record(image, cache.CacheRecord(
                    mode=mode, key=key, inputs=inputs, definition_sha256=cache.sha256_text(text),
                    image_format=self.image_format))
        return BuildResult(image=image, image_format=self.image_format, cached=cached, key=key,
                           definition=def_path, seconds=time.monotonic() - started)

    def _build(self, def_path: Path, image: Path) -> None:
        log_path = def_path.with_suffix(".build.log")
        with open(log_path, "wb") as log:
            if self.image_format == "sif":
                assert self.apptainer is not None  # __init__ refuses a .sif without it
                argv = apptainer_build_command(self.apptainer, def_path, image, fakeroot=self.fakeroot)
                done = self.run(argv, stdout=log, stderr=subprocess.STDOUT)
                if done.returncode != 0:
                    raise RuntimeError(f"apptainer build failed ({done.returncode}); see {log_path}")
                return
            staging = image.with_name(f"{image.name}.building-{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            try:
                build_rootfs(parse_definition(def_path.read_text()), staging, run=self.run,
                             bwrap=self.bwrap, ca_bundle=self.ca_bundle, log=log)
                _replace_dir(staging, image)
            except RootfsBuildError as exc:
                raise RootfsBuildError(f"{exc}; see {log_path}") from exc
            finally:
                shutil.rmtree(staging, ignore_errors=True)


class _locked:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        os.close(self.fd)


def _replace_dir(new: Path, final: Path) -> None:
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)
