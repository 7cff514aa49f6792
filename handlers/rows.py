"""Field checks every task family's instance parsing shares: the chat messages of a verl-style
row's ``prompt``, and ``max_iterations``. Each raises ValueError naming the field, which the
gateway turns into a 400."""
from __future__ import annotations

from typing import Any

ROLES = frozenset({"system", "user", "assistant", "tool"})


def prompt_messages(prompt: Any, hint: str = "") -> list[dict[str, Any]]:
    """A verl row's ``prompt``: a non-empty list of ``{"role", "content"}`` messages, copied."""
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("field 'prompt' must be a non-empty list of messages" + (f"; {hint}" if hint else ""))
    return [_message(item, index) for index, item in enumerate(prompt)]


def read_max_iterations(instance: dict[str, Any], default: int, cap: int) -> int:
    """``instance["max_iterations"]`` (``default`` when absent), capped at ``cap``."""
    value = instance.get("max_iterations")
    if value is None:
        return default
    # bool is an int subclass; "true" turns is a client bug worth reporting
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"field 'max_iterations' must be a positive integer, got {value!r}")
    return min(value, cap)


def _message(item: Any, index: int) -> dict[str, Any]:
    where = f"field 'prompt[{index}]'"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object with 'role' and 'content'")
    if item.get("role") not in ROLES:
        raise ValueError(f"{where}.role must be one of {sorted(ROLES)}, got {item.get('role')!r}")
    if not isinstance(item.get("content"), str):
        raise ValueError(f"{where}.content must be a string")
    return dict(item)  # a copy: the instance itself stays untouched
