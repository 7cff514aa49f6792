"""Sample instances shipped with the package (``data/<name>.jsonl``)."""
from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any


def sample_names() -> list[str]:
    """Names accepted by ``load_samples``."""
    names = (item.name for item in _data_dir().iterdir())
    return sorted(name.removesuffix(".jsonl") for name in names if name.endswith(".jsonl"))


def load_samples(name: str = "math") -> list[dict[str, Any]]:
    """Read ``data/<name>.jsonl``: one instance per non-blank line.

    ``"math"`` holds plain problem/answer pairs, ``"deepscaler_sample"`` verl-style rows.
    """
    if name not in sample_names():
        raise ValueError(f"no sample set {name!r}; available: {', '.join(sample_names())}")
    text = _data_dir().joinpath(f"{name}.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _data_dir() -> Traversable:
    return resources.files(__package__).joinpath("data")
