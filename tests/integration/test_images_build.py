"""The image builder: cache modes and command lines with a recording runner (the builder only
shells out, so a runner double injected through its ``run`` argument sees every command), and
a real debootstrap build (slow; cached between runs) used by the bubblewrap-rootfs contract run.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from pathlib import Path

import pytest

from singularity.images import (
    CacheMode,
    ImageBuilder,
    RootfsBuildError,
    apptainer_build_command,
    cache,
    parse_definition,
)
from singularity.images.rootfs import debootstrap_command, inside_command
from tests.support.images import TEST_IMAGE, build_test_rootfs


class Recorder:
    """A ``subprocess.run`` double: records argv, fakes debootstrap, apptainer and env capture."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, argv, **kwargs) -> subprocess.CompletedProcess:
        with self.lock:
            self.calls.append(list(argv))
        if "debootstrap" in argv[0]:
            root = Path(argv[-2])
            for name in ("usr/bin", "etc", "tmp"):
                (root / name).mkdir(parents=True, exist_ok=True)
        if argv[1:2] == ["build"]:
            Path(argv[-2]).write_text("fake sif")
        stdout = b"PATH=/usr/bin:/bin\0LANG=C.UTF-8\0PYTHONPATH=/opt/prorl\0" if "env -0" in argv[-1] else b""
        return subprocess.CompletedProcess(argv, 0, stdout=stdout, stderr=b"")

    def count(self, word: str) -> int:
        return sum(1 for argv in self.calls if word in argv[0])


def _builder(tmp_path: Path, recorder: Recorder, **options) -> ImageBuilder:
    options.setdefault("image_format", "rootfs")
    return ImageBuilder(tmp_path / "images", run=recorder, bwrap="bwrap", **options)


def test_scratch_always_rebuilds(tmp_path):
    recorder = Recorder()
    builder = _builder(tmp_path, recorder)
    first = builder.build(TEST_IMAGE, CacheMode.SCRATCH)
    second = builder.build(TEST_IMAGE, CacheMode.SCRATCH)
    assert not first.cached and not second.cached and recorder.count("debootstrap") == 2
    assert first.image == tmp_path / "images" / "prorl-test.rootfs" and first.image.is_dir()
    assert (first.image / "opt" / "prorl" / "singularity" / "runtime" / "base.py").exists()
    meta = (first.image / ".prorl-image.json").read_text()
    assert '"PYTHONPATH": "/opt/prorl"' in meta and '"python": "/usr/bin/python3"' in meta
    assert not list((tmp_path / "images").glob("*.building-*"))


def test_versioned_reuses_until_base_or_framework_version_changes(tmp_path):
    recorder = Recorder()
    builder = _builder(tmp_path, recorder, version="1.0")
    assert not builder.build(TEST_IMAGE).cached
    assert builder.build(TEST_IMAGE).cached
    assert builder.build(TEST_IMAGE.model_copy(update={"apt_packages": ("git",)})).cached  # by design
    assert not builder.build(TEST_IMAGE.model_copy(update={"base": "trixie"})).cached
    trixie = TEST_IMAGE.model_copy(update={"base": "trixie"})
    assert not _builder(tmp_path, recorder, version="1.1").build(trixie).cached
    assert recorder.count("debootstrap") == 3


def test_versioned_rebuilds_when_the_tool_server_needs_other_packages(tmp_path, monkeypatch):
    recorder = Recorder()
    builder = _builder(tmp_path, recorder, version="1.0")
    first = builder.build(TEST_IMAGE, CacheMode.VERSIONED)
    assert builder.build(TEST_IMAGE, CacheMode.VERSIONED).cached
    monkeypatch.setattr(cache, "SANDBOX_PIP", (*cache.SANDBOX_PIP, "newdep>=1"))
    second = builder.build(TEST_IMAGE, CacheMode.VERSIONED)
    assert not second.cached and second.key != first.key and recorder.count("debootstrap") == 2


def test_lock_mode_follows_the_lockfile_hash(tmp_path):
    recorder = Recorder()
    lockfile = tmp_path / "requirements.lock"
    lockfile.write_text("pydantic==2.9.2\n")
    spec = TEST_IMAGE.model_copy(update={"lockfile": lockfile})
    builder = _builder(tmp_path, recorder, version="1.0")
    first = builder.build(spec, CacheMode.LOCK)
    assert not first.cached and _builder(tmp_path, recorder, version="9.9").build(spec, CacheMode.LOCK).cached
    lockfile.write_text("pydantic==2.10.0\n")
    second = builder.build(spec, CacheMode.LOCK)
    assert not second.cached and second.key != first.key and recorder.count("debootstrap") == 2
    assert (second.image / "opt" / "prorl" / "requirements.lock").read_text() == "pydantic==2.10.0\n"
    assert not builder.build(spec, CacheMode.VERSIONED).cached  # another mode, another key
    with pytest.raises(ValueError, match="lockfile"):
        builder.build(TEST_IMAGE, CacheMode.LOCK)


