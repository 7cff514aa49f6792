"""docs/agents.md's table states the permissions each harness's written configuration grants
(issue 37: it said OpenCode's allowed every permission; the config allows two and denies one)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from handlers.agent_program.handler import AgentProgramHandler
from handlers.agent_program.harnesses import CONFIG_DIR
from handlers.base import JobContext

AGENTS = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def table_row(agent: str) -> str:
    [row] = [line for line in AGENTS.read_text().splitlines() if line.startswith(f"| `{agent}` |")]
    return row


def test_opencodes_documented_permissions_are_the_written_ones():
    context = JobContext("j1", "agent", {"data_source": "agent", "agent": "opencode", "swe": "prorl-swe__romanum-14",
                                         "model": "policy"})
    instance = AgentProgramHandler().instance_of(context)
    written = json.loads(instance.harness_files()[f"{CONFIG_DIR}/opencode/opencode.json"])["permission"]
    documented = re.search(r"`permission` `(\{[^`]*\})`", table_row("opencode"))
    assert documented, "the opencode row of docs/agents.md names no `permission` `{...}`"
    assert json.loads(documented.group(1)) == written
    assert "every permission" not in table_row("opencode")
