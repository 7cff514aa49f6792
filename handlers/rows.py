"""What every task family's instance parsing shares: telling a verl-style row (its ``prompt``
messages, ``reward_model`` and ``extra_info``) from the family's own plain row, reading the verl
row, and ``max_iterations``. Each raises ValueError naming the field, which the gateway turns
into a 400."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

ROLES = frozenset({"system", "user", "assistant", "tool"})
T = TypeVar("T")


def is_verl_row(instance: dict[str, Any]) -> bool:
    """A verl row has its ``prompt`` as a list of messages, or a ``reward_model``; a plain row
    may have a ``prompt`` string (the problem text of some data sets)."""
    return isinstance(instance.get("prompt"), list) or "reward_model" in instance


def parse_row(instance: Any, *, verl: Callable[[dict[str, Any]], T], plain: Callable[[dict[str, Any]], T]) -> T:
    """``instance`` parsed by ``verl`` when it is a verl row, else by ``plain``."""
    if not isinstance(instance, dict):
        raise ValueError(f"instance must be a JSON object, got {type(instance).__name__}")
    return verl(instance) if is_verl_row(instance) else plain(instance)


def prompt_messages(prompt: Any, hint: str = "") -> list[dict[str, Any]]:
    """A verl row's ``prompt``: a non-empty list of ``{"role", "content"}`` messages, copied.

    As ProRL Agent Server v1 takes it, the list may come JSON-encoded and a message without a
    ``role`` is the user's."""
    prompt = _decoded(prompt, "prompt")
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("field 'prompt' must be a non-empty list of messages" + (f"; {hint}" if hint else ""))
    return [_message(item, index) for index, item in enumerate(prompt)]


@dataclass(frozen=True)
class VerlRow:
    """The parts of a verl row every family reads; ``ground_truth`` is left for it to parse."""

    messages: list[dict[str, Any]]
    ground_truth: Any
    extra_info: dict[str, Any]
    metadata: dict[str, Any]  # format, data_source and extra_info, kept with the instance


def verl_row(instance: dict[str, Any], hint: str) -> VerlRow:
    """``prompt`` messages, a rule-style ``reward_model.ground_truth`` (not null) and an
    ``extra_info`` object (``{}`` when absent)."""
    messages = prompt_messages(instance.get("prompt"), hint)
    reward_model = _decoded(instance.get("reward_model"), "reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise ValueError(f"field 'reward_model.ground_truth' is missing; {hint}")
    style = reward_model.get("style", "rule")
    if style != "rule":
        raise ValueError(f"field 'reward_model.style' must be 'rule', got {style!r}")
    extra_info = instance.get("extra_info", {})
    if not isinstance(extra_info, dict):
        raise ValueError("field 'extra_info' must be an object")
    metadata = {"format": "verl", "data_source": str(instance.get("data_source", "")), "extra_info": extra_info}
    return VerlRow(messages, reward_model["ground_truth"], extra_info, metadata)


def read_max_iterations(instance: dict[str, Any], default: int, cap: int) -> int:
    """``instance["max_iterations"]`` (``default`` when absent), capped at ``cap``."""
    value = instance.get("max_iterations")
    if value is None:
        return default
    # bool is an int subclass; "true" turns is a client bug worth reporting
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"field 'max_iterations' must be a positive integer, got {value!r}")
    return min(value, cap)


def _decoded(value: Any, name: str) -> Any:
    """``value``, or what it encodes when it is a JSON array or object in a string."""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"field '{name}' is a string but not valid JSON ({error.msg})") from None
    return value


def _message(item: Any, index: int) -> dict[str, Any]:
    where = f"field 'prompt[{index}]'"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object with 'role' and 'content'")
    if "role" not in item:
        item = {"role": "user", **item}
    if item.get("role") not in ROLES:
        raise ValueError(f"{where}.role must be one of {sorted(ROLES)}, got {item.get('role')!r}")
    if not isinstance(item.get("content"), str):
        raise ValueError(f"{where}.content must be a string")
    return dict(item)  # a copy: the instance itself stays untouched
