"""Sandbox images: Jinja2 templates (Apptainer definition files) rendered from a spec, cached,
built into a ``.sif`` with Apptainer or a root filesystem directory for bubblewrap.

    ImageSpec (spec.py)            base, apt and pip packages, files, post commands, env
    render_definition (render.py)  spec -> definition text, a pure function; templates/*.j2
    parse_definition (deffile.py)  definition text -> header and sections (for the rootfs build)
    cache.py                       scratch / versioned / lock: keys stored next to the image
    ImageBuilder (builder.py)      cache check, then ``apptainer build`` or the rootfs builder
    rootfs.py                      debootstrap + %files + %environment + %post (bwrap/chroot)
"""
from __future__ import annotations

from .builder import BuildResult, ImageBuilder, apptainer_build_command, framework_version
from .cache import CacheRecord, cache_inputs, cache_key
from .deffile import Definition, parse_definition
from .render import render_definition
from .rootfs import RootfsBuildError
from .spec import SANDBOX_PIP, CacheMode, FileCopy, ImageSpec

__all__ = [
    "BuildResult", "CacheMode", "CacheRecord", "Definition", "FileCopy", "ImageBuilder", "ImageSpec",
    "RootfsBuildError", "SANDBOX_PIP", "apptainer_build_command", "cache_inputs", "cache_key",
    "framework_version", "parse_definition", "render_definition",
]
