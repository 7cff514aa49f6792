"""When a built image can be reused: three modes, keyed by content hashes stored next to it.

==========  ==========================================================================
mode        the image is reused while ...
==========  ==========================================================================
scratch     never: every build starts from nothing
versioned   the base image (bootstrap, base, mirror) and the framework (its version and the
            packages its tool server needs inside) are unchanged
lock        the base image and the SHA-256 of the dependency lockfile are unchanged
==========  ==========================================================================

``versioned`` deliberately ignores the spec's own package lists: bump the framework version (or
use ``lock``) to rebuild after changing them. The tool server's requirements
(:data:`~.spec.SANDBOX_PIP`) count as part of the framework, since a development version
number does not move when they change (a cached image without msgspec was reused that way). The
record ``<image>.cache.json`` holds the mode, the key (SHA-256 of the canonical JSON of the
inputs), the inputs themselves (so a mismatch can be explained) and the hash of the definition
that was built.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .spec import SANDBOX_PIP, CacheMode, ImageSpec


class CacheRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: CacheMode
    key: str | None
    inputs: dict[str, Any] | None
    definition_sha256: str
    image_format: str
    built_at: float = 0.0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def base_identity(spec: ImageSpec) -> dict[str, str]:
    """What names the base image (pin docker references by digest for exact reuse)."""
    identity = {"bootstrap": spec.bootstrap, "base": spec.base}
    if spec.bootstrap == "debootstrap":
        identity["mirror"] = spec.mirror
    return identity


def cache_inputs(spec: ImageSpec, mode: CacheMode, *, framework_version: str) -> dict[str, Any] | None:
    """The inputs the key is made of (None for ``scratch``)."""
    if mode is CacheMode.SCRATCH:
        return None
    if mode is CacheMode.VERSIONED:
        return {"base": base_identity(spec), "framework_version": framework_version,
                "toolserver_requirements": list(SANDBOX_PIP)}
    if spec.lockfile is None:
        raise ValueError(f"image {spec.name!r}: cache mode 'lock' needs spec.lockfile")
    return {"base": base_identity(spec), "lockfile_sha256": sha256_file(spec.lockfile)}


def cache_key(inputs: dict[str, Any] | None) -> str | None:
    if inputs is None:
        return None
    return sha256_text(json.dumps(inputs, sort_keys=True, separators=(",", ":")))


def record_path(image: Path) -> Path:
    return image.with_name(image.name + ".cache.json")


def read_record(image: Path) -> CacheRecord | None:
    try:
        return CacheRecord.model_validate_json(record_path(image).read_text())
    except (OSError, ValueError):
        return None


def reusable(image: Path, mode: CacheMode, key: str | None) -> bool:
    """True when ``image`` exists and was built under the same mode and key."""
    if mode is CacheMode.SCRATCH or key is None or not image.exists():
        return False
    record = read_record(image)
    return record is not None and record.mode is mode and record.key == key


def write_record(image: Path, record: CacheRecord) -> None:
    path = record_path(image)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(record.model_copy(update={"built_at": time.time()}).model_dump_json(indent=2))
    tmp.replace(path)
