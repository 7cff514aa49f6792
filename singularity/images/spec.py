"""What an image is made of: :class:`ImageSpec`, rendered into an Apptainer definition file."""
from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..requirements import sandbox_pip

#: what every image's Python gets: the tool server, its tools and the evaluators' runners (the
#: one list, ``singularity/sandbox-requirements.txt``; besides Python 3.11+ and bash)
SANDBOX_PIP: tuple[str, ...] = sandbox_pip()
#: Debian packages every image gets: the tool server's runtime, util-linux for ``prlimit``/``setpriv``
#: (the bubblewrap runtime applies limits and drops privileges with them), and the programs
#: tasks require (``singularity.requirements``: git for swe; coreutils' ``timeout`` is essential)
BASE_APT = ("python3", "python3-pip", "bash", "ca-certificates", "util-linux", "git")
FRAMEWORK_TARGET = "/opt/prorl"

_APT_NAME = re.compile(r"^[a-z0-9][a-z0-9.+\-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:\-]+)?$")
_PIP_REQ = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~ ;'\"@:/+]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CacheMode(str, Enum):
    """When a built image may be reused (see :mod:`singularity.images.cache`)."""

    SCRATCH = "scratch"  # always rebuild
    VERSIONED = "versioned"  # reuse while the base image and framework version are unchanged
    LOCK = "lock"  # reuse while the dependency lockfile's hash is unchanged


class FileCopy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: Path  # on the build host
    target: str  # inside the image

    @field_validator("target")
    @classmethod
    def _absolute(cls, target: str) -> str:
        if not target.startswith("/") or any(c.isspace() for c in target):
            raise ValueError(f"file target {target!r} must be an absolute path without spaces")
        return target


class ImageSpec(BaseModel):
    """One image: a base, packages, files, post-install commands and environment."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    bootstrap: Literal["debootstrap", "docker", "localimage"] = "debootstrap"
    base: str = "bookworm"  # debootstrap: the suite; docker: the image reference; localimage: a path
    mirror: str = "http://deb.debian.org/debian"  # debootstrap only
    apt_packages: tuple[str, ...] = ()
    pip_packages: tuple[str, ...] = SANDBOX_PIP
    lockfile: Path | None = None  # a pip requirements lock, installed with ``-r`` (and keys ``lock`` mode)
    files: tuple[FileCopy, ...] = ()
    post: tuple[str, ...] = ()  # shell commands run last in %post
    env: dict[str, str] = {}
    labels: dict[str, str] = {}
    include_framework: bool = True  # copy the ``singularity`` package to /opt/prorl

    @field_validator("apt_packages")
    @classmethod
    def _apt(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _APT_NAME.match(name):
                raise ValueError(f"invalid Debian package name {name!r}")
        return names

    @field_validator("pip_packages")
    @classmethod
    def _pip(cls, requirements: tuple[str, ...]) -> tuple[str, ...]:
        for requirement in requirements:
            if not _PIP_REQ.match(requirement) or requirement.startswith("-"):
                raise ValueError(f"invalid pip requirement {requirement!r}")
        return requirements

    @field_validator("env")
    @classmethod
    def _env(cls, values: dict[str, str]) -> dict[str, str]:
        for name, value in values.items():
            if not _ENV_NAME.match(name) or "\n" in value:
                raise ValueError(f"invalid environment variable {name!r}")
        return values

    @field_validator("labels")
    @classmethod
    def _labels(cls, values: dict[str, str]) -> dict[str, str]:
        for name, value in values.items():
            if not name or any(c.isspace() for c in name) or "\n" in value:
                raise ValueError(f"invalid label {name!r}")
        return values

    @field_validator("post")
    @classmethod
    def _commands(cls, commands: tuple[str, ...]) -> tuple[str, ...]:
        if any(not command.strip() for command in commands):
            raise ValueError("empty post-install command")
        return commands
