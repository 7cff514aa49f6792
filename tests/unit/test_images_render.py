"""Golden-file tests of the image definition templates, and of reading a definition back.

Regenerate the golden files after an intended template change with
``PRORL_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_images_render.py`` and review the diff.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from singularity.images import FileCopy, ImageSpec, parse_definition, render_definition

GOLDEN = Path(__file__).with_name("test_images_golden")
SPECS = {
    "default": ImageSpec(name="toolserver"),
    "full": ImageSpec(
        name="swe-python", base="trixie", mirror="http://mirror.example/debian",
        apt_packages=("git", "build-essential", "python3-venv"),
        pip_packages=("pydantic>=2.7", "ptyprocess>=0.7", "ipykernel>=6.29", "pytest==8.3.2"),
        lockfile=Path("/src/requirements.lock"),
        files=(FileCopy(source=Path("/src/repo"), target="/opt/repo"),),
        post=("git config --system safe.directory '*'", "python3 -m compileall -q /opt/repo"),
        env={"PIP_NO_CACHE_DIR": "1", "GREETING": "hello world; $HOME"},
        labels={"org.example.task": "swe"}),
    "docker-no-framework": ImageSpec(name="plain", bootstrap="docker", base="python:3.11-slim",
                                     pip_packages=(), include_framework=False),
}


def render(spec: ImageSpec) -> str:
    return render_definition(spec, framework_version="1.2.3", framework_src=Path("/src/singularity"))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_golden(name):
    text, golden = render(SPECS[name]), GOLDEN / f"{name}.def"
    if os.environ.get("PRORL_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs: rerun with PRORL_UPDATE_GOLDEN=1 if intended"


def test_rendering_is_pure_and_deterministic():
    spec = SPECS["full"]
    assert render(spec) == render(spec.model_copy(deep=True))
    assert render(spec) != render(spec.model_copy(update={"apt_packages": ("git",)}))


def test_definition_reads_back():
    definition = parse_definition(render(SPECS["full"]))
    assert definition.header == {"bootstrap": "debootstrap", "osversion": "trixie",
                                 "mirrorurl": "http://mirror.example/debian"}
    assert definition.files() == [("/src/repo", "/opt/repo"), ("/src/singularity", "/opt/prorl/singularity"),
                                  ("/src/requirements.lock", "/opt/prorl/requirements.lock")]
    assert "export GREETING='hello world; $HOME'" in definition.sections["environment"]
    post = definition.sections["post"]
    assert post.startswith("set -eu\n") and "-r /opt/prorl/requirements.lock" in post
    assert post.index("pip install") < post.index("git config --system")
    assert parse_definition(render(SPECS["docker-no-framework"])).header == {
        "bootstrap": "docker", "from": "python:3.11-slim"}


@pytest.mark.parametrize("fields", [
    {"apt_packages": ("git; rm -rf /",)}, {"pip_packages": ("--index-url=http://evil",)},
    {"env": {"BAD-NAME": "x"}}, {"post": ("  ",)}, {"name": "../escape"}, {"bootstrap": "yum"},
    {"files": ({"source": "/a", "target": "relative"},)}, {"unknown": 1},
])
def test_spec_rejects_bad_input(fields):
    with pytest.raises(ValidationError):
        ImageSpec(**{"name": "x", **fields})
