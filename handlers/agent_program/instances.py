"""An ``agent`` instance: which program to run, on what task, and how to score it.

    {"data_source": "agent", "instance_id": "...",
     "agent": "mini-swe-agent"            # an installed agent by name (KNOWN_AGENTS: mini-swe-agent,
                                          #   claude-code, codex, opencode), or
     "command": "python3 agent.py",       # a shell command (or an argv list), run in ``cwd``
     "task": "text of the task",          # also in /workspace/.prorl/task.md and $PRORL_TASK_FILE
     "files": {"agent.py": "..."},        # placed under /workspace before RUN
     "swe": "prorl-swe__romanum-14",      # optional: a shipped swe instance id, or a SWE-bench row;
                                          #   its repository is checked out and the program runs there
     "evaluator": {"type": "swe"}         # swe (default with "swe"), math, command or none
     "model": "policy", "env": {...}, "cwd": "/workspace/...", "max_iterations": 30}

Evaluators: ``{"type": "swe"}`` grades the repository's diff with the swe handler's hidden tests;
``{"type": "math", "answer_file": "answer.txt", "ground_truth": "42"}`` grades the file's text
(a ``\\boxed{}`` in it, or the whole text) with the math grader; ``{"type": "command",
"command": "pytest -q", "timeout_s": 120}`` runs a command in the sandbox after the program:
exit code 0 is reward 1.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handlers.agent_program.harnesses import CONFIGURE, HARNESSES, Harness
from handlers.swe.instances import SweInstance, load_instances
from handlers.swe.instances import normalize_instance as normalize_swe
from handlers.volatile import VolatileField

DEFAULT_MAX_ITERATIONS = 30
MAX_ITERATIONS_CAP = 500
TASK_DIR = "/workspace/.prorl"
TASK_FILE = f"{TASK_DIR}/task.md"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EVALUATORS = ("swe", "math", "command", "none")


def _mini_swe_agent(instance: AgentInstance) -> tuple[list[str], dict[str, str]]:
    """mini-swe-agent (PyPI ``mini-swe-agent``) through litellm on the job's endpoint.

    ``options.mode``: ``textbased`` (default: one ```mswea_bash_command``` block per reply) or
    ``toolcall`` (its v2 default: a ``bash`` function tool)."""
    mode = instance.options.get("mode", "textbased")
    if mode not in ("textbased", "toolcall"):
        raise ValueError("field 'agent.mode' of mini-swe-agent must be 'textbased' or 'toolcall'")
    config, model_class = (("mini_textbased.yaml", "litellm_textbased") if mode == "textbased"
                           else ("mini.yaml", "litellm"))
    argv = ["python3", "-m", "minisweagent.run.mini", "-c", config, "-c",
            f"agent.step_limit={instance.max_iterations}", "--model-class", model_class,
            "-m", f"openai/{instance.model}", "-t", instance.task, "--yolo", "--exit-immediately",
            "-l", "0", "-o", f"{TASK_DIR}/mini-swe-agent.traj.json", "--environment-class", "local"]
    env = {"MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1", "MSWEA_COST_TRACKING": "ignore_errors",
           "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PAGER": "cat", "TERM": "dumb", "NO_COLOR": "1"}
    return argv, env


def _harness(name: str) -> Callable[[AgentInstance], tuple[list[str], dict[str, str]]]:
    def configure(instance: AgentInstance) -> tuple[list[str], dict[str, str]]:
        argv, env, _ = CONFIGURE[name](instance)
        return argv, env
    return configure


#: installed agents a job may name; each maps the instance to (argv, environment): mini-swe-agent
#: (PyPI) and the npm harnesses (``harnesses``: Claude Code, Codex, OpenCode)
KNOWN_AGENTS: dict[str, Callable[[AgentInstance], tuple[list[str], dict[str, str]]]] = {
    "mini-swe-agent": _mini_swe_agent, **{name: _harness(name) for name in HARNESSES}}


@dataclass(frozen=True)
class AgentInstance:
    instance_id: str
    task: str
    agent: str | None = None  # a KNOWN_AGENTS name
    options: dict[str, Any] = field(default_factory=dict)
    command: str | list[str] | None = None
    files: dict[str, str] = field(default_factory=dict)
    swe: SweInstance | None = None
    swe_row: dict[str, Any] | None = None
    evaluator: dict[str, Any] = field(default_factory=dict)
    model: str = "policy"
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/workspace"
    max_iterations: int = DEFAULT_MAX_ITERATIONS

    def program(self) -> tuple[list[str], dict[str, str]]:
        """The argv and extra environment of the program."""
        env = {"PRORL_TASK_FILE": TASK_FILE, **self.env}
        if self.agent is not None:
            argv, agent_env = KNOWN_AGENTS[self.agent](self)
            return argv, {**agent_env, **env}
        if isinstance(self.command, list):
            return list(self.command), env
        return ["/bin/sh", "-c", str(self.command)], env

    @property
    def harness(self) -> Harness | None:
        """The npm harness the instance names (Claude Code, Codex, OpenCode), if any."""
        return HARNESSES.get(self.agent or "")

    @property
    def volatile_fields(self) -> tuple[VolatileField, ...]:
        """What the program's own tools make different on every run: its harness's declaration
        (none for mini-swe-agent or a command of the job's own: every character is compared)."""
        return self.harness.volatile if self.harness is not None else ()

    def harness_files(self) -> dict[str, str]:
        """The harness's configuration files (absolute paths in the sandbox) and their text."""
        return CONFIGURE[self.agent](self)[2] if self.harness is not None and self.agent else {}

    @property
    def evaluator_type(self) -> str:
        return self.evaluator.get("type", "swe" if self.swe else "none")


def _swe(value: Any) -> tuple[SweInstance, dict[str, Any]]:
    if isinstance(value, str):
        rows = {row["instance_id"]: row for row in load_instances()}
        if value not in rows:
            raise ValueError(f"field 'swe': no shipped swe instance {value!r} (give the SWE-bench row instead)")
        value = rows[value]
    if not isinstance(value, dict):
        raise ValueError("field 'swe' must be a shipped swe instance id or a SWE-bench row")
    try:
        return normalize_swe(value), value
    except ValueError as error:
        raise ValueError(f"field 'swe': {error}") from None


def _relative(path: Any, where: str) -> str:
    if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"field '{where}': {path!r} must be a relative path inside /workspace")
    return path


