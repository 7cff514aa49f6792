"""The shipped swe instances and the scripted agent turns that fix (or miss) them."""
from __future__ import annotations

from handlers.swe import load_instances
from handlers.tool_calls import tool_call
from prorl_celery.dev.scripted_agents import ROMANUM_FIX

ROWS = {row["instance_id"]: row for row in load_instances()}
ROMANUM = ROWS["prorl-swe__romanum-14"]
SEMVER = ROWS["prorl-swe__semverlite-31"]

RULES = [
    {"match": "to_roman\\(\\) writes nine hundreds as DCD", "scope": "prompt", "replies": ROMANUM_FIX},
    {"match": "E2E-SEMVER-WRONG", "scope": "prompt", "replies": [
        # compares identifiers by length: numeric ones now order right, alphanumeric ones wrong
        tool_call("editor", command="str_replace", path="semverlite/semverlite/version.py",
                  old_str="        return -1 if x < y else 1\n",
                  new_str="        return -1 if len(x) < len(y) else 1\n"),
        tool_call("finish", answer="pre-release identifiers now compare by length")]},
]
