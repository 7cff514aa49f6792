"""Turn a SWE instance, in any accepted shape, into one ``SweInstance``.

Accepted shapes:

SWE-bench row (SWE-bench, SWE-bench Lite/Verified, SWE-Gym, the shipped ``instances.jsonl``)
    ``instance_id``, ``repo`` (``owner/name``), ``base_commit``, ``problem_statement``,
    ``test_patch``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (pytest node ids, as a list or as the
    JSON string SWE-bench stores), optional ``patch`` (the gold solution, never shown to the
    agent), ``version``, ``created_at``, ``hints_text``. A default system + user prompt is built
    from the problem statement.
verl row (SWE-Gym / R2E-Gym style rows of verl pipelines)
    ``{"data_source", "prompt": [messages], "reward_model": {"style": "rule", "ground_truth"},
    "extra_info": {...SWE-bench fields...}}``. The SWE-bench fields are read from
    ``extra_info`` (or from ``reward_model.ground_truth`` when it is an object or a JSON object
    string); the prompt messages are used unchanged.

Either shape may carry ``max_iterations`` (agent turns, default 30, capped at 100),
``eval_timeout_s`` (wall-clock limit of the hidden test run, default 300) and ``test_env``
(environment variables of the hidden test run, e.g. ``{"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}``
for repositories that need no pytest plugins: the shipped instances set it, because the dev
image's Python carries every plugin of the service's own test suite and loading them all costs
seconds per run).

The repository comes from a git bundle named after ``repo``: ``<owner>__<name>.bundle`` or
``<name>.bundle`` in a directory of ``PRORL_SWE_REPOS`` (``os.pathsep``-separated) or in the
shipped ``data/repos``. There is no network in a sandbox, so an instance whose repository has
no bundle is refused at the gateway.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlers.registry import option
from handlers.rows import parse_row, prompt_messages, read_max_iterations

DATA_DIR = Path(__file__).resolve().parent / "data"
SHIPPED_REPOS = DATA_DIR / "repos"
REPOS_ENV = "PRORL_SWE_REPOS"

DEFAULT_MAX_ITERATIONS = 30
MAX_ITERATIONS_CAP = 100
DEFAULT_EVAL_TIMEOUT_S = 300.0
MAX_EVAL_TIMEOUT_S = 3600.0

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_REPO = re.compile(r"^(?:([A-Za-z0-9][A-Za-z0-9_.-]*)/)?([A-Za-z0-9][A-Za-z0-9_.-]*)$")

SYSTEM_PROMPT = (
    "You are an expert software engineer. You work in a sandbox without network access, with a "
    "bash shell and a file editor. Fix the issue you are given by editing the repository's "
    "source code. Explore the code, reproduce the problem, make a minimal fix and check it "
    "(running the existing tests helps). Do not modify the existing tests: hidden tests will "
    "check your fix. When you are done, call the `finish` tool with a one-line summary."
)
USER_TEMPLATE = (
    "The repository {repo} is checked out at {repo_dir} (the shell starts there; editor paths "
    "are relative to /workspace, so its files are under {name}/).\n\n"
    "<issue>\n{problem_statement}\n</issue>\n\n"
    "Make the changes to the non-test files needed to resolve the issue."
)


@dataclass(frozen=True)
class SweInstance:
    """A SWE task in the one shape the handler works with."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    bundle: Path
    gold_patch: str | None = None
    #: the prompt of a verl row (used unchanged); None: the default prompt is built
    prompt: list[dict[str, Any]] | None = None
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    eval_timeout_s: float = DEFAULT_EVAL_TIMEOUT_S
    test_env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The repository's directory name under /workspace."""
        return self.repo.rsplit("/", 1)[-1]

    @property
    def repo_dir(self) -> str:
        return f"/workspace/{self.name}"

    def messages(self) -> list[dict[str, Any]]:
        if self.prompt is not None:
            return [dict(message) for message in self.prompt]
        user = USER_TEMPLATE.format(repo=self.repo, repo_dir=self.repo_dir, name=self.name,
                                    problem_statement=self.problem_statement.strip())
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def normalize_instance(instance: Any) -> SweInstance:
    """The instance as a ``SweInstance``; ValueError names the missing or wrong field."""
    return parse_row(instance, verl=lambda row: _from_fields(row, *_verl_fields(row), "extra_info."),
                     plain=lambda row: _from_fields(row, None, row, ""))


