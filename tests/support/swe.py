"""The shipped swe instances and the scripted agent turns that fix (or miss) them."""
from __future__ import annotations

import json

from handlers.swe import load_instances

ROWS = {row["instance_id"]: row for row in load_instances()}
ROMANUM = ROWS["prorl-swe__romanum-14"]
SEMVER = ROWS["prorl-swe__semverlite-31"]


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


RULES = [
    {"match": "to_roman\\(\\) writes nine hundreds as DCD", "scope": "prompt", "replies": [
        "Let me look at the conversion table.\n" + call("editor", command="view", path="romanum/romanum/numerals.py",
                                                        view_range=[1, 25]),
        "The table has no entry for 900. Adding it.\n" + call(
            "editor", command="str_replace", path="romanum/romanum/numerals.py",
            old_str='    (1000, "M"),\n    (500, "D"),', new_str='    (1000, "M"),\n    (900, "CM"),\n    (500, "D"),'),
        call("bash", command="python -c 'from romanum import to_roman, from_roman; "
                             "print(to_roman(1994), from_roman(to_roman(1994)))'"),
        call("finish", answer="added the CM entry to the numeral table")]},
    {"match": "E2E-SEMVER-WRONG", "scope": "prompt", "replies": [
        # compares identifiers by length: numeric ones now order right, alphanumeric ones wrong
        call("editor", command="str_replace", path="semverlite/semverlite/version.py",
             old_str="        return -1 if x < y else 1\n", new_str="        return -1 if len(x) < len(y) else 1\n"),
        call("finish", answer="pre-release identifiers now compare by length")]},
]
