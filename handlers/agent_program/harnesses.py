"""The agent harnesses people already use, run unchanged in the sandbox: Claude Code, Codex and
OpenCode (DESIGN decision 19). Each is an installed agent of the ``agent`` task family, named
by the instance (``"agent": "claude-code"``, ``"codex"`` or ``"opencode"``).

They come from npm (``scripts/install_harnesses.sh``: pinned versions, each package's native
binary, into ``$PRORL_HARNESS_DIR``, default ``~/.cache/prorl-celery/harnesses``), and the
handler binds a harness's directory read-only into the sandbox at ``/opt/prorl/harnesses``. A
harness that is not installed is a missing requirement (``env_error``), never a reward.

The handler writes each one's configuration; at run time a launcher line maps the endpoint the
in-sandbox runner gives (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``: a loopback port of this job's
endpoint and its key) to the harness's own settings, so no key is left on disk:

* **Claude Code** (``claude -p``): Anthropic Messages at ``ANTHROPIC_BASE_URL``, the key as
  ``x-api-key``, every model alias (opus, sonnet, sub-agents) the instance's ``model``, the small
  fast one (haiku) ``<model>-small`` (its calls are ``auxiliary`` samples); telemetry, error
  reports, the auto-updater and all non-essential traffic off; ``--dangerously-skip-permissions``
  (``IS_SANDBOX=1``: our sandbox is the sandbox).
* **Codex** (``codex exec``): ``$CODEX_HOME/config.toml`` with a custom ``model_provider``
  speaking the Responses API (``wire_api = "responses"``) whose ``base_url`` is set on the
  command line, approvals never asked and Codex's own sandbox off (``danger-full-access``: its
  Landlock sandbox cannot nest in ours), web search, analytics, feedback and update checks off.
* **OpenCode** (``opencode run``): ``opencode.json`` with an OpenAI-compatible provider whose
  ``baseURL`` and ``apiKey`` are ``{env:...}`` references, ``small_model`` ``<model>-small``,
  every permission allowed, sharing and auto-update off, no models.dev fetch, no LSP download.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handlers.volatile import VolatileField
from singularity.requirements import Requirement, program

if TYPE_CHECKING:
    from handlers.agent_program.instances import AgentInstance

#: where the harnesses are bound inside the sandbox
MOUNT = "/opt/prorl/harnesses"
#: their configuration, beside the task (outside the repository, so never in its diff)
CONFIG_DIR = "/workspace/.prorl/harness"
#: the suffix of the model name a harness's small fast model is configured with
SMALL_SUFFIX = "-small"
_BASE = 'base="${OPENAI_BASE_URL%/}"; '  # the runner's endpoint, without a trailing slash


def harness_dir() -> Path:
    """Where ``scripts/install_harnesses.sh`` put the harnesses (``$PRORL_HARNESS_DIR``)."""
    configured = os.environ.get("PRORL_HARNESS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "prorl-celery" / "harnesses"


@dataclass(frozen=True)
class Harness:
    """One npm harness: its package, the pinned version the tests ran, and its executable."""

    name: str
    package: str
    version: str
    executable: str  # inside the install directory
    title: str
    needs_node: bool = False
    #: fields its own tools make different on every run (``handlers.volatile``): a resume's
    #: observation check looks past them (and only them)
    volatile: tuple[VolatileField, ...] = ()

    def host_dir(self) -> Path:
        return harness_dir() / self.name

    def inside(self) -> str:
        return f"{MOUNT}/{self.name}/{self.executable}"

    def requirements(self) -> tuple[Requirement, ...]:
        why = f"{self.title} ({self.package}@{self.version}): run scripts/install_harnesses.sh"
        needed = [program(str(self.host_dir() / self.executable), why=why, stages=("init", "run"))]
        if self.needs_node:
            needed.append(program("node", why=f"{self.title}'s launcher (Debian's nodejs)", stages=("run",)))
        return tuple(needed)

    def bind(self) -> tuple[str, str]:
        return (str(self.host_dir()), f"{MOUNT}/{self.name}")


#: Codex's exec_command/write_stdin output opens with a header (codex-rs unified exec's
#: ``response_text``: ``Chunk ID: {6 hex digits}``, ``Wall time: {secs:.4} seconds``, then the
#: exit code, ``Output:`` and the output): a random chunk id and the measured time, new on every
#: run, so no replayed observation could equal the journaled one. Only the values are replaced,
#: on their own header lines. Not declared: ``Process running with session ID N`` (a command
#: still running when Codex stopped waiting): the model's next ``write_stdin`` names that id, so
#: a replay past it could not go on alike anyway.
CODEX_VOLATILE = (
    VolatileField("codex_chunk_id", r"(?<=^Chunk ID: )[0-9a-f]{6}$"),
    VolatileField("codex_wall_time", r"(?<=^Wall time: )[0-9]+\.[0-9]{4}(?= seconds$)"),
)
#: Claude Code's and OpenCode's tools (Bash, Read, Edit, Write, Grep, Glob; bash, read, edit,
#: write, grep, glob) answer with the command's output or the file's text and nothing of their
#: own that changes between runs (no id, no timing): they declare nothing, so every character of
#: their observations is compared (measured: their resumes after a SIGKILL replay every turn,
#: ``tests/integration/test_harness_resume.py``)
CLAUDE_CODE = Harness("claude-code", "@anthropic-ai/claude-code", "2.1.332", "node_modules/.bin/claude", "Claude Code")
CODEX = Harness("codex", "@openai/codex", "0.171.0", "node_modules/.bin/codex", "Codex", needs_node=True,
                volatile=CODEX_VOLATILE)
OPENCODE = Harness("opencode", "opencode-ai", "1.18.33", "node_modules/.bin/opencode", "OpenCode")
HARNESSES = {h.name: h for h in (CLAUDE_CODE, CODEX, OPENCODE)}

#: environment every harness gets: no colour or pager in the log, a home of its own
COMMON_ENV = {"NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat", "CI": "1"}


def small_model(instance: AgentInstance) -> str:
    return instance.model + SMALL_SUFFIX


def _launch(line: str) -> list[str]:
    return ["/bin/sh", "-c", line]


def claude_code(instance: AgentInstance) -> tuple[list[str], dict[str, str], dict[str, str]]:
    model, small = instance.model, small_model(instance)
    env = {**COMMON_ENV, "CLAUDE_CONFIG_DIR": f"{CONFIG_DIR}/claude", "IS_SANDBOX": "1",
           "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
           "CLAUDE_CODE_SUBAGENT_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": small,
           "ANTHROPIC_SMALL_FAST_MODEL": small, "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1", "DISABLE_COST_WARNINGS": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
           "API_TIMEOUT_MS": "3600000", "CLAUDE_CODE_MAX_RETRIES": "1"}
    settings = {"permissions": {"defaultMode": "bypassPermissions"}, "includeCoAuthoredBy": False}
    files = {f"{CONFIG_DIR}/claude/settings.json": json.dumps(settings, indent=2)}
    line = (_BASE + 'export ANTHROPIC_BASE_URL="${base%/v1}" ANTHROPIC_API_KEY="$OPENAI_API_KEY"; '
            f"exec {shlex.quote(CLAUDE_CODE.inside())} -p {shlex.quote(instance.task)} "
            f"--dangerously-skip-permissions --model {shlex.quote(model)}")
    return _launch(line), env, files


def codex(instance: AgentInstance) -> tuple[list[str], dict[str, str], dict[str, str]]:
    config = "\n".join([
        f"model = {json.dumps(instance.model)}",
        'model_provider = "prorl"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
        "",
        "[model_providers.prorl]",
        'name = "the job\'s endpoint"',
        'base_url = "http://127.0.0.1/v1"  # set on the command line: the runner picks the port',
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
    ])
    env = {**COMMON_ENV, "CODEX_HOME": f"{CONFIG_DIR}/codex"}
    line = (_BASE + f"exec {shlex.quote(CODEX.inside())} exec --skip-git-repo-check "
            '-c "model_providers.prorl.base_url=\\"$base\\"" '
            f"{shlex.quote(instance.task)}")
    return _launch(line), env, {f"{CONFIG_DIR}/codex/config.toml": config}


def opencode(instance: AgentInstance) -> tuple[list[str], dict[str, str], dict[str, str]]:
    model, small = instance.model, small_model(instance)
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"prorl/{model}", "small_model": f"prorl/{small}",
        "autoupdate": False, "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "provider": {"prorl": {
            "npm": "@ai-sdk/openai-compatible", "name": "the job's endpoint",
            "options": {"baseURL": "{env:OPENAI_BASE_URL}", "apiKey": "{env:OPENAI_API_KEY}"},
            "models": {model: {"name": model}, small: {"name": small}}}},
    }
    env = {**COMMON_ENV, "OPENCODE_CONFIG": f"{CONFIG_DIR}/opencode/opencode.json",
           "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
           "OPENCODE_DISABLE_SHARE": "1", "XDG_DATA_HOME": "/tmp/opencode/data",
           "XDG_CACHE_HOME": "/tmp/opencode/cache", "XDG_STATE_HOME": "/tmp/opencode/state"}
    line = f"exec {shlex.quote(OPENCODE.inside())} run {shlex.quote(instance.task)}"
    return _launch(line), env, {f"{CONFIG_DIR}/opencode/opencode.json": json.dumps(config, indent=2)}


#: name -> (argv, environment, files to write) for the instance
CONFIGURE = {"claude-code": claude_code, "codex": codex, "opencode": opencode}
