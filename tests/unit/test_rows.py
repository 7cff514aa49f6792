"""handlers.rows: the verl-row-or-plain dispatch every task family's instance parsing shares."""
from __future__ import annotations

from typing import Any

import pytest

from handlers.rows import is_verl_row, parse_row

PROMPT = [{"role": "user", "content": "q"}]


def _shape(instance: Any) -> str:
    return parse_row(instance, verl=lambda row: "verl", plain=lambda row: "plain")


@pytest.mark.parametrize(("instance", "shape"), [
    ({"prompt": PROMPT, "reward_model": {"ground_truth": "1"}}, "verl"),
    ({"prompt": PROMPT}, "verl"),
    ({"reward_model": {"ground_truth": "1"}}, "verl"),
    ({"prompt": "What is 1+1?", "answer": "2"}, "plain"),  # a prompt string is a plain row's text
    ({"problem": "p", "answer": "a"}, "plain"),
])
def test_a_row_is_told_by_its_prompt_list_or_reward_model(instance: dict[str, Any], shape: str) -> None:
    assert _shape(instance) == shape and is_verl_row(instance) == (shape == "verl")


@pytest.mark.parametrize("instance", [[PROMPT], "text", None, 3])
def test_an_instance_that_is_not_an_object_is_refused_by_its_type(instance: Any) -> None:
    with pytest.raises(ValueError, match=f"instance must be a JSON object, got {type(instance).__name__}"):
        _shape(instance)
