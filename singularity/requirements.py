"""What a sandbox must provide, declared once and checked before a task is served.

``sandbox-requirements.txt`` beside this module is the one list of Python distributions a
sandbox's interpreter needs. setup.cfg installs it with the base install (the ``dev`` image's
sandboxes run the workers' own interpreter) and as the ``sandbox`` extra; the image builder
installs it in every image (:data:`singularity.images.spec.SANDBOX_PIP`).

Tools and task handlers name what they need with :class:`Requirement` values (``PYTEST``,
``GIT``, ...). A worker checks them at start (:func:`missing`) and refuses, by name, every task
whose requirement is absent: a task that cannot run is an environment failure, never a score.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

REQUIREMENTS_FILE = "sandbox-requirements.txt"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


ALL_STAGES = ("init", "run", "eval")


@dataclass(frozen=True)
class Requirement:
    """One thing a sandbox must provide: a Python distribution (importable as ``module``) from
    :func:`sandbox_pip`, or a program on ``PATH``; ``stages``: the job stages that use it (a
    test runner is EVAL's alone, so a worker without one refuses only EVAL, as ``eval_error``)."""

    name: str
    kind: Literal["python", "program"]
    module: str = ""
    why: str = ""
    stages: tuple[str, ...] = ALL_STAGES

    def __str__(self) -> str:
        return self.name if self.kind == "python" else f"the program {self.name}"


def python(name: str, module: str | None = None, why: str = "",
           stages: tuple[str, ...] = ALL_STAGES) -> Requirement:
    return Requirement(name, "python", module or name.replace("-", "_"), why, stages)


def program(name: str, why: str = "", stages: tuple[str, ...] = ALL_STAGES) -> Requirement:
    return Requirement(name, "program", why=why, stages=stages)


_AGENT = ("init", "run")  # the agent's tools: INIT starts them, RUN uses them
_EVAL = ("eval",)
MSGSPEC = python("msgspec", why="the tool server's protocol")
UVLOOP = python("uvloop", why="the tool server's event loop")
PTYPROCESS = python("ptyprocess", why="the bash tool's shell", stages=_AGENT)
IPYKERNEL = python("ipykernel", why="the python tool's IPython kernel", stages=_AGENT)
BM25S = python("bm25s", why="the search tool's index", stages=_AGENT)
PYTEST = python("pytest", why="the swe evaluator's test runner", stages=_EVAL)
GIT = program("git", why="checking out and diffing swe repositories")
BASH = program("bash", why="the bash tool and the evaluators' commands")
TIMEOUT = program("timeout", why="the swe evaluator's time limit on the tests (coreutils)", stages=_EVAL)
PYTHON3 = program("python3", why="the code judge and agent programs inside the sandbox")
#: the workers' own (EVAL), from the base install's requirements/service.txt
MATH_VERIFY = python("math-verify", module="math_verify", why="the math grader", stages=_EVAL)

#: what every sandbox's tool server needs, whatever its tools
TOOL_SERVER: tuple[Requirement, ...] = (MSGSPEC, UVLOOP)


@cache
def sandbox_pip() -> tuple[str, ...]:
    """The pip requirements of ``sandbox-requirements.txt``, in its order."""
    text = resources.files("singularity").joinpath(REQUIREMENTS_FILE).read_text()
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def distribution(spec: str) -> str:
    """The distribution name of a pip requirement (``pytest>=8`` -> ``pytest``)."""
    found = _NAME.match(spec.strip())
    if found is None:
        raise ValueError(f"not a pip requirement: {spec!r}")
    return found.group(0).lower().replace("_", "-")


def missing(requirements: Iterable[Requirement], stage: str | None = None) -> list[Requirement]:
    """Those of ``requirements`` (used by ``stage``, when given) that this process's interpreter
    (the ``dev`` image's) or ``PATH`` lacks, each once, in order."""
    absent = []
    for requirement in dict.fromkeys(requirements):
        if stage is not None and stage not in requirement.stages:
            continue
        if requirement.kind == "program":
            present = shutil.which(requirement.name) is not None
        else:
            try:
                present = importlib.util.find_spec(requirement.module) is not None
            except (ImportError, ValueError):  # a broken or blocked package cannot be imported either
                present = False
        if not present:
            absent.append(requirement)
    return absent


def explain(task: str, absent: Iterable[Requirement]) -> str:
    """One line naming what ``task`` lacks, why each is needed, and the fix."""
    absent = list(absent)
    names = ", ".join(f"{r} ({r.why})" if r.why else str(r) for r in absent)
    fix = ("pip install the project's base install (it carries singularity/sandbox-requirements.txt)"
           if any(r.kind == "python" for r in absent) else "install it on the node")
    return f"task {task!r} cannot run on this worker: missing {names}; {fix}"
