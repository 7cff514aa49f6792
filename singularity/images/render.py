"""Rendering an :class:`~.spec.ImageSpec` into an Apptainer definition file: a pure function.

The template is ``templates/apptainer.def.j2``; golden files in ``tests/unit/test_images_golden/``
pin its output. Rendering reads no file and runs nothing: paths on the build host (the
framework source, the lockfile) are passed in, so the same spec renders the same text anywhere.
"""
from __future__ import annotations

import shlex
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from .spec import BASE_APT, FRAMEWORK_TARGET, ImageSpec

TEMPLATES = Path(__file__).with_name("templates")
LOCKFILE_TARGET = f"{FRAMEWORK_TARGET}/requirements.lock"
_ENV = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, autoescape=False,
                   trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
_ENV.filters["shquote"] = shlex.quote


def framework_source() -> Path:
    """The ``singularity`` package of this checkout (copied into images as the framework)."""
    return Path(__file__).resolve().parents[1]


def render_definition(spec: ImageSpec, *, framework_version: str,
                      framework_src: Path | None = None, template: str = "apptainer.def.j2") -> str:
    """The definition file text for ``spec`` (deterministic: same inputs, same text)."""
    files = [(str(f.source), f.target) for f in spec.files]
    if spec.include_framework:
        source = framework_src if framework_src is not None else framework_source()
        files.append((str(source), f"{FRAMEWORK_TARGET}/singularity"))
    lockfile_target = None
    if spec.lockfile is not None:
        files.append((str(spec.lockfile), LOCKFILE_TARGET))
        lockfile_target = LOCKFILE_TARGET
    apt_packages = list(dict.fromkeys([*BASE_APT, *spec.apt_packages]))
    return _ENV.get_template(template).render(
        spec=spec, framework_version=framework_version, files=files, apt_packages=apt_packages,
        lockfile_target=lockfile_target, framework_target=FRAMEWORK_TARGET)