def _from_fields(instance: dict[str, Any], prompt: list[dict[str, Any]] | None, fields: dict[str, Any],
                 where: str) -> SweInstance:
    """A ``SweInstance`` of the SWE-bench ``fields`` (the row itself, or a verl row's
    ``extra_info``, named ``where``) and, for a verl row, its ``prompt``."""
    missing = [key for key in REQUIRED if fields.get(key) is None]
    if missing:
        raise ValueError(f"field '{where}{missing[0]}' is missing; a SWE instance needs "
                         f"{', '.join(REQUIRED)} (SWE-bench format)")
    instance_id = _string(fields, "instance_id", where)
    repo = _string(fields, "repo", where)
    if not _REPO.match(repo):
        raise ValueError(f"field '{where}repo' must look like 'owner/name', got {repo!r}")
    base_commit = _string(fields, "base_commit", where).lower()
    if not _COMMIT.match(base_commit):
        raise ValueError(f"field '{where}base_commit' must be a git commit id (hex), got {base_commit!r}")
    test_patch = fields["test_patch"]
    if not isinstance(test_patch, str):
        raise ValueError(f"field '{where}test_patch' must be a string (a unified diff)")
    gold = fields.get("patch")
    if gold is not None and not isinstance(gold, str):
        raise ValueError(f"field '{where}patch' must be a string (a unified diff)")
    fail_to_pass = _tests(fields, "FAIL_TO_PASS", where, allow_empty=False)
    pass_to_pass = _tests(fields, "PASS_TO_PASS", where, allow_empty=True)
    metadata = {key: fields[key] for key in ("version", "created_at", "environment_setup_commit")
                if isinstance(fields.get(key), (str, int, float))}
    if prompt is not None:
        metadata["data_source"] = str(instance.get("data_source", ""))
    return SweInstance(
        instance_id=instance_id, repo=repo, base_commit=base_commit,
        problem_statement=_string(fields, "problem_statement", where), test_patch=test_patch,
        fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, bundle=find_bundle(repo, where),
        gold_patch=gold, prompt=prompt,
        max_iterations=read_max_iterations(instance, DEFAULT_MAX_ITERATIONS, MAX_ITERATIONS_CAP),
        eval_timeout_s=_eval_timeout(instance), test_env=_test_env(fields, where), metadata=metadata)


def validate_instance(instance: Any) -> None:
    normalize_instance(instance)


def repo_dirs() -> list[Path]:
    """Where bundles are looked up: ``PRORL_SWE_REPOS`` first, then the shipped ones."""
    extra = [Path(p) for p in option("swe_repos").split(os.pathsep) if p.strip()]
    return [*extra, SHIPPED_REPOS]


def find_bundle(repo: str, where: str = "") -> Path:
    # normalize_instance checks the form first; a direct caller gets the same error, not an AttributeError
    if (match := _REPO.match(repo)) is None:
        raise ValueError(f"field '{where}repo' must look like 'owner/name', got {repo!r}")
    owner, name = match.groups()
    names = ([f"{owner}__{name}.bundle"] if owner else []) + [f"{name}.bundle"]
    for directory in repo_dirs():
        for candidate in names:
            if (directory / candidate).is_file():
                return (directory / candidate).resolve()
    raise ValueError(f"field '{where}repo': no git bundle for {repo!r} (looked for {' or '.join(names)} "
                     f"in {', '.join(str(d) for d in repo_dirs())}; add directories with {REPOS_ENV})")


def load_instances(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The rows of a JSONL file (default: the shipped ``instances.jsonl``)."""
    path = Path(path) if path is not None else DATA_DIR / "instances.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _verl_fields(row: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    messages = prompt_messages(row.get("prompt"))
    reward_model = row.get("reward_model", {})
    if not isinstance(reward_model, dict):
        raise ValueError("field 'reward_model' must be an object")
    style = reward_model.get("style", "rule")
    if style != "rule":
        raise ValueError(f"field 'reward_model.style' must be 'rule', got {style!r}")
    extra_info = row.get("extra_info")
    if extra_info is None:
        extra_info = {}
    if not isinstance(extra_info, dict):
        raise ValueError("field 'extra_info' must be an object holding the SWE-bench fields")
    ground_truth = reward_model.get("ground_truth")
    if isinstance(ground_truth, str) and ground_truth.lstrip().startswith("{"):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError:
            raise ValueError("field 'reward_model.ground_truth' is not valid JSON") from None
    fields = {**(ground_truth if isinstance(ground_truth, dict) else {}), **extra_info}
    return messages, fields


def _string(fields: dict[str, Any], key: str, where: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field '{where}{key}' must be a non-empty string")
    return value.strip() if key != "problem_statement" else value


def _tests(fields: dict[str, Any], key: str, where: str, allow_empty: bool) -> list[str]:
    value = fields.get(key, [] if allow_empty else None)
    if isinstance(value, str):  # SWE-bench stores the lists as JSON strings
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"field '{where}{key}' must be a list of pytest node ids or its JSON string") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise ValueError(f"field '{where}{key}' must be a list of pytest node ids (strings)")
    if not value and not allow_empty:
        raise ValueError(f"field '{where}{key}' must name at least one test")
    for test in value:
        file = test.split("::", 1)[0]
        if file.startswith("/") or ".." in file.split("/") or any(c in test for c in "\n\r\0"):
            raise ValueError(f"field '{where}{key}': {test!r} is not a test node id inside the repository")
    return list(value)


def _test_env(fields: dict[str, Any], where: str) -> dict[str, str]:
    value = fields.get("test_env") or {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"field '{where}test_env' must map environment variable names to strings")
    return dict(value)


def _eval_timeout(instance: dict[str, Any]) -> float:
    value = instance.get("eval_timeout_s")
    if value is None:
        return DEFAULT_EVAL_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_EVAL_TIMEOUT_S:
        raise ValueError(f"field 'eval_timeout_s' must be a number of seconds from 1 to {MAX_EVAL_TIMEOUT_S:g}")
    return float(value)