def test_concurrent_builds_of_one_image_build_once(tmp_path):
    recorder = Recorder()
    results = []
    threads = [threading.Thread(target=lambda: results.append(_builder(tmp_path, recorder).build(TEST_IMAGE)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.cached for r in results) == [False, True, True, True]
    assert recorder.count("debootstrap") == 1


def test_sif_build_command_line(tmp_path):
    recorder = Recorder()
    builder = _builder(tmp_path, recorder, image_format="sif", apptainer="/usr/bin/apptainer", fakeroot=True)
    result = builder.build(TEST_IMAGE, CacheMode.VERSIONED)
    out = tmp_path / "images"
    assert recorder.calls == [["/usr/bin/apptainer", "build", "--fakeroot", "--force",
                               str(out / "prorl-test.sif"), str(out / "prorl-test.def")]]
    assert result.image == out / "prorl-test.sif" and (out / "prorl-test.sif.cache.json").exists()
    assert builder.build(TEST_IMAGE).cached and len(recorder.calls) == 1
    assert apptainer_build_command("singularity", Path("a.def"), Path("a.sif"), fakeroot=False) == [
        "singularity", "build", "--force", "a.sif", "a.def"]


def test_rootfs_commands_come_from_the_definition(tmp_path):
    recorder = Recorder()
    builder = _builder(tmp_path, recorder, ca_bundle=Path("/etc/site-ca.pem"))
    builder.build(TEST_IMAGE, CacheMode.SCRATCH)
    root = str(tmp_path / "images" / f"prorl-test.rootfs.building-{os.getpid()}")
    debootstrap, post, test, env, site_dirs = recorder.calls
    assert debootstrap == ["debootstrap", "--variant=minbase", "bookworm", root, "http://deb.debian.org/debian"]
    assert post[:3] == ["bwrap", "--bind", root] and post[-3:] == ["/bin/sh", "-e", "/.prorl-post.sh"]
    assert "--unshare-net" not in post and ["/etc/site-ca.pem", "/etc/prorl-build-ca.pem"] == post[
        post.index("/etc/site-ca.pem"):post.index("/etc/site-ca.pem") + 2]
    assert test[-1].endswith(". /.prorl-test.sh") and "env -0" in env[-1]
    assert site_dirs[-3:-1] == ["/usr/bin/python3", "-c"] and "getsitepackages" in site_dirs[-1]
    definition = parse_definition(builder.definition(TEST_IMAGE))
    assert inside_command(Path("/r"), ["true"], bwrap=None, ca_bundle=None)[:2] == ["chroot", "/r"]
    with pytest.raises(RootfsBuildError, match="debootstrap"):
        debootstrap_command(parse_definition("Bootstrap: docker\nFrom: python:3.11\n"), Path("/r"))
    assert debootstrap_command(definition, Path("/r"))[-3:] == ["bookworm", "/r", "http://deb.debian.org/debian"]


def test_failed_step_leaves_no_half_image(tmp_path):
    class Failing(Recorder):
        def __call__(self, argv, **kwargs):
            done = super().__call__(argv, **kwargs)
            return done if "debootstrap" in argv[0] else subprocess.CompletedProcess(argv, 3, b"", b"boom")

    builder = _builder(tmp_path, Failing())
    with pytest.raises(RootfsBuildError, match="%post failed"):
        builder.build(TEST_IMAGE, CacheMode.SCRATCH)
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == [
        "prorl-test.build.log", "prorl-test.def", "prorl-test.lock"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_real_debootstrap_image_runs_the_tool_server(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root; rootless sites build .sif images with apptainer --fakeroot")
    image = build_test_rootfs()
    assert (image / "usr" / "bin" / "python3").exists() and (image / "usr" / "bin" / "prlimit").exists()
    from singularity.runtime import BubblewrapRuntime, Limits, SandboxSpec

    async def body():
        runtime = BubblewrapRuntime(bind_source=False)  # the framework copy inside the image
        spec = SandboxSpec(image=str(image), workspace=tmp_path / "ws", limits=Limits(max_processes=128))
        async with await runtime.start(spec) as sandbox:
            async with sandbox.client() as client:
                probe = "import sys, singularity; print(sys.version_info[:2], singularity.__file__)"
                result = await client.bash(f"python3 -c '{probe}'; cat /etc/debian_version")
                ipython = await client.ipython("import msgspec; msgspec.__version__")
        return result.output, ipython.result

    output, version = asyncio.run(body())
    assert "/opt/prorl/singularity/__init__.py" in output and version.strip("'").startswith("0.")
