"""Turn a math instance, in any accepted shape, into messages + ground truth.

Accepted shapes:

plain pair (MATH, GSM8K-style JSONL)
    ``{"problem": str, "answer": str}``; ``question`` / ``query`` may name the problem and
    ``final_answer`` / ``ground_truth`` / ``target`` the answer. Without an answer, a
    ``solution`` containing a ``\\boxed{}`` final answer (Hendrycks MATH) is accepted. A default
    system + user prompt asking for step-by-step reasoning and a boxed answer is built.
verl row (DeepScaleR, DAPO, ProRL Agent Server clients)
    ``{"data_source": str, "prompt": [{"role", "content"}, ...],
    "reward_model": {"style": "rule", "ground_truth": str}, "extra_info": {...}}``.
    The prompt messages are used unchanged: the dataset owns its prompt format.

Either shape may carry ``max_iterations`` (model turns allowed, default 1, capped).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handlers.math.grading import extract_boxed
from handlers.rows import parse_row, read_max_iterations, verl_row

SYSTEM_PROMPT = (
    "You are a careful mathematician. Reason step by step, then state the final answer "
    "in simplest form inside \\boxed{}."
)
USER_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."

DEFAULT_MAX_ITERATIONS = 1
MAX_ITERATIONS_CAP = 8

PROBLEM_KEYS = ("problem", "question", "query")
ANSWER_KEYS = ("answer", "final_answer", "ground_truth", "target")

SHAPE_HINT = (
    "instance needs either 'problem' and 'answer' or 'prompt' and 'reward_model.ground_truth'"
)


@dataclass(frozen=True)
class MathInstance:
    """A math instance in the one shape the handler works with."""

    messages: list[dict[str, Any]]
    ground_truth: str
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    metadata: dict[str, Any] = field(default_factory=dict)


def normalize_instance(instance: Any) -> MathInstance:
    """Return the instance as messages + ground truth; ValueError names what is wrong."""
    return parse_row(instance, verl=_from_verl_row, plain=_from_plain_pair)


def validate_instance(instance: Any) -> None:
    """Raise ValueError with a message naming the missing or wrong field."""
    normalize_instance(instance)


def default_messages(problem: str) -> list[dict[str, str]]:
    """The system + user prompt built for a plain problem."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{problem.strip()}\n\n{USER_SUFFIX}"},
    ]


def _max_iterations(instance: dict[str, Any]) -> int:
    return read_max_iterations(instance, DEFAULT_MAX_ITERATIONS, MAX_ITERATIONS_CAP)


def _from_plain_pair(instance: dict[str, Any]) -> MathInstance:
    max_iterations = _max_iterations(instance)
    problem = _first_present(instance, PROBLEM_KEYS)
    # a string 'prompt' is the problem text in some datasets (the verl shape uses a list)
    if problem is None and isinstance(instance.get("prompt"), str):
        problem = "prompt"
    if problem is None:
        raise ValueError(SHAPE_HINT)
    text = _non_empty_string(instance, problem)
    answer_key = _first_present(instance, ANSWER_KEYS)
    if answer_key is not None:
        ground_truth = _answer_string(instance[answer_key], answer_key)
    elif isinstance(instance.get("solution"), str):
        ground_truth = extract_boxed(instance["solution"]) or ""
        if not ground_truth:
            raise ValueError(
                "field 'solution' has no \\boxed{} final answer and there is no 'answer'"
            )
    else:
        raise ValueError(SHAPE_HINT)
    metadata = {"format": "plain", **_passthrough(instance, ("id", "level", "type", "subject"))}
    return MathInstance(default_messages(text), ground_truth, max_iterations, metadata)


def _from_verl_row(instance: dict[str, Any]) -> MathInstance:
    max_iterations = _max_iterations(instance)
    row = verl_row(instance, SHAPE_HINT)
    ground_truth = _answer_string(row.ground_truth, "reward_model.ground_truth")
    return MathInstance(row.messages, ground_truth, max_iterations, row.metadata)


def _first_present(instance: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((key for key in keys if instance.get(key) is not None), None)


def _non_empty_string(instance: dict[str, Any], key: str) -> str:
    value = instance[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field '{key}' must be a non-empty string")
    return value


def _answer_string(value: Any, key: str) -> str:
    # numbers are common in GSM8K-style data; bools are not answers
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"field '{key}' must be a non-empty string or a number")
    return value.strip()


def _passthrough(instance: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: instance[key] for key in keys if isinstance(instance.get(key), (str, int, float))}