def normalize_instance(instance: Any) -> AgentInstance:
    if not isinstance(instance, dict):
        raise ValueError("the instance must be an object")
    swe, swe_row = _swe(instance["swe"]) if instance.get("swe") is not None else (None, None)
    agent, options = instance.get("agent"), {}
    if isinstance(agent, dict):
        options = {k: v for k, v in agent.items() if k != "name"}
        agent = agent.get("name")
    command = instance.get("command")
    if (agent is None) == (command is None):
        raise ValueError("give exactly one of 'agent' (an installed agent: "
                         f"{', '.join(sorted(KNOWN_AGENTS))}) and 'command'")
    if agent is not None and agent not in KNOWN_AGENTS:
        raise ValueError(f"field 'agent': unknown agent {agent!r}; known: {', '.join(sorted(KNOWN_AGENTS))}")
    if command is not None and not (isinstance(command, str) and command.strip() or
                                    isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
        raise ValueError("field 'command' must be a shell command string or a non-empty argv list")
    task = instance.get("task") or instance.get("problem_statement") or (swe.problem_statement if swe else None)
    if not isinstance(task, str) or not task.strip():
        raise ValueError("field 'task' must be a non-empty string (or give 'swe')")
    files = instance.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ValueError("field 'files' must map relative paths to file contents (strings)")
    files = {_relative(path, f"files.{path}"): text for path, text in files.items()}
    evaluator = instance.get("evaluator") or {}
    if isinstance(evaluator, str):
        evaluator = {"type": evaluator}
    if not isinstance(evaluator, dict) or evaluator.get("type", "swe" if swe else "none") not in EVALUATORS:
        raise ValueError(f"field 'evaluator.type' must be one of {', '.join(EVALUATORS)}")
    kind = evaluator.get("type", "swe" if swe else "none")
    if kind == "swe" and swe is None:
        raise ValueError("evaluator 'swe' needs the field 'swe'")
    if kind == "math":
        _relative(evaluator.get("answer_file"), "evaluator.answer_file")
        if not isinstance(evaluator.get("ground_truth"), (str, int, float)):
            raise ValueError("evaluator 'math' needs 'ground_truth'")
    if kind == "command" and not (isinstance(evaluator.get("command"), str) and evaluator["command"].strip()):
        raise ValueError("evaluator 'command' needs 'command' (a shell command)")
    env = instance.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_NAME.match(k) and isinstance(v, str)
                                            for k, v in env.items()):
        raise ValueError("field 'env' must map environment variable names to strings")
    max_iterations = instance.get("max_iterations", DEFAULT_MAX_ITERATIONS)
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int) or max_iterations < 1:
        raise ValueError("field 'max_iterations' must be a positive integer")
    cwd = instance.get("cwd") or (swe.repo_dir if swe else "/workspace")
    if not isinstance(cwd, str) or not os.path.normpath(cwd).startswith("/workspace"):
        raise ValueError("field 'cwd' must be a directory under /workspace")
    model = instance.get("model") or "policy"
    if not isinstance(model, str) or not re.match(r"^[A-Za-z0-9_.:/-]{1,128}$", model):
        raise ValueError("field 'model' must be a model name (letters, digits, _ . : / -)")
    result = AgentInstance(
        instance_id=str(instance.get("instance_id") or (swe.instance_id if swe else "agent")), task=task,
        agent=agent, options=options, command=command, files=files, swe=swe, swe_row=swe_row,
        evaluator=dict(evaluator), model=model, env=dict(env), cwd=cwd,
        max_iterations=min(max_iterations, MAX_ITERATIONS_CAP))
    result.program()  # the agent's own option checks
    return result
