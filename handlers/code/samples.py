"""The problems shipped with the package (``data/problems.jsonl``)."""
from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_problems(name: str = "problems") -> list[dict[str, Any]]:
    """Read ``data/<name>.jsonl``: one instance per non-blank line."""
    path = resources.files(__package__).joinpath("data", f"{name}.jsonl")
    if not path.is_file():
        raise ValueError(f"no problem set {name!r} in handlers/code/data")
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
