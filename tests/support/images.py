"""The small default image the tests build (a real debootstrap rootfs, cached between runs)."""
from __future__ import annotations

import os
from pathlib import Path

from singularity.images import CacheMode, ImageBuilder, ImageSpec

IMAGE_CACHE = Path(os.environ.get("PRORL_IMAGE_CACHE", Path.home() / ".cache" / "prorl" / "images"))
TEST_IMAGE = ImageSpec(name="prorl-test")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def build_test_rootfs() -> Path:
    """The small default image for tests: built once, reused while the framework version holds."""
    builder = ImageBuilder(IMAGE_CACHE, image_format="rootfs", ca_bundle=HOST_CA if HOST_CA.exists() else None)
    return builder.build(TEST_IMAGE, CacheMode.VERSIONED).image
